"""Structured-config schema (Hydra ConfigStore) and validation.

The YAML tree under ``conf/`` is the user's surface; these dataclasses give it
types and allowed values.  Enum fields are checked by OmegaConf while Hydra
composes (``activation=foo`` fails there, listing the allowed values); ranges
and cross-field rules are checked in ``__post_init__``, which runs when
:func:`validate` turns the composed config into objects — before the task
creates any MLflow run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import hashlib
import json
import math
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, flag_override, open_dict

from .models.spec import (
    DEFAULT_PROMPT_IDS,
    LM_SHAPES,
    PRESET_SLOTS,
    ShapeError,
    checkpoint_shape,
    lm_shape,
)
from .probes import (
    CIFAR_PROBES,
    DEFAULT_PROBES,
    LM_PROBES,
    ONE_INPUT_PROBES,
    PLAIN_PROBES,
    TRAINED_PROBES,
    default_probes,
)


class ConfigError(ValueError):
    """A config value outside what rankexp allows; the message names key, value and rule."""


def _bad(key: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(f"invalid config: {key}={value!r} — {rule}")


class Placement(Enum):
    pre = "pre"
    post = "post"
    output = "output"
    peri = "peri"
    none = "none"


class NormOp(Enum):
    rmsnorm = "rmsnorm"
    layernorm = "layernorm"
    detached = "detached"
    meansub = "meansub"
    batchnorm = "batchnorm"  # over the batch of probe inputs; model=plain only


class Init(Enum):
    """Weight initialization of ``model=plain``: i.i.d. Gaussian or scaled orthogonal."""

    gaussian = "gaussian"
    orthogonal = "orthogonal"


class Activation(Enum):
    relu = "relu"
    gelu = "gelu"
    silu = "silu"
    abs = "abs"
    tanh = "tanh"
    linear = "linear"
    leaky_relu = "leaky_relu"
    swiglu = "swiglu"


class BetaScaling(Enum):
    const = "const"
    inv_sqrt_depth = "inv_sqrt_depth"
    inv_depth = "inv_depth"


class Dtype(Enum):
    float32 = "float32"
    float64 = "float64"


class Optimizer(Enum):
    adam = "adam"
    sgd = "sgd"


class Schedule(Enum):
    constant = "constant"
    step = "step"


class Augment(Enum):
    none = "none"
    pad_crop_flip = "pad_crop_flip"


class Size(Enum):
    """``size=``: which of an experiment's sizes runs (``conf/size/<experiment>/<size>.yaml``)."""

    smoke = "smoke"
    cpu = "cpu"
    full = "full"


class NormSlot(Enum):
    """What one slot P, B or R of Eq. 17 computes: an op of Table 2, or ``none`` (identity)."""

    none = "none"
    rmsnorm = "rmsnorm"
    layernorm = "layernorm"
    detached = "detached"
    meansub = "meansub"
    batchnorm = "batchnorm"  # model=plain only (refused for the residual MLP)


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

    placement: Placement = Placement.pre
    op: NormOp = NormOp.rmsnorm
    pre: NormSlot = _preset("pre")  # type: ignore[assignment]  # resolved by OmegaConf
    out: NormSlot = _preset("out")  # type: ignore[assignment]
    post: NormSlot = _preset("post")  # type: ignore[assignment]

    def preset_slot(self, slot: str) -> str:
        """What the preset alone puts in ``slot`` (``pre``/``out``/``post``)."""
        return _preset_slot(slot, self.placement, self.op)


@dataclass
class MlpModel:
    """``model=mlp`` (default): the residual MLP of the study (science.md §1,
    :class:`rankexp.models.mlp.ResidualMLP`), shaped by the top-level knobs."""

    name: str = "mlp"


@dataclass
class PlainModel:
    """``model=plain``: the mean-field plain network of the textbook chapter (science.md §5,
    :class:`rankexp.models.plain.PlainNet`), ``h_l = W_l φ(N(h_{l−1})) + b_l`` (plus the skip
    ``h_{l−1}`` and branch gain β when ``skip_every=1``), shaped by the top-level knobs
    ``depth``, ``width``, ``alpha`` (σ_w), ``bias`` (σ_b), ``init``, ``activation``,
    ``skip_every``, ``beta`` and ``norm`` (``none``, or ``pre`` with any op incl. ``batchnorm``).
    ``expansion`` and ``matrices`` do not apply (one n×n matrix per layer)."""

    name: str = "plain"


@dataclass
class Gpt2Model:
    """``model=gpt2``: a Hugging Face causal LM (:mod:`rankexp.models.gpt2`), its FFN-branch
    Jacobians along the residual stream of a fixed prompt (Figure 12, probe ``ffn_jacobian``).

    The top-level ``width`` (d) and ``depth`` (L) default to the network's own — the named
    ``config``'s, or the checkpoint's when ``pretrained`` is given (``conf/model/gpt2.yaml``) —
    and ``width=``/``depth=`` reduce a random initialization (tests).  The residual-MLP knobs
    (``expansion``, ``matrices``, ``alpha``, ``beta``, ``activation``, ``norm``) do not apply.

    Attributes:
        config: the shape of a random initialization (``gpt2`` = GPT-2 Small, ``gpt2-medium``,
            ``gpt2-large``, ``gpt2-xl``), GPT-2's own initialization, no download.
        pretrained: a local checkpoint directory or hub id for ``from_pretrained`` (then one
            network: ``seeds=1``); null = random initialization.
        n_head: attention heads (null: the config's, or head size 64 at a reduced width).
        prompt_ids: the fixed prompt as token ids (default: GPT-2 BPE of "The quick brown fox
            jumps over the lazy dog.").
        prompt: the prompt as text instead (tokenized by ``tokenizer``, default ``pretrained``).
        tokenizer: where the tokenizer of a text prompt comes from (local directory or hub id).
        position: the token whose stream is traced (negative: from the end; default the last).
    """

    name: str = "gpt2"
    config: str = "gpt2"
    pretrained: str | None = None
    n_head: int | None = None
    prompt_ids: list[int] = field(default_factory=lambda: list(DEFAULT_PROMPT_IDS))
    prompt: str | None = None
    tokenizer: str | None = None
    position: int = -1

    def __post_init__(self) -> None:
        if self.config not in LM_SHAPES:
            raise _bad("model.config", self.config, f"allowed: {', '.join(LM_SHAPES)}")
        if self.n_head is not None and self.n_head < 1:
            raise _bad("model.n_head", self.n_head, "must be an integer ≥ 1 (or null)")
        if self.prompt is None:
            ids = list(self.prompt_ids)
            if not ids or min(ids) < 0:
                raise _bad("model.prompt_ids", ids, "need at least one token id ≥ 0")
            if not -len(ids) <= self.position < len(ids):
                raise _bad("model.position", self.position, f"outside the prompt of {len(ids)} tokens")
        elif not (self.tokenizer or self.pretrained):
            raise _bad("model.prompt", self.prompt, "a text prompt needs a tokenizer: set "
                       "model.tokenizer or model.pretrained (a local directory or hub id), or "
                       "give model.prompt_ids")


@dataclass
class CifarResNetModel:
    """``model=cifar_resnet``: He et al.'s (2016, §4.2) CIFAR-10 ConvNet of depth 6n+2
    (:class:`rankexp.models.convnet.CifarResNet`; science.md §5, degradation replication).

    The top-level ``depth`` (6n+2: 20, 32, 44, 56, 110), ``seed``/``seeds`` and ``dtype`` shape
    it; ``residual`` (option-A shortcuts every two convs, or the plain network) and
    ``base_width`` (stage-1 filters; 16, 32, 64 across the stages) are this family's own: the
    top-level ``width``, ``expansion``, ``alpha``, ``beta``, ``norm`` … describe the MLP and are
    not used.
    """

    name: str = "cifar_resnet"
    residual: bool = True
    base_width: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.base_width, bool) or not isinstance(self.base_width, int) or self.base_width < 1:
            raise _bad("model.base_width", self.base_width, "must be an integer ≥ 1 (He et al.: 16)")


#: the schema of each ``model=`` family (``conf/model/<name>.yaml`` extends ``schema/model/<name>``)
MODEL_SCHEMAS: dict[str, type] = {"mlp": MlpModel, "plain": PlainModel, "gpt2": Gpt2Model,
                                  "cifar_resnet": CifarResNetModel}


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
    from .probes import PROBES

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
    from .probes import PROBES

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
    max_memory_gb: float | None = None

    def __post_init__(self) -> None:
        from .probes import PROBES

        if dataclasses.is_dataclass(self.options):  # probes read plain mappings
            self.options = dataclasses.asdict(self.options)
        if not self.probes:
            raise _bad("task.probes", self.probes, "list at least one probe")
        for p in self.probes:
            if p not in PROBES:
                raise _bad("task.probes", p, f"allowed: {', '.join(sorted(PROBES))}")
        if self.max_memory_gb is not None and not (math.isfinite(self.max_memory_gb) and self.max_memory_gb > 0):
            raise _bad("task.max_memory_gb", self.max_memory_gb, "must be a number of GB > 0 (or null)")


@dataclass
class TrainTask:
    """``task=train``: CIFAR-10; all learning rates trained as one batched model.

    Length: ``steps`` optimizer steps (evaluations every ``eval_every``, reports every
    ``log_every``, series logged at step = optimizer step), or ``epochs`` passes over the
    training set (⌊50000/batch_size⌋ steps each; one report and evaluation per epoch, series
    logged at step = epoch; ``eval_every``/``log_every`` are then not used) — exactly one of
    the two is set.

    Recipe (:mod:`rankexp.tasks.recipes`): ``optimizer`` adam (the study's) or sgd
    (``momentum``, ``weight_decay`` on conv kernels and weight matrices only, never on BN
    scale/shift or biases); ``schedule`` constant or step (rates × ``gamma`` at each fraction
    ``milestones`` of training, and × ``warmup_factor`` for the first ``warmup_steps`` steps of
    networks with ``depth ≥ warmup_min_depth``); ``augment`` none or pad_crop_flip (He et al.:
    ``pad`` pixels, random crop, horizontal flip; on the device). He et al.'s CIFAR recipe is
    ``conf/experiment/degradation.yaml``'s.

    Measurements: ``probes`` lists those of the model family to run — ``init_gradient_norms``
    on the initial network before the first step, the others (``layer_response``, ``lesion``)
    on the trained one — with ``options.<probe>`` as for ``task=measure``;
    ``clean_train_images`` > 0 also evaluates that many training images without augmentation
    at the end (``clean_train_error_lr<lr>``).

    ``dtype`` is the training precision (the top-level ``dtype`` is the measurement's).
    Checkpoints live in ``checkpoint_dir/<config_hash>.pt`` so a rerun of the same
    config — in a new sweep directory, after preemption — resumes from them.
    A learning rate *diverged* when its train loss turns non-finite or exceeds
    ``divergence_factor`` × its initial loss (``inf``: non-finite only). ``compile``
    (``torch.compile`` of forward + loss) and ``cuda_graphs`` (the whole step replayed as one
    CUDA graph; ignored with a warning on CPU) are speed options for GPUs.
    """

    name: str = "train"
    steps: int | None = 5000
    epochs: int | None = None
    batch_size: int = 256
    lrs: list[float] = field(default_factory=lambda: [3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    eval_every: int = 500
    log_every: int = 50
    checkpoint_every: int = 500
    stable_accuracy: float = 0.4
    dtype: Dtype = Dtype.float32
    checkpoint_dir: str = ".cache/checkpoints"
    divergence_factor: float = 1000.0
    bf16: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    optimizer: Optimizer = Optimizer.adam
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: Schedule = Schedule.constant
    milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])
    gamma: float = 0.1
    warmup_steps: int = 0
    warmup_factor: float = 0.1
    warmup_min_depth: int = 0
    augment: Augment = Augment.none
    pad: int = 4
    clean_train_images: int = 0
    probes: list[str] = field(default_factory=list)
    options: ProbeOptions = field(default_factory=ProbeOptions)  # type: ignore[valid-type]

    def __post_init__(self) -> None:
        if dataclasses.is_dataclass(self.options):  # probes read plain mappings
            self.options = dataclasses.asdict(self.options)
        if (self.steps is None) == (self.epochs is None):
            raise _bad("task.steps/task.epochs", (self.steps, self.epochs),
                       "set exactly one: task.steps (optimizer steps) or task.epochs "
                       "(e.g. task.epochs=null task.steps=300)")
        for key in ("steps", "epochs"):
            v = getattr(self, key)
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise _bad(f"task.{key}", v, "must be an integer ≥ 1 (or null)")
        for key in ("batch_size", "eval_every", "log_every", "checkpoint_every"):
            v = getattr(self, key)
            if not (isinstance(v, int) and v >= 1):
                raise _bad(f"task.{key}", v, "must be an integer ≥ 1")
        from .tasks.data import CIFAR10_COUNTS

        if self.batch_size > CIFAR10_COUNTS[0]:
            raise _bad("task.batch_size", self.batch_size, f"a batch is drawn from CIFAR-10's "
                       f"{CIFAR10_COUNTS[0]} training images: at most {CIFAR10_COUNTS[0]}")
        if self.clean_train_images > CIFAR10_COUNTS[0]:
            raise _bad("task.clean_train_images", self.clean_train_images,
                       f"CIFAR-10 has {CIFAR10_COUNTS[0]} training images")
        for key in ("warmup_steps", "warmup_min_depth", "pad", "clean_train_images"):
            v = getattr(self, key)
            if isinstance(v, bool) or not (isinstance(v, int) and v >= 0):
                raise _bad(f"task.{key}", v, "must be an integer ≥ 0")
        if not 0 <= self.momentum < 1:
            raise _bad("task.momentum", self.momentum, "must be in [0, 1)")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise _bad("task.weight_decay", self.weight_decay, "must be a finite number ≥ 0")
        if self.weight_decay and self.optimizer is not Optimizer.sgd:
            raise _bad("task.weight_decay", self.weight_decay, "applies to task.optimizer=sgd only")
        if any(not 0 < m < 1 for m in self.milestones) or list(self.milestones) != sorted(self.milestones):
            raise _bad("task.milestones", list(self.milestones),
                       "must be increasing fractions of training in (0, 1), e.g. [0.5, 0.75]")
        for key in ("gamma", "warmup_factor"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v > 0):
                raise _bad(f"task.{key}", v, "must be a finite number > 0")
        from .probes import PROBES

        for p in self.probes:
            if p not in PROBES:
                raise _bad("task.probes", p, f"allowed: {', '.join(sorted(PROBES))}")
        if not self.lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lrs):
            raise _bad("task.lrs", list(self.lrs), "must be a non-empty list of positive numbers")
        if not self.divergence_factor > 1:
            raise _bad("task.divergence_factor", self.divergence_factor,
                       "must be > 1 (a multiple of the initial loss; inf: non-finite only)")


@dataclass
class DataConfig:
    """Where CIFAR-10 lives: an image-folder tree / its tar.gz, or the torchvision original."""

    root: str = "${oc.env:RANKEXP_DATA,../shared/data}"
    source: str = "auto"
    cache_dir: str = ".cache"
    download: bool = False

    def __post_init__(self) -> None:
        allowed = ("auto", "torchvision", "imagefolder", "archive")
        if self.source not in allowed:
            raise _bad("data.source", self.source, f"allowed: {', '.join(allowed)}")


@dataclass
class TrackingConfig:
    """MLflow: store URI, experiment name, resume behaviour, outage and liveness bounds.

    ``uri: null`` means ``$MLFLOW_TRACKING_URI`` if set, else an embedded SQLite
    file ``mlflow.db`` in the directory the command was started from.

    ``http_retries``, ``http_timeout_s``, ``http_backoff`` become MLflow's own
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``_TIMEOUT`` / ``_BACKOFF_FACTOR`` for the job (so a
    server outage costs seconds, not MLflow's default of minutes per call).  A run's owner
    refreshes the tag ``rankexp.heartbeat`` every ``heartbeat_s`` seconds; a RUNNING run whose
    owner cannot be checked otherwise (another host, no Slurm) is stale after ``stale_after_s``.

    How runs read in the MLflow UI (none of these enters the config hash: ``tracking`` is not
    part of what a run computes):

    * ``run_name``: a single run's name (default: its config, ``post·α1·β1·L48·d256``); in a
      sweep, the name of the sweep's parent run (default ``<experiment>·<size>·<start>``),
      its job runs keeping the names of their swept axes.
    * ``tags``: ``{key: value}`` put on every run it starts (the sweep's parent included), e.g.
      ``+tracking.tags.team=vision``; a key must be a legal MLflow tag name that rankexp does
      not write itself (not ``mlflow.*``, ``rankexp.*`` or a tag of the run schema).
    * ``note``: the runs' description (MLflow's ``mlflow.note.content``, Markdown); a sweep's
      parent shows it above the command line.
    * ``description``: the experiment's description (the experiment's ``mlflow.note.content``
      tag); each experiment config sets it.
    """

    uri: str | None = None
    experiment: str = "rankexp"
    enabled: bool = True
    resume: bool = True
    force: bool = False
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

    def __post_init__(self) -> None:
        from .tracking import experiment_name_problem, user_tag_problem

        problem = experiment_name_problem(self.experiment)
        if problem:
            raise _bad("tracking.experiment", self.experiment, problem)
        if self.run_name is not None and not str(self.run_name).strip():
            raise _bad("tracking.run_name", self.run_name, "must be a non-empty name (or null)")
        for key in self.tags:
            problem = user_tag_problem(str(key))
            if problem:
                raise _bad(f"tracking.tags.{key}", self.tags[key], problem)
        for key, low in (("http_retries", 0), ("http_timeout_s", 1), ("http_backoff", 0),
                         ("heartbeat_s", 1), ("stale_after_s", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise _bad(f"tracking.{key}", v, f"must be an integer ≥ {low}")
        if self.stale_after_s < 2 * self.heartbeat_s:
            raise _bad("tracking.stale_after_s", self.stale_after_s,
                       f"must be at least twice tracking.heartbeat_s={self.heartbeat_s}")


@dataclass
class RankexpConfig:
    """The whole composed config; top-level keys are the architectural knobs (design.md §1).

    Defaults are the study's: d=256, L=48, m/d=4, M=2, ReLU, Pre-RMSNorm, α=β=1.
    """

    depth: int = 48
    width: int = 256
    expansion: float = 4.0
    matrices: int = 2
    alpha: float = 1.0
    beta: float = 1.0
    beta_scaling: BetaScaling = BetaScaling.const
    activation: Activation = Activation.relu
    skip_every: int = 1
    bias: float = 0.0
    init: Init = Init.gaussian
    seeds: int = 4
    seed: int = 0
    device: str = "auto"
    dtype: Dtype = Dtype.float64
    lr: float | None = None
    size: Size = Size.full
    model: Any = MISSING  # a model family's schema from the `model` group (MODEL_SCHEMAS)
    norm: NormConfig = field(default_factory=NormConfig)
    task: Any = MISSING  # a TaskConfig from the `task` group (measure or train)
    data: DataConfig = field(default_factory=DataConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        def integer(key: str, low: int, what: str) -> None:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise _bad(key, v, f"{what} must be an integer ≥ {low}")

        integer("depth", 1, "depth (L)")
        integer("width", 1, "width (d)")
        integer("seeds", 1, "the number of seeds")
        integer("skip_every", 0, "skip_every (0 = plain MLP, 1 = every block)")
        integer("seed", 0, "the base seed")
        if self.matrices not in (1, 2):
            raise _bad("matrices", self.matrices, "a branch has M = 1 or M = 2 weight matrices")
        for key in ("alpha", "beta", "expansion"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v > 0):
                raise _bad(key, v, "must be a finite number > 0")
        if self.matrices == 2 and round(self.expansion * self.width) < 1:
            raise _bad("expansion", self.expansion, f"m = expansion·width must be ≥ 1 (width={self.width})")
        if self.activation is Activation.swiglu and self.matrices != 2:
            raise _bad("activation", "swiglu", "the gated unit needs matrices=2")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise _bad("lr", self.lr, "must be a number > 0 (or null for the task's LR sweep)")
        dev = self.device
        if not (dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise _bad("device", dev, "allowed: auto, cpu, cuda, cuda:N, mps")
        if not isinstance(self.model, tuple(MODEL_SCHEMAS.values())):
            raise _bad("model", type(self.model).__name__, f"choose model={'|'.join(MODEL_SCHEMAS)}")
        if not isinstance(self.task, (MeasureTask, TrainTask)):
            raise _bad("task", type(self.task).__name__, "choose task=measure or task=train")
        if not (math.isfinite(self.bias) and self.bias >= 0):
            raise _bad("bias", self.bias, "σ_b must be a finite number ≥ 0")
        self._check_family()

    def _check_family(self) -> None:
        """Knobs and probes only one model family has: bias/init/batchnorm and the mean-field
        probes (plain), the LM probes (gpt2), the ConvNet probes (cifar_resnet); a batchnorm also
        rules out the probes that see one input at a time."""
        probes = list(self.task.probes)
        self._check_probe_task(probes)
        if isinstance(self.model, Gpt2Model):
            self._check_lm(probes)
            return
        lm_only = [p for p in probes if p in LM_PROBES]
        if lm_only:
            raise _bad("task.probes", lm_only, "these probe a causal LM: add model=gpt2")
        if isinstance(self.model, PlainModel):
            if self.norm.placement not in (Placement.none, Placement.pre):
                raise _bad("norm", self.norm.placement.value,
                           "model=plain supports norm=none or norm=pre (N before φ)")
            if self.activation is Activation.swiglu:
                raise _bad("activation", "swiglu", "model=plain has one matrix per layer; "
                           "the gated unit needs model=mlp matrices=2")
            for slot in ("pre", "out", "post"):
                got = getattr(self.norm, slot).value
                if got != _preset_slot(slot, self.norm.placement, self.norm.op):
                    raise _bad(f"norm.{slot}", got, "model=plain takes its norm from norm= and "
                               "norm.op (the slots P, B, R of Eq. 17 are model=mlp's)")
            single = [p for p in probes if p in ONE_INPUT_PROBES]
            if self.norm.op is NormOp.batchnorm and self.norm.placement is Placement.pre and single:
                raise _bad("task.probes", single, "these differentiate one input per seed and a "
                           "batchnorm needs a batch; use correlation, gradient_norms, shattered")
        if isinstance(self.model, CifarResNetModel):
            self._check_cifar_resnet(probes)
        else:
            convnet_only = [p for p in probes if p in CIFAR_PROBES]
            if convnet_only:
                raise _bad("task.probes", convnet_only, "the ConvNet probes need model=cifar_resnet")
        if isinstance(self.model, PlainModel):
            return
        plain_only = [p for p in probes if p in PLAIN_PROBES]
        if plain_only:
            raise _bad("task.probes", plain_only, "the mean-field probes need model=plain")
        if self.bias != 0:
            raise _bad("bias", self.bias, "biases (σ_b) exist only in model=plain (add model=plain)")
        if self.init is not Init.gaussian:
            raise _bad("init", self.init.value, "orthogonal weights exist only in model=plain (add model=plain)")
        if self.norm.op is NormOp.batchnorm:
            raise _bad("norm.op", "batchnorm", "batch normalization exists only in model=plain (add model=plain norm=pre)")
        for slot in ("pre", "out", "post"):
            if getattr(self.norm, slot) is NormSlot.batchnorm:
                raise _bad(f"norm.{slot}", "batchnorm", "batch normalization exists only in model=plain "
                           "(add model=plain norm=pre norm.op=batchnorm)")

    def _check_probe_task(self, probes: list[str]) -> None:
        """``lesion`` needs training; the probes of a training run measure one trained network."""
        for p in probes:
            if p in TRAINED_PROBES and self.task.name != "train":
                raise _bad("task.probes", p, "measures a trained network: use it with task=train")
        if self.task.name == "train" and probes and self.lr is None and len(self.task.lrs) > 1:
            raise _bad("task.probes", probes, "measure one trained network: give one "
                       f"learning rate (lr=… or task.lrs=[…]), not the sweep {list(self.task.lrs)}")

    def _check_cifar_resnet(self, probes: list[str]) -> None:
        d = self.depth
        if d < 8 or (d - 2) % 6:
            raise _bad("depth", d, "model=cifar_resnet needs depth = 6n+2, n ≥ 1 (He et al.: "
                       "20, 32, 44, 56, 110; smoke: 8)")
        foreign = [p for p in probes if p not in CIFAR_PROBES]
        if foreign:
            init = ",".join(q for q in CIFAR_PROBES if q not in TRAINED_PROBES)
            raise _bad("task.probes", foreign, f"not probes of model=cifar_resnet; its probes: "
                       f"{', '.join(CIFAR_PROBES)} (at initialization: task.probes=[{init}])")


    def _check_lm(self, probes: list[str]) -> None:
        """``model=gpt2``: measure only, its own probes, heads dividing d, one pretrained network
        whose shape (when known offline) is width × depth."""
        m = self.model
        if not isinstance(self.task, MeasureTask):
            raise _bad("task", self.task.name, "model=gpt2 measures (task=measure); it does not train")
        other = [p for p in probes if p not in LM_PROBES]
        if other:
            raise _bad("task.probes", other, f"model=gpt2 runs {', '.join(LM_PROBES)}")
        if m.pretrained:
            if self.seeds != 1:
                raise _bad("seeds", self.seeds, "pretrained weights are one network: use seeds=1")
            shape = checkpoint_shape(m.pretrained)
            if shape and (shape.get("n_embd"), shape.get("n_layer")) != (self.width, self.depth):
                raise _bad("width/depth", (self.width, self.depth),
                           f"model.pretrained={m.pretrained!r} has d = {shape.get('n_embd')}, "
                           f"L = {shape.get('n_layer')} (leave width/depth unset)")
        elif m.n_head is not None and self.width % m.n_head:
            raise _bad("model.n_head", m.n_head, f"must divide width={self.width}")


def sweep_stamp() -> str:
    """A launch stamp ``HH-MM-SS-<pid>`` fixed for this process and every job it spawns.

    Hydra resolves ``hydra.sweep.dir`` in the launcher and again in workers;
    the stamp travels in ``$RANKEXP_STAMP`` so they all agree, while two sweeps
    started in the same second get different directories.
    """
    import datetime
    import os

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
    if not OmegaConf.has_resolver("rankexp_stamp"):
        OmegaConf.register_new_resolver("rankexp_stamp", sweep_stamp)
    if not OmegaConf.has_resolver("rankexp_signal_delay"):
        OmegaConf.register_new_resolver("rankexp_signal_delay", slurm_signal_delay)
    if not OmegaConf.has_resolver("rankexp_hydra_subdir"):
        OmegaConf.register_new_resolver("rankexp_hydra_subdir", hydra_subdir)
    if not OmegaConf.has_resolver("rankexp_help"):
        from .helptext import section

        OmegaConf.register_new_resolver("rankexp_help", section)
    if not OmegaConf.has_resolver("rankexp_norm_slot"):
        OmegaConf.register_new_resolver("rankexp_norm_slot", _preset_slot)
    if not OmegaConf.has_resolver("rankexp_default_probes"):
        OmegaConf.register_new_resolver("rankexp_default_probes", default_probes)
    if not OmegaConf.has_resolver("rankexp_lm_shape"):
        OmegaConf.register_new_resolver("rankexp_lm_shape", lm_shape)
    cs = ConfigStore.instance()
    cs.store(name="rankexp_schema", node=RankexpConfig)
    # group schemas live under schema/ so `--help` lists only real choices for norm= and task=
    cs.store(group="schema/task", name="measure", node=MeasureTask)
    cs.store(group="schema/task", name="train", node=TrainTask)
    cs.store(group="schema/norm", name="norm", node=NormConfig)
    for name, node in MODEL_SCHEMAS.items():
        cs.store(group="schema/model", name=name, node=node)


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


#: config keys that say where/how a run is recorded, not what it computes
NON_SEMANTIC_KEYS = ("tracking", "device", "hydra", "size")
#: knobs added after v1: at these defaults they stay out of the hash, so runs logged before
#: they existed still match (resume skips them) — a config with default bias/init is unchanged
LATER_KNOB_DEFAULTS = {"bias": 0.0, "init": "gaussian"}


def resolved_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python (enums as strings, no ``hydra`` node)."""
    c = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    c.pop("hydra", None)
    return c


def config_hash(container: dict[str, Any]) -> str:
    """Stable 16-hex-digit hash of what a run computes (the tracking/device keys excluded).

    Two jobs with the same hash compute the same numbers; resume uses it to
    skip configs that already FINISHED.
    """
    semantic = {k: v for k, v in container.items() if k not in NON_SEMANTIC_KEYS
                and not (k in LATER_KNOB_DEFAULTS and v == LATER_KNOB_DEFAULTS[k])}
    if semantic.get("task", {}).get("name") == "measure":
        semantic.pop("data", None)
        semantic.pop("lr", None)
        # seed chunking never changes a number (tested), so the budget is not part of the hash
        semantic["task"] = {k: v for k, v in semantic["task"].items() if k != "max_memory_gb"}
    if isinstance(semantic.get("task"), dict) and "options" in semantic["task"]:
        # an option at its declared default adds nothing: v1's `options: {}` keeps its hash
        semantic["task"] = {**semantic["task"], "options": given_options(semantic["task"]["options"])}
    norm = semantic.get("norm")
    if isinstance(norm, dict) and {"placement", "op"} <= norm.keys():
        # a slot that only repeats its preset adds nothing: configs v1 could express keep v1's hash
        semantic["norm"] = {k: v for k, v in norm.items()
                            if not (k in ("pre", "out", "post")
                                    and v == _preset_slot(k, norm["placement"], norm["op"]))}
    blob = json.dumps(semantic, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flatten(container: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"norm": {"op": "rmsnorm"}} → {"norm.op": "rmsnorm"}``; lists become strings."""
    out: dict[str, Any] = {}
    for k, v in container.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# --------------------------------------------------------------------------- checks before a run
#: fields of the root whose node type depends on a config group choice
_CHOSEN_NODES: dict[str, tuple[type, ...]] = {
    "model": tuple(MODEL_SCHEMAS.values()),
    "task": (MeasureTask, TrainTask),
}
_FREE = "free-form"  # a dict field: any key is allowed (e.g. task.options)


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
    from .memory import cuda_possible

    index = int(name[5:]) if name.startswith("cuda:") else 0
    present = False
    if cuda_possible():
        import torch

        present = torch.cuda.is_available() and index < torch.cuda.device_count()
    if not present:
        raise ConfigError(f"invalid config: device={name!r} — this machine has no such CUDA device "
                          "(use device=auto or device=cpu)")


def check_paths(s: RankexpConfig) -> None:
    """Inputs a task reads must exist before its run does: ``data.root`` for ``task=train``
    (unless ``data.download=true`` may fetch it).

    Raises:
        ConfigError: the path, where it was looked for, and what belongs there.
    """
    from .locations import resolve_path

    if isinstance(s.model, Gpt2Model) and s.model.pretrained:
        check_pretrained(s.model.pretrained)
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


#: a Hugging Face hub id: ``name`` or ``org/name`` (letters, digits, ``-``, ``_``, ``.``)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def check_pretrained(pretrained: str) -> None:
    """``model.pretrained`` names a local checkpoint directory (``save_pretrained``'s, with its
    ``config.json``) or a hub id (``gpt2``, ``openai-community/gpt2-medium``); a path that is
    neither is refused before any run exists (not as a Hugging Face traceback after one).

    Raises:
        ConfigError: the value, what was found there and what belongs there.
    """
    path = Path(pretrained).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _bad("model.pretrained", pretrained, f"{path} holds no config.json: a local "
                       "checkpoint is a directory written by save_pretrained")
        return
    if path.exists():
        raise _bad("model.pretrained", pretrained, f"{path} is a file; a local checkpoint is a "
                   "directory written by save_pretrained (config.json + weights)")
    looks_like_path = pretrained.startswith(("/", ".", "~")) or "\\" in pretrained
    if looks_like_path or not _HUB_ID.fullmatch(pretrained) or ".." in pretrained:
        raise _bad("model.pretrained", pretrained, f"no such directory ({path.absolute()}); give "
                   "a local checkpoint directory (config.json + weights) or a hub id such as "
                   "gpt2 or openai-community/gpt2-medium")


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
        from .memory import check_fits

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
