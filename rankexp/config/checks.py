"""Checks before a run: everything that can be known about a job before its MLflow run exists.

Keys (:func:`check_override_keys` on the command line, :func:`check_keys` on the composed
config), values (:func:`validate`, which runs the schema's ``__post_init__`` rules), input paths,
the device, the memory of one seed and whether each override is used (:func:`check_job`); the
sweeper checks each job once (:data:`CHECKED_JOBS`, :func:`checked_job`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, flag_override, open_dict

from ..errors import ConfigError
from ..models.families import family_of
from ..models.families.gpt2 import check_pretrained  # noqa: F401  (re-exported)
from ..models.spec import (
    ShapeError,
)
from .hashing import config_hash, resolved_container
from .schema import (
    MODEL_SCHEMAS,
    MeasureTask,
    RankexpConfig,
    TrainTask,
    slurm_signal_delay,
)


def validate(cfg: DictConfig) -> RankexpConfig:
    """Resolve ``cfg`` and check every value; returns typed objects.

    Raises:
        ConfigError: a value outside the allowed range (names key, value, rule).
    """
    try:
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as e:  # OmegaConf wraps errors raised in __post_init__
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        while cause is not None:  # the rankexp_lm_shape resolver (model=gpt2), wrapped twice
            if isinstance(cause, ShapeError):
                raise ConfigError(f"invalid config: {cause}") from None
            cause = cause.__cause__ or cause.__context__
        raise
    if not isinstance(obj, RankexpConfig):
        raise ConfigError("the composed config does not extend rankexp_schema")
    return obj


# --------------------------------------------------------------------------- checks before a run
#: fields of the root whose node type depends on a config group choice
_CHOSEN_NODES: dict[str, tuple[type, ...]] = {
    "model": tuple(MODEL_SCHEMAS.values()),
    "task": (MeasureTask, TrainTask),
}
_FREE = "free-form"  # a dict field: any key is allowed (e.g. task.options)


def choices_with(group: str, key: str) -> list[str]:
    """The choices of the config group ``group`` (``task``, ``model``) whose schema has the
    field ``key``: ``choices_with("task", "steps") == ["train"]``; [] for another group."""
    return sorted(f.default for t in _CHOSEN_NODES.get(group, ()) if key in _children((t,), False)
                  for f in dataclasses.fields(t) if f.name == "name")


def _children(types: tuple[type, ...], root: bool) -> dict[str, Any]:
    """Field name → node types (dataclass fields), ``_FREE`` (dict fields) or ``None`` (leaves),
    over every schema in ``types``."""
    out: dict[str, Any] = {}
    for t in types:
        hints = typing.get_type_hints(t)
        for f in dataclasses.fields(t):
            hint = hints[f.name]
            if root and f.name in _CHOSEN_NODES:
                out[f.name] = _CHOSEN_NODES[f.name]
            elif dataclasses.is_dataclass(hint):
                out[f.name] = (hint,)
            elif typing.get_origin(hint) is dict:
                out[f.name] = _FREE
            else:
                out.setdefault(f.name, None)
    return out


def _unknown(key: str, where: str, allowed: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], allowed, n=1, cutoff=0.6)
    hint = f"did you mean '{where}{close[0]}'? " if close else ""
    return ConfigError(
        f"invalid config: unknown key '{where}{key.rsplit('.', 1)[-1]}' — {hint}"
        f"keys{' under ' + where.rstrip('.') if where else ''}: {', '.join(sorted(allowed))}"
    )


def check_override_keys(overrides: Sequence[str], groups: Sequence[str]) -> None:
    """Refuse a command-line key that no config of the schema has (``deph=4``, ``+deph=4``,
    ``task.stepz=5``), before Hydra composes anything, with a did-you-mean suggestion.

    Hydra's own message for ``deph=4`` advises ``+deph=4``, which would run the defaults with a
    stray key; this check knows the schema.  Group choices (``norm=post``), ``hydra.*`` and
    keys under dict fields (``task.options``) pass; values are checked after composition.

    Raises:
        ConfigError: the first unknown key, naming the allowed ones.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        for o in overrides:
            if not o.isascii():
                key, _, value = o.partition("=")
                raise ConfigError(f"invalid override {o!r}: Hydra reads non-ASCII characters only "
                                  f"inside quotes — write {key}='{value}' (in a shell: "
                                  f"\"{key}='{value}'\")") from None
        return  # a syntax error: Hydra reports it with its own parser's message
    seen: dict[str, str] = {}
    for o in parsed:
        key = (o.package + ":" if o.package else "") + o.key_or_group
        if key in seen:
            raise ConfigError(f"invalid config: '{o.key_or_group}' is given twice ({seen[key]!r}, "
                              f"{o.input_line!r}) — give it once (a sweep: "
                              f"{o.key_or_group}=a,b)")
        seen[key] = o.input_line
    for o in parsed:
        key = o.key_or_group
        if o.is_hydra_override() or o.package is not None or "/" in key:
            continue
        parts = key.split(".")
        if len(parts) == 1 and parts[0] in groups:
            continue
        node: Any = (RankexpConfig,)
        for depth, part in enumerate(parts):
            if node is _FREE:
                break
            if node is None:  # below a leaf
                raise ConfigError(f"invalid config: '{'.'.join(parts[:depth])}' is a value, "
                                  f"it has no key '{part}' (override {o.input_line!r})")
            kids = _children(node, root=depth == 0)
            if part not in kids and not (depth == 0 and part in groups):
                raise _unknown(part, "".join(p + "." for p in parts[:depth]), list(kids))
            node = kids.get(part, _FREE)


_PLAIN_VALUE = re.compile(r"[^\s'\"\[\](){},=:\\]+")


def quote_unicode(argument: str) -> str:
    """A command-line override whose value has non-ASCII characters, quoted so Hydra reads it
    (``tracking.experiment=résumé`` → ``tracking.experiment='résumé'``; each item of a plain
    sweep list too); anything else unchanged.  Hydra's lexer takes unicode only in quotes."""
    if argument.startswith("-") or argument.isascii() or "=" not in argument:
        return argument
    key, _, value = argument.partition("=")
    items = value.split(",")
    if not key.isascii() or not all(_PLAIN_VALUE.fullmatch(v) for v in items):
        return argument  # quoted already, or a structure: Hydra (or our hint) handles it
    return f"{key}=" + ",".join(v if v.isascii() else f"'{v}'" for v in items)


def check_keys(cfg: DictConfig) -> None:
    """Refuse keys the schema does not have anywhere in the composed ``cfg`` (``+deph=4``
    composes fine, but nothing would read ``deph``).  Dict fields (``task.options``) are
    free-form; the ``hydra`` node is Hydra's.

    Raises:
        ConfigError: the first unknown key, with a did-you-mean suggestion.
    """

    def walk(node: DictConfig, where: str) -> None:
        t = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(t):
            return
        names = [f.name for f in dataclasses.fields(t)]
        for key in node.keys():
            if where == "" and key == "hydra":
                continue
            if key not in names:
                raise _unknown(str(key), where, names)
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, f"{where}{key}.")

    walk(cfg, "")


def resolve_device(name: str):
    """``auto`` → CUDA when present, else CPU; otherwise the named device (``torch.device``).

    Raises:
        ConfigError: a CUDA device on a machine without one (before any run exists).
    """
    import torch

    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_device(name: str) -> None:
    """A named CUDA device must exist here (checked without torch where no NVIDIA driver is;
    ``auto`` and ``cpu`` always run).

    Raises:
        ConfigError: a CUDA device on a machine without one (before any run exists).
    """
    if not name.startswith("cuda"):
        return
    from ..memory import cuda_possible

    index = int(name[5:]) if name.startswith("cuda:") else 0
    present = False
    if cuda_possible():
        import torch

        present = torch.cuda.is_available() and index < torch.cuda.device_count()
    if not present:
        raise ConfigError(f"invalid config: device={name!r} — this machine has no such CUDA device "
                          "(use device=auto or device=cpu)")


def check_paths(s: RankexpConfig) -> None:
    """Inputs a task reads must exist before its run does: the model family's own
    (``model.pretrained`` of ``model=gpt2``), ``data.root`` for ``task=train`` (unless
    ``data.download=true`` may fetch it).

    Raises:
        ConfigError: the path, where it was looked for, and what belongs there.
    """
    from ..locations import resolve_path

    family = family_of(s)
    if family.check_paths is not None:
        family.check_paths(s)
    if not isinstance(s.task, TrainTask) or (s.data.download and s.data.source in ("auto", "torchvision")):
        return
    root = resolve_path(s.data.root)
    if not root.exists():
        raise ConfigError(
            f"invalid config: data.root={s.data.root!r} — no such file or directory ({root}); "
            "point it at CIFAR-10: the folder holding cifar10-jpeg.tar.gz (default ../shared/data, "
            "or set $RANKEXP_DATA), an image-folder tree, or torchvision's cifar-10-batches-py "
            "(data.download=true fetches that where there is internet)"
        )


#: command-line keys each task does not read, and why (refused: a value that changes nothing)
_UNUSED_BY_TASK = {
    "measure": {"lr": "task=measure does not train (lr is task=train's learning rate)"},
}


#: tracking options a job with the store off still uses: its run.json records the experiment
#: and whether arrays are logged, for ``python -m rankexp.sync --uri`` to log it later
_OFF_STORE_KEYS = ("", "enabled", "experiment", "log_arrays")


def check_used_overrides(overrides: Sequence[str], s: RankexpConfig) -> None:
    """Refuse a command-line override that the job would not use: ``lr=`` with
    ``task=measure``, and the ``tracking.*`` options of a store (``uri``, ``resume``, ``force``,
    ``http_*``, …) when the store is off (``tracking=off``) — each would be accepted, logged or
    ignored, and change nothing (``tracking.experiment`` and ``log_arrays`` stay: a later
    ``rankexp.sync --uri`` reads them).

    Raises:
        ConfigError: the override and why it is not used.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return
    unused = dict(_UNUSED_BY_TASK.get(s.task.name, {}))
    for o in parsed:
        key = o.key_or_group.lstrip("+~")
        if o.is_hydra_override() or "." not in key and key in ("task", "tracking", "model"):
            continue
        top, _, sub = key.partition(".")
        if top in unused:
            raise ConfigError(f"invalid config: {o.input_line} — not used: {unused[top]}")
        if top == "tracking" and sub not in _OFF_STORE_KEYS and not s.tracking.enabled:
            raise ConfigError(f"invalid config: {o.input_line} — not used: the store is off "
                              "(tracking=off / tracking.enabled=false); drop it, or log to a "
                              "store (tracking=default, tracking=server)")


def check_job(cfg: DictConfig, *, device: bool = True,
              overrides: Sequence[str] | None = None) -> RankexpConfig:
    """Everything that can be known about one job before its run exists: schema keys, values,
    input paths, (``device``: jobs that run on this machine) the device and whether one seed
    of a measurement fits its memory (:func:`rankexp.memory.check_fits`), and that each
    command-line override is used (:func:`check_used_overrides`).

    Raises:
        ConfigError: one message naming key, value or path and what is allowed.
    """
    check_keys(cfg)
    s = validate(cfg)
    check_paths(s)
    if overrides:
        check_used_overrides(overrides, s)
    if device:
        from ..memory import check_fits

        check_device(s.device)
        check_fits(s)
    return s


@dataclass(frozen=True)
class CheckedJob:
    """A job checked before it runs: its typed config, its resolved config (plain Python, no
    ``hydra`` node) and its config hash (:func:`config_hash`)."""

    settings: RankexpConfig
    container: dict[str, Any]
    config_hash: str


#: jobs of this process's sweep that the sweeper checked (its loader composed and checked each
#: once: hydra_plugins/rankexp_plugins/loader.py), by the job's override list; a job of the basic
#: launcher takes its entry instead of checking again (:func:`checked_job`)
CHECKED_JOBS: dict[tuple[str, ...], CheckedJob] = {}


@contextlib.contextmanager
def task_part(cfg: DictConfig):
    """``cfg`` without its ``hydra`` node for the duration (what a job's task sees), restored
    afterwards as the same node — no copy of the config."""
    if "hydra" not in cfg:
        yield cfg
        return
    node = cfg._get_node("hydra")
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        yield cfg
    finally:
        node._set_parent(None)  # a detached node is re-attached as it is, not deep-copied
        with flag_override(cfg, ["struct", "no_deepcopy_set_nodes"], [False, True]):
            cfg["hydra"] = node


def check_task(cfg: DictConfig, *, device: bool = True,
               overrides: Sequence[str] | None = None) -> CheckedJob:
    """:func:`check_job` on a composed job (its ``hydra`` node may be there), with its resolved
    config and hash.

    Raises:
        ConfigError: as :func:`check_job`.
    """
    with task_part(cfg) as task:
        s = check_job(task, device=device, overrides=overrides)
        container = resolved_container(task)
    return CheckedJob(s, container, config_hash(container))


def checked_job(cfg: DictConfig, overrides: Sequence[str] | None = None) -> CheckedJob:
    """The sweeper's check of this job when it ran in this process (``overrides``: the job's
    ``hydra.overrides.task``), else the job's own check — each job is checked once.

    Raises:
        ConfigError: as :func:`check_job`.
    """
    done = CHECKED_JOBS.pop(tuple(overrides), None) if overrides is not None else None
    return done if done is not None else check_task(cfg, overrides=overrides)


def check_slurm_limits(launcher: DictConfig) -> None:
    """A Slurm launcher's warning signal must come before its time limit.

    Raises:
        ConfigError: ``signal_delay_s`` ≥ the limit (the job would be warned at its start).
    """
    if "timeout_min" not in launcher or "signal_delay_s" not in launcher:
        return
    limit, delay = float(launcher.timeout_min) * 60, float(launcher.signal_delay_s)
    if delay >= limit:
        raise ConfigError(
            f"invalid config: hydra.launcher.signal_delay_s={delay:g} — not below the time limit "
            f"(timeout_min={launcher.timeout_min:g} → {limit:g} s), so Slurm would signal the job "
            f"at its start; leave it unset (derived: {slurm_signal_delay(launcher.timeout_min)} s) "
            "or make it smaller"
        )


def config_groups(conf_dir: str | Path) -> list[str]:
    """The config groups of the tree at ``conf_dir`` (its sub-folders), e.g. ``norm``, ``task``."""
    return sorted(p.name for p in Path(conf_dir).iterdir() if p.is_dir() and p.name != "hydra")
