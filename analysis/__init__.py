"""Figures, tables and claims of the study from runs logged in MLflow: one module per experiment
(``analysis/<part>/<id>.py``) over :mod:`analysis.core`; ``python -m analysis <command>``
draws, ``python -m analysis report`` checks every claim, ``python -m analysis.figures`` is
``make figures``."""
