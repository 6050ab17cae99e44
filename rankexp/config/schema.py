"""Structured-config schema (Hydra ConfigStore), built from the knob table (:mod:`rankexp.knobs`),
the model families and the probe catalog.  Enum and type errors are OmegaConf's while Hydra
composes; ranges and cross-field rules are :mod:`rankexp.config.checks`'.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from ..knobs import CIFAR10_COUNTS, bad, default
from ..locations import DATA_CACHE
from ..models.families import FAMILIES
from ..models.spec import (
    ACTIVATIONS,
    BETA_SCALINGS,
    NORM_OPS,
    PLACEMENTS,
    PRESET_SLOTS,
    lm_shape,
)
from ..probes import DEFAULT_PROBES, PROBES


def _enum(name: str, values: tuple[str, ...]) -> Any:
    """An enum whose members' names are their values (importable by name: configs pickle)."""
    return Enum(name, [(v, v) for v in values], module=__name__)


Placement = _enum("Placement", PLACEMENTS)
NormOp = _enum("NormOp", (*NORM_OPS, "batchnorm"))  # batchnorm: over the batch; model=plain only
#: what one slot P, B or R of Eq. 17 computes: an op of Table 2, or ``none`` (identity)
NormSlot = _enum("NormSlot", ("none", *NORM_OPS, "batchnorm"))
Init = _enum("Init", ("gaussian", "orthogonal"))  # model=plain: i.i.d. Gaussian or orthogonal
Activation = _enum("Activation", ACTIVATIONS)
BetaScaling = _enum("BetaScaling", BETA_SCALINGS)
Dtype = _enum("Dtype", ("float32", "float64"))
Optimizer = _enum("Optimizer", ("adam", "sgd"))
Schedule = _enum("Schedule", ("constant", "step"))
Augment = _enum("Augment", ("none", "pad_crop_flip"))
#: ``size=``: which of an experiment's sizes runs (``conf/size/<experiment>/<size>.yaml``)
Size = _enum("Size", ("smoke", "cpu", "full"))


def _preset_slot(slot: str, placement: Any, op: Any) -> str:
    """Resolver ``rankexp_norm_slot``: what the placement preset puts in ``slot`` (its op or none)."""
    placement, op = (v.value if isinstance(v, Enum) else str(v) for v in (placement, op))
    return op if slot in PRESET_SLOTS.get(placement, ()) else "none"


def _preset(slot: str) -> str:
    return f"${{rankexp_norm_slot:{slot},${{.placement}},${{.op}}}}"


@dataclass
class NormConfig:
    """Normalization of the general block ``h_l = R(h_{l−1} + β B(f(P(h_{l−1}))))`` (Eq. 17).

    ``pre``, ``out``, ``post`` are P, B, R: each an op of Table 2 or ``none``.  By default they
    follow the ``placement`` preset (``norm=pre|post|output|peri|none``, Eq. 6/7), which puts
    ``op`` in its slots — so ``norm=post norm.op=layernorm`` works as before — and any slot can
    be set on its own: ``norm=pre norm.post=detached`` is Figure 4b's Pre-RMSNorm + detached R.
    """

    placement: Placement = Placement(default("norm.placement"))
    op: NormOp = NormOp(default("norm.op"))
    pre: NormSlot = _preset("pre")  # type: ignore[assignment]  # resolved by OmegaConf
    out: NormSlot = _preset("out")  # type: ignore[assignment]
    post: NormSlot = _preset("post")  # type: ignore[assignment]


#: the schema of each ``model=`` family (``conf/model/<name>.yaml`` extends
#: the root config ``rankexp_schema_model_<name>``)
MODEL_SCHEMAS: dict[str, type] = {name: f.schema for name, f in FAMILIES.items()}


def _option_field(default: Any) -> tuple[Any, Any]:
    """(type, dataclass field) of one probe option from its declared default: ints, floats and
    bools are typed (``n=abc`` is refused while composing), anything else (``None``, strings
    that may also be numbers, lists) is ``Any``."""
    kind = type(default) if isinstance(default, (bool, int, float)) else Any
    if isinstance(default, (list, dict)):
        return kind, field(default_factory=lambda d=default: copy.deepcopy(d))
    return kind, field(default=default)


def options_schema() -> type:
    """The schema of ``task.options``: one node per probe of :data:`rankexp.probes.PROBES`, its
    keys and defaults those the probe declares (``Probe.options``) — so every documented option
    overrides as typed (``task.options.representation.n=512``) and an unknown one is refused
    with the allowed keys."""

    def named(cls: type) -> type:  # importable by name, so configs pickle (submitit ships them)
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls
        return cls

    nodes = []
    for name, probe in PROBES.items():
        fields = [(k, *_option_field(v)) for k, v in probe.options.items()]
        node = named(dataclasses.make_dataclass(f"{name.title().replace('_', '')}Options", fields))
        nodes.append((name, node, field(default_factory=node)))
    return named(dataclasses.make_dataclass("ProbeOptions", nodes))


ProbeOptions = options_schema()


def given_options(options: Any) -> dict[str, dict[str, Any]]:
    """``task.options`` (the schema node, a dict, or its dataclass) as ``{probe: {key: value}}``
    without the values equal to the probe's declared default: what the user chose."""
    if dataclasses.is_dataclass(options):
        options = dataclasses.asdict(options)
    out = {}
    for name, opts in dict(options or {}).items():
        defaults = PROBES[name].options if name in PROBES else {}
        chosen = {k: v for k, v in dict(opts or {}).items()
                  if k not in defaults or v != defaults[k]}
        if chosen:
            out[name] = chosen
    return out


@dataclass
class MeasureTask:
    """``task=measure``: initialization-rank probes (see :data:`rankexp.probes.PROBES`)."""

    name: str = "measure"
    probes: list[str] = field(default_factory=lambda: list(DEFAULT_PROBES))
    #: per-probe options, ``task.options.<probe>.<key>`` (:func:`options_schema`)
    options: ProbeOptions = field(default_factory=ProbeOptions)  # type: ignore[valid-type]
    #: memory budget for the seeds batched in one network (GB); null = 80 % of the device's free memory
    max_memory_gb: float | None = default("task.max_memory_gb")

@dataclass
class TrainTask:
    """``task=train``: CIFAR-10; all learning rates trained as one batched model.

    Length: ``steps`` optimizer steps, or ``epochs`` passes over the training set (⌊50000 /
    batch_size⌋ steps each; one report and evaluation per epoch, series at step = epoch) —
    exactly one is set.  Recipe (:mod:`rankexp.tasks.recipes`): ``optimizer``, ``schedule``
    (× ``gamma`` at each fraction ``milestones``, × ``warmup_factor`` for the first
    ``warmup_steps`` steps at ``depth ≥ warmup_min_depth``), ``augment`` (He et al.'s recipe:
    ``conf/experiment/degradation.yaml``).  ``probes`` run on the initial and the trained
    network, or at the steps of :func:`probe_schedule` on every learning rate
    (:mod:`rankexp.tasks.probing`).  ``dtype`` is the training precision; checkpoints live in
    ``checkpoint_dir/<config_hash>.pt``, so a rerun resumes.  A rate *diverged* when its loss
    is non-finite or exceeds ``divergence_factor`` × its initial loss.
    """

    name: str = "train"
    steps: int | None = default("task.steps")
    epochs: int | None = default("task.epochs")
    batch_size: int = default("task.batch_size")
    lrs: list[float] = field(default_factory=lambda: default("task.lrs"))
    eval_every: int = default("task.eval_every")
    log_every: int = default("task.log_every")
    checkpoint_every: int = default("task.checkpoint_every")
    stable_accuracy: float = default("task.stable_accuracy")
    dtype: Dtype = Dtype(default("task.dtype"))
    checkpoint_dir: str = default("task.checkpoint_dir")
    divergence_factor: float = default("task.divergence_factor")
    bf16: bool = default("task.bf16")
    compile: bool = default("task.compile")
    cuda_graphs: bool = default("task.cuda_graphs")
    optimizer: Optimizer = Optimizer(default("task.optimizer"))
    momentum: float = default("task.momentum")
    weight_decay: float = default("task.weight_decay")
    schedule: Schedule = Schedule(default("task.schedule"))
    milestones: list[float] = field(default_factory=lambda: default("task.milestones"))
    gamma: float = default("task.gamma")
    warmup_steps: int = default("task.warmup_steps")
    warmup_factor: float = default("task.warmup_factor")
    warmup_min_depth: int = default("task.warmup_min_depth")
    augment: Augment = Augment(default("task.augment"))
    pad: int = default("task.pad")
    clean_train_images: int = default("task.clean_train_images")
    probes: list[str] = field(default_factory=list)
    options: ProbeOptions = field(default_factory=ProbeOptions)  # type: ignore[valid-type]
    probe_every: int | None = default("task.probe_every")
    #: a list of steps or the string ``log`` (:func:`probe_schedule`)
    probe_steps: Any = default("task.probe_steps")

    def total_steps(self) -> int:
        """Optimizer steps of the run: ``steps``, or ``epochs`` × ⌊50000 / batch_size⌋."""
        return self.steps if self.steps is not None else self.epochs * (CIFAR10_COUNTS[0] // self.batch_size)

    def probe_schedule(self) -> list[int]:
        """The optimizer steps at which ``probes`` run (:func:`probe_schedule`)."""
        return probe_schedule(self.total_steps(), self.probe_every, self.probe_steps)


#: mantissas of ``task.probe_steps=log``: steps m·10^k (1, 2, 5, 10, 20, 50, …)
LOG_PROBE_MANTISSAS = (1, 2, 5)


def probe_schedule(steps: int, every: int | None, at: Any) -> list[int]:
    """The optimizer steps at which a training run's probes run, ascending (step 0 = the initial
    network, step s = after s updates).

    * ``every=N``: 0, N, 2N, … and ``steps`` (the trained network) — e.g. N = 50, steps = 300:
      0, 50, …, 300;
    * ``at="log"``: 0 and every m·10^k ≤ ``steps`` (m in :data:`LOG_PROBE_MANTISSAS`), and
      ``steps`` — steps = 300: 0, 1, 2, 5, 10, 20, 50, 100, 200, 300;
    * ``at=[s, …]``: those steps (sorted, duplicates dropped), each in 0 … ``steps``;
    * neither: ``[]`` (the probes run before and after training only, as before these knobs).

    Raises:
        ConfigError: both given, N not an integer ≥ 1, a list entry not an integer in
            0 … ``steps``, an empty list, or a string other than ``log``.
    """
    if every is not None and at is not None:
        raise bad("task.probe_every/task.probe_steps", (every, at),
                   "set one of them (probe_every=N: every N steps; probe_steps=[…] or log)")
    if every is not None:
        if isinstance(every, bool) or not (isinstance(every, int) and every >= 1):
            raise bad("task.probe_every", every, "must be an integer ≥ 1 (or null)")
        return sorted({*range(0, steps + 1, every), steps})
    if at is None:
        return []
    if isinstance(at, str):
        if at != "log":
            raise bad("task.probe_steps", at, "a list of steps [0,100,…], log, or null")
        decades = range(len(str(steps)))
        return sorted({0, steps} | {m * 10**k for k in decades for m in LOG_PROBE_MANTISSAS
                                    if m * 10**k <= steps})
    bad_steps = [v for v in at if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= steps]
    if not at or bad_steps:
        raise bad("task.probe_steps", list(at), f"must be a non-empty list of integer steps in "
                   f"0 … {steps} (task.steps), or log")
    return sorted(set(at))


@dataclass
class DataConfig:
    """Where CIFAR-10 lives: an image-folder tree / its tar.gz, or the torchvision original."""

    root: str = "${oc.env:RANKEXP_DATA,../shared/data}"
    source: str = "auto"
    cache_dir: str = DATA_CACHE  # relative: under the user's cache dir
    download: bool = False


@dataclass
class TrackingConfig:
    """MLflow: store URI, experiment name, resume behaviour, outage and liveness bounds (none of
    it enters the config hash).

    ``uri: null``: ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``.  ``http_*`` become MLflow's
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``_TIMEOUT`` / ``_BACKOFF_FACTOR``.  A run's owner
    refreshes the tag ``rankexp.heartbeat`` every ``heartbeat_s``; a RUNNING run whose owner
    cannot be checked otherwise is stale after ``stale_after_s``.  ``run_name``: a single
    run's name, or a sweep's parent run's; ``tags``: put on every run (not ``mlflow.*``,
    ``rankexp.*``); ``note``: the runs' description; ``description``: the experiment's.
    """

    uri: str | None = default("tracking.uri")
    experiment: str = default("tracking.experiment")
    enabled: bool = True
    resume: bool = True
    force: bool = default("tracking.force")
    log_arrays: bool = True
    http_retries: int = 2
    http_timeout_s: int = 10
    http_backoff: int = 1
    heartbeat_s: int = 30
    stale_after_s: int = 600
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    description: str | None = None


@dataclass
class RankexpConfig:
    """The whole composed config; top-level keys are the architectural knobs.

    Defaults are the study's: d=256, L=48, m/d=4, M=2, ReLU, Pre-RMSNorm, α=β=1 — each read
    from its row of the knob table (:data:`rankexp.knobs.KNOBS`), the one place it is written.
    """

    depth: int = default("depth")
    width: int = default("width")
    expansion: float = default("expansion")
    matrices: int = default("matrices")
    alpha: float = default("alpha")
    beta: float = default("beta")
    beta_scaling: BetaScaling = BetaScaling(default("beta_scaling"))
    activation: Activation = Activation(default("activation"))
    skip_every: int = default("skip_every")
    bias: float = default("bias")
    init: Init = Init(default("init"))
    seeds: int = default("seeds")
    seed: int = default("seed")
    device: str = default("device")
    threads: Any = default("threads")  # "auto" or a count
    dtype: Dtype = Dtype(default("dtype"))
    lr: float | None = default("lr")
    size: Size = Size.full
    model: Any = MISSING  # a model family's schema from the `model` group (MODEL_SCHEMAS)
    norm: NormConfig = field(default_factory=NormConfig)
    task: Any = MISSING  # a TaskConfig from the `task` group (measure or train)
    data: DataConfig = field(default_factory=DataConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def default_probes(family: str) -> list[str]:
    """Resolver ``rankexp_default_probes``: the ``task.probes`` of ``conf/task/measure.yaml`` for
    model family ``family`` (its declared default, else :data:`rankexp.probes.DEFAULT_PROBES`)."""
    fam = FAMILIES.get(str(family))
    return list(fam.default_probes if fam and fam.default_probes else DEFAULT_PROBES)


#: fields of the root whose node type depends on a config group choice
CHOSEN_NODES: dict[str, tuple[type, ...]] = {
    "model": tuple(MODEL_SCHEMAS.values()),
    "task": (MeasureTask, TrainTask),
}
#: a dict field: any key is allowed (e.g. ``tracking.tags``)
FREE = "free-form"


def children(types: tuple[type, ...], root: bool) -> dict[str, Any]:
    """Field name → node types (dataclass fields), :data:`FREE` (dict fields) or ``None``
    (leaves), over every schema in ``types``."""
    out: dict[str, Any] = {}
    for t in types:
        hints = typing.get_type_hints(t)
        for f in dataclasses.fields(t):
            hint = hints[f.name]
            if root and f.name in CHOSEN_NODES:
                out[f.name] = CHOSEN_NODES[f.name]
            elif dataclasses.is_dataclass(hint):
                out[f.name] = (hint,)
            elif typing.get_origin(hint) is dict:
                out[f.name] = FREE
            else:
                out.setdefault(f.name, None)
    return out


def choices_with(group: str, key: str) -> list[str]:
    """The choices of the config group ``group`` (``task``, ``model``) whose schema has the
    field ``key``: ``choices_with("task", "steps") == ["train"]``; [] for another group."""
    return sorted(f.default for t in CHOSEN_NODES.get(group, ()) if key in children((t,), False)
                  for f in dataclasses.fields(t) if f.name == "name")


def sweep_stamp() -> str:
    """A launch stamp ``HH-MM-SS-<pid>`` fixed for this process and every job it spawns (in
    ``$RANKEXP_STAMP``: Hydra resolves ``hydra.sweep.dir`` in the launcher and in workers)."""
    return os.environ.setdefault(
        "RANKEXP_STAMP", f"{datetime.datetime.now():%Y-%m-%d/%H-%M-%S}-{os.getpid()}"
    )


def slurm_signal_delay(timeout_min: float) -> int:
    """Seconds before a Slurm time limit at which submitit's warning signal (USR2) is sent:
    10 % of the limit, at least 15 s (time to write a checkpoint) and at most 120 s, and never
    more than half the limit (plugin default: 120 s whatever the limit, which for
    ``timeout_min=1`` signals at the start)."""
    limit = float(timeout_min) * 60
    return int(max(1, min(limit / 2, max(15.0, min(120.0, 0.1 * limit)))))


def hydra_subdir(mode: Any) -> str | None:
    """``hydra.output_subdir``: ``.hydra`` for a single run; none for the jobs of a sweep, whose
    resolved config is ``result/config.yaml`` and whose Hydra config is the sweep's
    ``multirun.yaml`` (three YAML dumps and files fewer per job)."""
    return None if str(mode).endswith("MULTIRUN") else ".hydra"


def register_configs() -> None:
    """Put the schema into Hydra's ConfigStore (``conf/config.yaml`` extends ``rankexp_schema``)
    and register the resolvers ``rankexp_stamp`` (output directories), ``rankexp_hydra_subdir``
    (conf/config.yaml), ``rankexp_signal_delay`` (conf/hydra/launcher/slurm.yaml) and ``rankexp_norm_slot``
    (conf/norm/*.yaml)."""
    resolvers = {"rankexp_stamp": sweep_stamp, "rankexp_signal_delay": slurm_signal_delay,
                 "rankexp_hydra_subdir": hydra_subdir, "rankexp_norm_slot": _preset_slot,
                 "rankexp_default_probes": default_probes, "rankexp_lm_shape": lm_shape}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    cs = ConfigStore.instance()
    cs.store(name="rankexp_schema", node=RankexpConfig)
    # the group schemas are root configs, in no group: neither `--help` nor a tab press lists
    # them among the choices (a group ``schema/`` was offered after `rankexp <TAB>`)
    cs.store(name="rankexp_schema_task_measure", node=MeasureTask)
    cs.store(name="rankexp_schema_task_train", node=TrainTask)
    cs.store(name="rankexp_schema_norm", node=NormConfig)
    for name, node in MODEL_SCHEMAS.items():
        cs.store(name=f"rankexp_schema_model_{name}", node=node)
