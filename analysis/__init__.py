"""Figures and tables of the study, drawn from runs logged in MLflow.

``python -m analysis <command> --experiment NAME …``; every command reads runs
through :func:`analysis.runs.load_runs` and draws in the house style of
:mod:`analysis.style`.  ``python -m analysis report`` checks the study's claims
(:mod:`analysis.claims`) against a store and writes an HTML + Markdown report.
"""
