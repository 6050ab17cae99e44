"""``python -m rankexp [overrides] [-m]`` — the one entrypoint (design.md §1; :mod:`rankexp.cli`).

The console script ``rankexp`` is the same (pyproject ``[project.scripts]``).  Imports are
absolute so that ``python rankexp/__main__.py`` (the form Hydra's ``--hydra-help`` prints) works.
"""

from rankexp.cli import CONF_DIR, cli

__all__ = ["CONF_DIR", "cli"]

if __name__ == "__main__":
    cli()
