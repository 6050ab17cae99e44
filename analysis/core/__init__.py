"""The analysis core, shared by every document part (``analysis/<part>/``):

* :mod:`~analysis.core.runner` — ``python -m analysis <command>``: the command table (found in
  the parts' modules, imported on first use), shared options, in-process runs;
* :mod:`~analysis.core.runs` — MLflow runs → one pandas table, series read in bulk and cached;
* :mod:`~analysis.core.select` — loading, selecting and checking runs; the one selection error;
* :mod:`~analysis.core.seeds` — seed spread pooled from each run's own seeds;
* :mod:`~analysis.core.style` — the house figure style, captions, saving;
* :mod:`~analysis.core.tables` — Markdown tables;
* :mod:`~analysis.core.claims` — claims, their checks and verdicts;
* :mod:`~analysis.core.registry` — the experiment registry (one entry per experiment id);
* :mod:`~analysis.core.report` — the reproduction report.

Nothing here imports a document part at import time (the runner and the registry find them
when asked), so there is no import circle.
"""
