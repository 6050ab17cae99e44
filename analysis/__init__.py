"""Figures, tables and claims of the study, drawn and checked from runs logged in MLflow.

One module per experiment, ``analysis/<part>/<id>.py`` (its figure commands, its claims, its
registry entry), over :mod:`analysis.core`.  ``python -m analysis <command> --experiment NAME``
draws; ``python -m analysis report`` checks every claim against a store;
``python -m analysis.figures`` is ``make figures`` / ``make reproduce``.
"""
