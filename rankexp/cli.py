"""The command line: ``python -m rankexp [overrides] [-m]`` (design.md §1).

Exit status: 0 done; 1 a job failed (or, for a single run, its result could not be logged: it
is in the job directory for ``python -m rankexp.sync``); 2 a config or store error, before any
run exists; 128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM), the runs then KILLED.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import traceback
from pathlib import Path

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .config import ConfigError, check_override_keys, config_groups, quote_unicode, register_configs
from .errors import one_line

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger("rankexp")

register_configs()


#: third-party progress bars kept out of a job's console, by their libraries' own switches
#: (MLflow's artifact transfers, Hugging Face's downloads and checkpoint loading); rankexp's
#: bars and log lines say how far a job is.  A value the user set wins; workers the job starts
#: (joblib, Slurm) inherit them.
QUIET = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
         # MLflow 3's usage telemetry: a thread in every process, posting to a server a cluster
         # node cannot reach (set it to false to allow it)
         "MLFLOW_DISABLE_TELEMETRY": "true"}


class _State:
    composed = False  # Hydra composed a config: its exit status 1 is no longer a config error
    run_dir: Path | None = None  # a single run's directory, where this process made it …
    made: Path | None = None  # … and the topmost folder of it that did not exist before


def mark_composed() -> None:
    """Called once a config is composed (the task, or the sweeper before its jobs run)."""
    _State.composed = True


def _fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


class CheckFirst(Callback):
    """A single run's config is checked before Hydra makes its run directory
    (``conf/config.yaml``: ``hydra.callbacks.check_first``).  Hydra's ``run_job`` creates
    ``outputs/<date>/<time>`` with its ``.hydra/`` and ``rankexp.log`` before the task starts,
    so a value refused by the task's check (``width=-3``, ``task.probes=[nope]``) left that
    directory behind.  Here :func:`rankexp.config.check_task` runs in ``on_run_start`` —
    after composing, before ``run_job`` — and its result waits for the job in
    :data:`rankexp.config.CHECKED_JOBS` (checked once).  A sweep's jobs are checked by the
    sweeper before any directory exists; a worker's single job (joblib, Slurm) starts no run
    of Hydra's and is not seen here.

    Raises:
        SystemExit: 2 with the one-line message when the check refuses the config.
    """

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from .config import CHECKED_JOBS, check_task

        overrides = tuple(config.hydra.overrides.task)
        try:
            CHECKED_JOBS[overrides] = check_task(config, overrides=overrides)
        except ConfigError as e:
            _fail(str(e), 2)
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
        _State.run_dir, _State.made = (run_dir, missing[-1]) if missing else (None, None)


def _discard_run_dir() -> None:
    """Remove the single run's directory this process made (and the empty folders above it
    that it made: ``outputs/<date>``), when the job is refused before its run exists (a store
    that cannot be used): only what Hydra wrote can be in it then."""
    run_dir, made = _State.run_dir, _State.made
    _State.run_dir = _State.made = None
    if run_dir is None or not run_dir.is_dir() \
            or not {p.name for p in run_dir.iterdir()} <= {".hydra", "rankexp.log"}:
        return
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in run_dir.parents:
        if folder == made.parent:
            break
        try:
            folder.rmdir()  # only if empty: another run's directory keeps it
        except OSError:
            break


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> dict:
    """The Hydra task: one job (:func:`rankexp.app.run`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from . import interrupt
    from .app import run
    from .tracking import TrackingError, TrackingLost

    mark_composed()
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return run(cfg)  # failures are the sweeper's to count and report
    try:
        return run(cfg)
    except TrackingLost as e:
        _fail(str(e), 1)
    except (ConfigError, TrackingError) as e:
        _discard_run_dir()
        _fail(str(e), 2)
    except interrupt.JobInterrupted as e:
        _fail(f"interrupted by {e.signal_name}; the run is closed (rerun the same command to "
              "resume)", 128 + signal.Signals[e.signal_name].value)


def _sets_mode(overrides: list[str]) -> bool:
    """Whether a command line sets ``hydra.mode`` (``hydra.mode=MULTIRUN``, ``+hydra.mode=…``)."""
    return any(o.split("=", 1)[0].lstrip("+~") == "hydra.mode" for o in overrides)


def compose_once() -> None:
    """Compose a job's config once, not twice: before it runs, Hydra composes the whole config
    only to read ``hydra.mode`` (``Hydra.get_mode``), then composes it again to run it.  No file
    of ``conf/`` sets ``hydra.mode`` (tests/test_compose_once.py checks every experiment), so
    when the command line does not set it either the answer is known without composing: None,
    and ``-m`` decides, as Hydra decides then."""
    from hydra._internal.hydra import Hydra

    if getattr(Hydra.get_mode, "_rankexp", False):
        return
    composing = Hydra.get_mode

    def get_mode(self, config_name, overrides):
        return composing(self, config_name, overrides) if _sets_mode(list(overrides)) else None

    get_mode._rankexp = True  # type: ignore[attr-defined]
    Hydra.get_mode = get_mode


def _full_error() -> bool:
    """``HYDRA_FULL_ERROR=1``: Hydra's own report with the stack trace, as Hydra documents."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def _reported(e: Exception) -> None:
    """Exit 2 with the one-line message for a composition error Hydra raised
    (:func:`rankexp.errors.one_line`; with ``HYDRA_FULL_ERROR=1`` its stack trace instead);
    return for anything else (Hydra reports it)."""
    message = one_line(e)
    if message is None:
        return
    if _full_error():
        traceback.print_exception(e)
        raise SystemExit(2)
    _fail(message, 2)


def one_error_style() -> None:
    """Report composition errors in rankexp's one line, not Hydra's several
    (:mod:`rankexp.errors`): Hydra's ``run_and_report`` — which runs the composition of a run,
    a sweep's master config, ``--cfg`` and shell completion, and prints what they raise — gets
    the one-line message first.  ``--help`` composes outside it: :func:`cli` catches that."""
    from hydra._internal import utils

    if getattr(utils.run_and_report, "_rankexp", False):
        return
    report = utils.run_and_report

    def run_and_report(func):
        def composing():
            try:
                return func()
            except Exception as e:
                _reported(e)
                raise

        return report(composing)

    run_and_report._rankexp = True  # type: ignore[attr-defined]
    utils.run_and_report = run_and_report


def cli() -> None:
    """Check the command line's keys against the schema, then let Hydra run (composing once)."""
    from hydra._internal.utils import get_args_parser

    from . import startup

    if sys.argv[1:2] in (["status"], ["cancel"], ["detach"]):  # a detached Slurm sweep: rankexp.sweepctl
        from .sweepctl import main as sweepctl

        raise SystemExit(sweepctl(sys.argv[1:]))
    sys.argv[1:] = [quote_unicode(a) for a in sys.argv[1:]]  # unicode values work unquoted
    args, _ = get_args_parser().parse_known_args(sys.argv[1:])
    try:
        if not args.shell_completion:  # `-sc install=bash` / `query=bash` are Hydra's, not keys
            check_override_keys(args.overrides, config_groups(CONF_DIR))
    except ConfigError as e:
        _fail(str(e), 2)
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    compose_once()
    one_error_style()
    startup.begin()  # until the job computes or the sweep launches (rankexp.startup)
    try:
        main()
    except SystemExit as e:
        if e.code == 1 and not _State.composed:
            raise SystemExit(2) from None  # Hydra could not compose the config (its message is out)
        raise
    except Exception as e:  # `--help` / `--hydra-help` compose outside Hydra's reporting
        _reported(e)
        raise
    finally:
        # the interpreter's last garbage collection walks every object MLflow, SQLAlchemy,
        # Hydra (and torch) made — seconds under load, for nothing at exit (a detached Slurm
        # submit spent 4.6 of its seconds there); frozen, they are left to the OS
        gc.freeze()
        startup.end()  # an in-process caller gets its collector back
