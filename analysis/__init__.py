"""Figures and tables of the study, drawn from runs logged in MLflow.

``python -m analysis <command> --experiment NAME …``; every command reads runs
through :func:`analysis.runs.load_runs`.
"""
