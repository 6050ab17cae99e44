"""``python -m rankexp [overrides] [-m]``: the console script ``rankexp`` (:mod:`rankexp.cli`);
absolute imports, so that ``python rankexp/__main__.py`` works too."""

from rankexp.cli import cli

if __name__ == "__main__":
    cli()
