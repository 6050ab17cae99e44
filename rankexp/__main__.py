"""``python -m rankexp [overrides] [-m]`` — the one entrypoint (design.md §1; :mod:`rankexp.cli`).

The console script ``rankexp`` is the same (pyproject ``[project.scripts]``).  Imports are
absolute so that ``python rankexp/__main__.py`` (the form Hydra's ``--hydra-help`` prints) works.
"""

if __name__ == "__main__":  # the process's entry: its imports without the cyclic GC
    from rankexp import startup

    startup.begin()

from rankexp.cli import CONF_DIR, cli  # noqa: E402

__all__ = ["CONF_DIR", "cli"]

if __name__ == "__main__":
    cli()
