"""``python -m analysis <command> --experiment NAME [options]`` — figures from logged runs
(:mod:`analysis.core.runner`)."""

import sys

from analysis.core.runner import main

if __name__ == "__main__":
    sys.exit(main())
