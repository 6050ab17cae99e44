"""The command line: ``python -m rankexp [overrides] [-m]`` and ``rankexp status|cancel|detach …``.

Exit status: 0 done; 1 a job failed (or a single run's result could not be logged: it is in the
job directory for ``python -m rankexp.sync``); 2 a config or store error, before any run exists;
128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM), the runs then KILLED.

A key typo is refused before Hydra runs (:func:`rankexp.config.check_override_keys`).  What
Hydra finds while composing (``norm=psot``, ``alpha=abc``) it raises under its documented
``HYDRA_FULL_ERROR=1``, and :func:`one_line` makes it one line: key, value, what is allowed, the
closest allowed name.  A user's own ``HYDRA_FULL_ERROR=1`` keeps Hydra's stack trace.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import os
import re
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from . import helptext, interrupt, sweepctl
from .config import (
    ConfigError,
    check_override_keys,
    choices_with,
    config_groups,
    quote_unicode,
    register_configs,
)
from .locations import CONF_DIR, private_files
from .tracking import TrackingError, TrackingLost, redact

log = logging.getLogger("rankexp")

register_configs()
if not OmegaConf.has_resolver("rankexp_help"):  # conf/hydra/help/rankexp.yaml
    OmegaConf.register_new_resolver("rankexp_help", helptext.section)

#: third-party progress bars and MLflow's telemetry thread off by their libraries' own switches
#: (a value the user set wins; workers the job starts inherit them)
QUIET = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
         "MLFLOW_DISABLE_TELEMETRY": "true"}
#: Hydra's flags that take a value (the word after them is not an override)
VALUED = {"-c", "--cfg", "-p", "--package", "-sc", "--shell-completion", "-cp", "--config-path",
          "-cn", "--config-name", "-cd", "--config-dir", "--experimental-rerun", "-i", "--info"}


class _State:
    composed = False  # Hydra composed a config: a failure is no longer a config error
    run_dir: Path | None = None  # a single run's directory, where this process made it …
    made: Path | None = None  # … and the topmost folder of it that did not exist before


def mark_composed() -> None:
    """Called once a config is composed (the task, or the sweeper before its jobs run)."""
    _State.composed = True


def _fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


class CheckFirst(Callback):
    """``hydra.callbacks.check_first``: a single run's config checked before Hydra makes its
    run directory (the result waits in :data:`rankexp.config.CHECKED_JOBS`); exit 2 if refused."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from .config import CHECKED_JOBS, check_options_used, check_task

        overrides = tuple(config.hydra.overrides.task)
        try:
            CHECKED_JOBS[overrides] = check_task(config, overrides=overrides)
            check_options_used([CHECKED_JOBS[overrides].settings])
        except ConfigError as e:
            _fail(str(e), 2)
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
        _State.run_dir, _State.made = (run_dir, missing[-1]) if missing else (None, None)


def _discard_run_dir() -> None:
    """Remove the single run's directory (and empty folders above) this process made, when the
    job is refused before its run exists: only Hydra's files are in it."""
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

    from .app import run

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


def _overrides(argv: Sequence[str]) -> list[str]:
    """The overrides of a command line: the words that are neither a flag nor a flag's value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in VALUED
        else:
            out.append(a)
    return out


def app_help(overrides: list[str]) -> None:
    """``rankexp --help``: conf/hydra/help/rankexp.yaml composed with the overrides (Hydra's own
    ``--help`` lists every config group, 4–5 s, for placeholders this template does not use)."""
    import string

    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides, return_hydra_config=True)
        print(string.Template(cfg.hydra.help.template).safe_substitute())


def uri_to_environment(argument: str) -> str:
    """``tracking.uri=`` a URI with a password → the URI in ``$MLFLOW_TRACKING_URI`` (every job
    inherits it) and the override ``tracking.uri=${oc.env:MLFLOW_TRACKING_URI}``: no file Hydra,
    submitit or rankexp writes holds the password.  Any other argument unchanged."""
    key, _, value = argument.partition("=")
    if key.lstrip("+") != "tracking.uri" or not value:
        return argument
    try:
        value = OverridesParser.create().parse_override(argument).value()
    except OverrideParseException:  # Hydra reports it
        return argument
    if not isinstance(value, str) or redact(value) == value:
        return argument
    os.environ["MLFLOW_TRACKING_URI"] = value
    return f"{key}=${{oc.env:MLFLOW_TRACKING_URI}}"


def cli() -> None:
    """Check the command line's keys against the schema, then let Hydra run."""
    sys.argv[1:] = argv = [uri_to_environment(a) for a in sys.argv[1:]]
    private_files()
    if argv[:1] in (["status"], ["cancel"], ["detach"]):  # a detached Slurm sweep
        raise SystemExit(sweepctl.main(argv))
    sys.argv[1:] = argv = [quote_unicode(a) for a in argv]  # unicode values work unquoted
    if not {"-sc", "--shell-completion"} & set(argv):  # completion's `install=bash` is no key
        try:
            check_override_keys(_overrides(argv), config_groups(CONF_DIR))
        except ConfigError as e:
            _fail(str(e), 2)
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises what it finds: reported below
    try:
        if {"--help", "-h"} & set(argv):
            app_help(_overrides(argv))
        else:
            main()
    except BrokenPipeError:  # `rankexp --help | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + signal.SIGPIPE) from None
    except Exception as e:
        if _State.composed:  # the job's own failure, after composing: its traceback
            traceback.print_exception(e)
            raise SystemExit(1) from None
        message = one_line(e)
        if full or message is None:
            traceback.print_exception(e)
            raise SystemExit(2) from None
        _fail(message, 2)
    finally:
        if not full:
            del os.environ["HYDRA_FULL_ERROR"]


# --------------------------------------------------------------------------- one-line errors
#: how a leaf node's type reads in a message
_TYPES = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false",
          "StringNode": "a string", "BytesNode": "bytes", "PathNode": "a path"}


def one_line(e: BaseException) -> str | None:
    """``invalid config: <key>=<value> — did you mean '<closest>'? allowed: …`` for a
    composition error Hydra raised (``MissingConfigException``, ``OverrideParseException``,
    ``ConfigCompositionException`` from OmegaConf); None when ``e`` is not one."""
    if isinstance(e, MissingConfigException):
        return _missing_choice(e)
    if isinstance(e, OverrideParseException):
        return _lines(f"invalid override {e.override!r}", str(e)) + \
            " (the override grammar: https://hydra.cc/docs/advanced/override_grammar/basic)"
    if isinstance(e, ConfigCompositionException):
        cause = e.__cause__
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            return _mistyped(cause) or _not_a_key(cause) or _lines("invalid config", str(e), str(cause))
        return _lines("invalid config", str(e), str(cause or ""))
    return None


def _lines(what: str, *messages: str) -> str:
    """Hydra's message in one line, without the search path, node details and advice."""
    skip = ("Config search path", "provider=", "full_key:", "object_type=", "reference_type=",
            "Set the environment variable", "See https://hydra.cc")
    lines = [ln.strip().rstrip(":") for m in messages for ln in m.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(skip)]
    return f"{what}: " + " — ".join(dict.fromkeys(lines))


def _missing_choice(e: Any) -> str:
    """``norm=psot``: Hydra names the missing ``group/choice`` and lists the group's options."""
    group, _, value = (e.missing_cfg_file or "").rpartition("/")
    if not group or e.options is None:
        return _lines("invalid config", str(e))
    parent = re.match(r"In '([^']+)':", str(e))
    asked = "" if parent is None or parent[1] in ("config", "hydra/config") else \
        f" (asked for by conf/{parent[1]}.yaml)"
    return _message(group, value, sorted(e.options)) + asked


def _mistyped(cause: Any) -> str | None:
    """``alpha=abc``: OmegaConf could not convert the value to the node's type."""
    key, value, node, parent = cause.full_key, cause.value, cause.child_node, cause.parent_node
    if node is None and isinstance(parent, ListConfig):  # task.lrs=[a]: an element
        element = getattr(parent._metadata.element_type, "__name__", "")
        what = {"int": "integers", "float": "numbers", "str": "strings", "bool": "true/false"}
        return (f"invalid config: {key}={value!r} — allowed in {key.rsplit('[', 1)[0]}: "
                f"{what.get(element, element or 'values')}")
    if node is None:
        return None
    optional = node._is_optional()
    if isinstance(node, ListConfig):
        return f"invalid config: {key}={value!r} — allowed: a list in brackets, {key}=[a,b]"
    ref = node._metadata.ref_type
    if isinstance(ref, type) and issubclass(ref, enum.Enum):
        return _message(key, value, [m.name for m in ref] + (["null"] if optional else []))
    kind = _TYPES.get(type(node).__name__)
    if kind is None:
        return None
    if value is None and not optional:
        return f"invalid config: {key}=null — allowed: {kind}, not null{_example(key, node)}"
    if kind == "true or false":
        return _message(key, value, ["true", "false"] + (["null"] if optional else []))
    return _message(key, value, ["null"] if optional else [],
                    f"{kind}{' or null' if optional else ''}{_example(key, node)}")


def _not_a_key(cause: Any) -> str | None:
    """``task.steps=5`` with task=measure: a key of the group's other choice."""
    kind = cause.object_type
    if not isinstance(cause, ConfigAttributeError | ConfigKeyError) or not dataclasses.is_dataclass(kind):
        return None
    key, field = cause.full_key, cause.key
    group = key.rsplit(".", 1)[0]
    chosen = {f.name: f.default for f in dataclasses.fields(kind)}.get("name")
    others = choices_with(group, field)
    if not isinstance(chosen, str) or not others:
        return None
    return (f"invalid config: {key} — {group}={chosen} has no key '{field}', "
            f"{' and '.join(f'{group}={o}' for o in others)} has: add {group}={others[0]}")


def _example(key: str, node: Any) -> str:
    """``, e.g. alpha=1.0``: the value as composed (the default, or the experiment's)."""
    v = node._value()
    if v is None or (isinstance(v, str) and "${" in v):  # unset, or an interpolation
        return ""
    return f", e.g. {key}={str(v).lower() if isinstance(v, bool) else v}"


def _message(key: str, value: Any, names: Sequence[str], kind: str = "") -> str:
    """``invalid config: key='value' — did you mean 'x'? allowed: a, b, c``."""
    close = difflib.get_close_matches(str(value), list(names), n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"invalid config: {key}={value!r} — {hint}allowed: {kind or ', '.join(names)}"
