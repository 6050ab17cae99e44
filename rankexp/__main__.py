"""``python -m rankexp [overrides] [-m]`` — the one entrypoint (design.md §1; :mod:`rankexp.cli`)."""

from .cli import CONF_DIR, cli

__all__ = ["CONF_DIR", "cli"]

if __name__ == "__main__":
    cli()
