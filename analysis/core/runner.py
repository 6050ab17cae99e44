"""``python -m analysis <command> --experiment NAME [options]``: the command runner.

Each command is a :class:`Command` in the ``COMMANDS`` of a part's module (found by
:func:`analysis.core.registry.modules` when first needed).  A
:class:`~analysis.core.select.SelectionError` or a :class:`~rankexp.tracking.TrackingError`
is one line, exit 2; :func:`run` runs a command in this process and collects its output."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rankexp.locations import private_files
from rankexp.tracking import TrackingError

from .registry import modules

log = logging.getLogger("analysis")


@dataclass(frozen=True)
class Command:
    """One ``python -m analysis`` command: entry point (returns the files written), help, the
    default of ``--experiment``, whether it takes ``--where``, a function adding its options."""

    main: Callable[[argparse.Namespace], list[Path]]
    help: str = ""
    experiment: str | None = "rankexp"
    where: bool = False
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


@functools.cache
def commands() -> dict[str, Command]:
    """Every command, name → :class:`Command`, from every part module's ``COMMANDS`` (and the
    report's); ValueError when two modules declare one name."""
    table: dict[str, Command] = {}
    where: dict[str, str] = {}
    for module in modules():
        for name, command in getattr(module, "COMMANDS", {}).items():
            if name in table:
                raise ValueError(f"command {name!r} is declared by {where[name]} and {module.__name__}")
            table[name], where[name] = command, module.__name__
    return table


def set_experiment_default(p: argparse.ArgumentParser, default: list[str] | str | None,
                           help_: str | None = None) -> None:
    """Replace the shared ``--experiment`` option's default (and its help) for one command."""
    names = [default] if isinstance(default, str) else default
    for action in p._actions:
        if action.dest == "experiment":
            action.default = names
            action.help = help_ or f"MLflow experiment(s) (default: {' '.join(names or [])})"


def out_dir(args: argparse.Namespace) -> Path:
    """``--out/<experiment(s)>``: where a command writes its files."""
    return Path(args.out) / "_".join(args.experiment)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis",
                                description="Figures and tables of the study from logged runs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in commands().items():
        # one naming style on the command line (mf-phase, init-gradients); the declared
        # names with underscores (mf_phase, post_ops) stay as aliases
        canonical = name.replace("_", "-")
        sp = sub.add_parser(canonical, aliases=[name] if canonical != name else [],
                            help=command.help, description=command.help)
        sp.add_argument("--experiment", "-e", nargs="+")
        set_experiment_default(sp, command.experiment)
        sp.add_argument("--uri", default=None,
                        help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)")
        sp.add_argument("--filter", default="", help="MLflow search filter, e.g. \"params.width = '256'\"")
        sp.add_argument("--out", default="figures", help="output folder (default: figures/<experiment>/)")
        if command.where:
            sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                            help="keep runs with param KEY = VALUE (numeric compare where the "
                            "column is numeric); repeatable, e.g. --where expansion=4 --where "
                            "norm.placement=post")
        if command.arguments:
            command.arguments(sp)
        sp.set_defaults(run=command.main)
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; 0 done, 2 the runs or the store lack what the command needs."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # third-party INFO lines (matplotlib's mathtext logs every glyph it borrows from a fallback)
    for name in ("matplotlib", "PIL", "urllib3", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except (TrackingError, KeyError) as e:  # SelectionError is a KeyError
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    """The ``rankexp-analysis`` console script (``pyproject.toml``) and ``python -m analysis``:
    :func:`main`'s status; caches and figures its user's alone."""
    private_files()
    sys.exit(main())


def run(argv: list[str], out: Path, uri: str) -> tuple[int, str, list[Path]]:
    """Run one command in this process on store ``uri`` into ``out``: ``(status, output, files)``;
    an exception is its traceback and status 1, so one bug does not stop a batch."""
    buf = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [logging.StreamHandler(buf)]  # the command's log goes to its caller
    t0 = time.time()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                rc = main([*argv, "--uri", uri, "--out", str(out)])
            except SystemExit as e:  # argparse errors, commands that exit
                rc = e.code if isinstance(e.code, int) else 1
                if not isinstance(e.code, int) and e.code:
                    print(e.code)
            except Exception:  # noqa: BLE001 — a bug in one command must not stop the others
                traceback.print_exc()
                rc = 1
    finally:
        root.handlers = saved
    # the figure/table files under out/<experiment>/ written since t0
    skip = {"multirun", "mlartifacts", "logs", "report"}
    dirs = [d for d in out.iterdir() if d.is_dir() and d.name not in skip] if out.is_dir() else []
    files = sorted(p for d in dirs for p in d.rglob("*") if p.is_file() and p.stat().st_mtime >= t0)
    return rc, buf.getvalue(), files


def run_logged(argv: list[str], out: Path, uri: str, log_file: Path) -> tuple[int, str, list[Path]]:
    """:func:`run`, its output appended to ``log_file`` after the command line."""
    out.mkdir(parents=True, exist_ok=True)
    rc, text, files = run(argv, out, uri)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a") as fh:
        fh.write(f"\n$ python -m analysis {' '.join(argv)}\n{text}")
    return rc, text, files
