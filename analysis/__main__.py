"""``python -m analysis <command> --experiment NAME [options]`` — figures from logged runs
(:mod:`analysis.core.runner`)."""

from analysis.core.runner import cli

if __name__ == "__main__":
    cli()
