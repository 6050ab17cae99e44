"""Figures, tables and claims of the study, drawn and checked from runs logged in MLflow.

``python -m analysis <command> --experiment NAME …`` (:mod:`analysis.core.runner`); every
command reads runs through :mod:`analysis.core.select` and draws in the house style of
:mod:`analysis.core.style`.  One folder per document part — :mod:`analysis.study` (science.md
§3), :mod:`analysis.rest` (§4), :mod:`analysis.meanfield` (§5), :mod:`analysis.degradation`,
:mod:`analysis.lm` (Figure 12) — holds its figures, their claims and its experiments' registry
entries (:mod:`analysis.core.registry`).  ``python -m analysis report`` checks every claim
against a store; ``python -m analysis.figures`` is ``make figures`` / ``make reproduce``.
"""
