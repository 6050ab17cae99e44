"""``python -m rankexp [overrides] [-m]``: the same as the console script ``rankexp``
(:mod:`rankexp.cli`).  Imports are absolute so that ``python rankexp/__main__.py`` works."""

from rankexp.cli import CONF_DIR, cli

__all__ = ["CONF_DIR", "cli"]

if __name__ == "__main__":
    cli()
