"""Every check before a run: what can be known about a job before its MLflow run exists —
keys (command line and composed config), values and every rule across them (:func:`validate`),
input paths, the device and memory, whether each override is used (:func:`check_job` runs them
all).  The sweeper checks each job once (:data:`CHECKED_JOBS`).  The schema holds no rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf, flag_override, open_dict

from .. import memory
from ..knobs import CIFAR10_COUNTS, ConfigError, bad
from ..locations import MissingDataError, cache_path, locate_cifar10, resolve_path
from ..models.families import family_of
from ..models.spec import LM_SHAPES, ShapeError, checkpoint_shape, expanded_width
from ..naming import experiment_name_problem
from ..probes import PROBES
from ..probes.catalog import probe_options
from ..tracking import user_tag_problem
from .hashing import config_hash, flatten, resolved_container
from .schema import (
    FREE,
    MODEL_SCHEMAS,
    MeasureTask,
    Optimizer,
    RankexpConfig,
    TrainTask,
    _preset_slot,
    children,
    given_options,
    slurm_signal_delay,
)


def validate(cfg: DictConfig) -> RankexpConfig:
    """Resolve ``cfg`` into typed objects and check every value (:func:`check_values`).

    Raises:
        ConfigError: a value outside the allowed range (names key, value, rule).
    """
    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as e:
        cause = e
        while cause is not None:  # the rankexp_lm_shape resolver (model=gpt2), wrapped twice
            if isinstance(cause, ShapeError):
                raise ConfigError(f"invalid config: {cause}") from None
            cause = cause.__cause__ or cause.__context__
        raise
    if not isinstance(obj, RankexpConfig):
        raise ConfigError("the composed config does not extend rankexp_schema")
    if isinstance(obj.task, (MeasureTask, TrainTask)):  # probes read plain mappings
        if dataclasses.is_dataclass(obj.task.options):
            obj.task.options = dataclasses.asdict(obj.task.options)
        if isinstance(obj.task, TrainTask) and not isinstance(obj.task.probe_steps, (str, type(None))):
            obj.task.probe_steps = list(obj.task.probe_steps)  # a ListConfig from the YAML
    check_values(obj)
    return obj


def _integer(key: str, v: Any, low: int, what: str = "", null: bool = False) -> None:
    if (isinstance(v, bool) or not isinstance(v, int) or v < low) and not (null and v is None):
        raise bad(key, v, f"{what + ' ' if what else ''}must be an integer ≥ {low}"
                  + (" (or null)" if null else ""))


def _positive(key: str, v: Any, rule: str = "must be a finite number > 0") -> None:
    if not (math.isfinite(v) and v > 0):
        raise bad(key, v, rule)


def check_values(s: RankexpConfig) -> None:
    """Every rule on the values of a typed config: the model family's fields, the task's, the
    data source, the tracking names, the top-level knobs, then :func:`check_family`.

    Raises:
        ConfigError: the first rule broken, naming key, value and what is allowed.
    """
    if not isinstance(s.model, tuple(MODEL_SCHEMAS.values())):
        raise bad("model", type(s.model).__name__, f"choose model={'|'.join(MODEL_SCHEMAS)}")
    if not isinstance(s.task, (MeasureTask, TrainTask)):
        raise bad("task", type(s.task).__name__, "choose task=measure or task=train")
    _check_model(s.model)
    if isinstance(s.task, MeasureTask):
        _check_measure(s.task)
    else:
        _check_train(s.task)
    allowed = ("auto", "torchvision", "imagefolder", "archive")
    if s.data.source not in allowed:
        raise bad("data.source", s.data.source, f"allowed: {', '.join(allowed)}")
    _check_tracking(s.tracking)
    _integer("depth", s.depth, 1, "depth (L)")
    _integer("width", s.width, 1, "width (d)")
    _integer("seeds", s.seeds, 1, "the number of seeds")
    _integer("skip_every", s.skip_every, 0, "skip_every (0 = plain MLP, 1 = every block)")
    _integer("seed", s.seed, 0, "the base seed")
    if s.matrices not in (1, 2):
        raise bad("matrices", s.matrices, "a branch has M = 1 or M = 2 weight matrices")
    for key in ("alpha", "beta", "expansion"):
        _positive(key, getattr(s, key))
    if s.matrices == 2 and expanded_width(s.width, s.expansion) < 1:
        raise bad("expansion", s.expansion, f"m = expansion·width must be ≥ 1 (width={s.width})")
    if s.activation.value == "swiglu" and s.matrices != 2:
        raise bad("activation", "swiglu", "the gated unit needs matrices=2")
    if s.lr is not None:
        _positive("lr", s.lr, "must be a number > 0 (or null for the task's LR sweep)")
    dev = s.device
    if not (dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise bad("device", dev, "allowed: auto, cpu, cuda, cuda:N, mps")
    if s.threads != "auto" and not (type(s.threads) is int and s.threads >= 1):
        raise bad("threads", s.threads, "allowed: auto or a whole number ≥ 1")
    _check_scale(s)
    if not (math.isfinite(s.bias) and s.bias >= 0):
        raise bad("bias", s.bias, "σ_b must be a finite number ≥ 0")
    check_family(s)


def _check_scale(s: RankexpConfig) -> None:
    """The family's derived params (logged with the run: βα^M, βα^M√L, …) are finite, and the
    stream's mean square at depth L, 1 + (βα^M√L)² (Pre-Norm; the ``stream`` probe's model, a
    plain net's bound), fits the narrowest float the job computes in."""
    derived = family_of(s).derived
    kinds = [s.dtype.value] + ([s.task.dtype.value] if isinstance(s.task, TrainTask) else [])
    dtype = min(kinds, key=memory.ITEMSIZE.__getitem__)
    try:
        params = dict(derived(s)) if derived else {}
        finite = all(math.isfinite(v) for v in params.values())
        finite = finite and params.get("depth_factor", 0.0) ** 2 < float(np.finfo(dtype).max)
    except OverflowError:
        finite = False
    if not finite:
        raise bad("alpha", s.alpha, f"the branch scale βα^M (Eq. 21, β={s.beta:g}, L={s.depth}) "
                  f"makes the stream's mean square 1 + (βα^M)²·L overflow a {dtype}; "
                  "α and β must keep it finite")


def _check_model(m: Any) -> None:
    """The fields of the ``model`` node of a family that has its own."""
    if m.name == "cifar_resnet":
        _integer("model.base_width", m.base_width, 1)
        return
    if m.name != "gpt2":
        return
    if m.config not in LM_SHAPES:
        raise bad("model.config", m.config, f"allowed: {', '.join(LM_SHAPES)}")
    _integer("model.n_head", m.n_head, 1, null=True)
    if m.prompt is None:
        ids = list(m.prompt_ids)
        if not ids or min(ids) < 0:
            raise bad("model.prompt_ids", ids, "need at least one token id ≥ 0")
        if not -len(ids) <= m.position < len(ids):
            raise bad("model.position", m.position, f"outside the prompt of {len(ids)} tokens")
    elif not (m.tokenizer or m.pretrained):
        raise bad("model.prompt", m.prompt, "a text prompt needs a tokenizer: set "
                  "model.tokenizer or model.pretrained (a local directory or hub id), or "
                  "give model.prompt_ids")


def _check_probes(t: MeasureTask | TrainTask) -> None:
    """The probes exist; the options given are in range
    (:func:`~rankexp.probes.catalog.probe_options`)."""
    for p in t.probes:
        if p not in PROBES:
            raise bad("task.probes", p, f"allowed: {', '.join(sorted(PROBES))}")
    for p, given in given_options(t.options).items():
        try:
            probe_options({p: given}, p, PROBES[p].options)
        except ValueError as e:
            raise ConfigError(f"invalid config: {e}") from None


def _check_measure(t: MeasureTask) -> None:
    if not t.probes:
        raise bad("task.probes", t.probes, "list at least one probe")
    _check_probes(t)
    if t.max_memory_gb is not None and not (math.isfinite(t.max_memory_gb) and t.max_memory_gb > 0):
        raise bad("task.max_memory_gb", t.max_memory_gb, "must be a number of GB > 0 (or null)")


def _check_train(t: TrainTask) -> None:
    if (t.steps is None) == (t.epochs is None):
        raise bad("task.steps/task.epochs", (t.steps, t.epochs),
                  "set exactly one: task.steps (optimizer steps) or task.epochs "
                  "(e.g. task.epochs=null task.steps=300)")
    for key in ("steps", "epochs", "batch_size", "eval_every", "log_every", "checkpoint_every"):
        _integer(f"task.{key}", getattr(t, key), 1, null=key in ("steps", "epochs"))
    if t.batch_size > CIFAR10_COUNTS[0]:
        raise bad("task.batch_size", t.batch_size, f"a batch is drawn from CIFAR-10's "
                  f"{CIFAR10_COUNTS[0]} training images: at most {CIFAR10_COUNTS[0]}")
    if t.clean_train_images > CIFAR10_COUNTS[0]:
        raise bad("task.clean_train_images", t.clean_train_images,
                  f"CIFAR-10 has {CIFAR10_COUNTS[0]} training images")
    for key in ("warmup_steps", "warmup_min_depth", "pad", "clean_train_images"):
        _integer(f"task.{key}", getattr(t, key), 0)
    if not 0 <= t.momentum < 1:
        raise bad("task.momentum", t.momentum, "must be in [0, 1)")
    if not (math.isfinite(t.weight_decay) and t.weight_decay >= 0):
        raise bad("task.weight_decay", t.weight_decay, "must be a finite number ≥ 0")
    if t.weight_decay and t.optimizer is not Optimizer.sgd:
        raise bad("task.weight_decay", t.weight_decay, "applies to task.optimizer=sgd only")
    if any(not 0 < m < 1 for m in t.milestones) or list(t.milestones) != sorted(t.milestones):
        raise bad("task.milestones", list(t.milestones),
                  "must be increasing fractions of training in (0, 1), e.g. [0.5, 0.75]")
    for key in ("gamma", "warmup_factor"):
        _positive(f"task.{key}", getattr(t, key))
    _check_probes(t)
    if not t.lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in t.lrs):
        raise bad("task.lrs", list(t.lrs), "must be a non-empty list of positive numbers")
    if not t.divergence_factor > 1:
        raise bad("task.divergence_factor", t.divergence_factor,
                  "must be > 1 (a multiple of the initial loss; inf: non-finite only)")
    t.probe_schedule()  # refuses a bad probe_every / probe_steps
    if (t.probe_every is not None or t.probe_steps is not None) and not t.probes:
        raise bad("task.probe_every/task.probe_steps", (t.probe_every, t.probe_steps),
                  "schedules task.probes, which is empty: list them, e.g. "
                  "'task.probes=[io_jacobian,branch_ratio]'")


def _check_tracking(t: Any) -> None:
    problem = experiment_name_problem(t.experiment)
    if problem:
        raise bad("tracking.experiment", t.experiment, problem)
    if t.run_name is not None and not (str(t.run_name).strip() and str(t.run_name).isprintable()):
        raise bad("tracking.run_name", t.run_name, "must be a non-empty name on one line, without "
                  "control characters (or null)")
    for key in t.tags:
        problem = user_tag_problem(str(key))
        if problem:
            raise bad(f"tracking.tags.{key}", t.tags[key], problem)
    for key, low in (("http_retries", 0), ("http_timeout_s", 1), ("http_backoff", 0),
                     ("heartbeat_s", 1), ("stale_after_s", 1)):
        _integer(f"tracking.{key}", getattr(t, key), low)
    if t.stale_after_s < 2 * t.heartbeat_s:
        raise bad("tracking.stale_after_s", t.stale_after_s,
                  f"must be at least twice tracking.heartbeat_s={t.heartbeat_s}")


def check_family(s: RankexpConfig) -> None:
    """A config against its model family and its probes: each probe accepts the task and the
    family; the family accepts the task; the family's own rules; no setting only
    ``model=plain`` has (σ_b, orthogonal init, batchnorm) under another family.

    Raises:
        ConfigError: the first rule broken, naming key, value and what is allowed.
    """
    fam, task, probes = family_of(s), s.task.name, list(s.task.probes)
    for p in probes:
        if task not in PROBES[p].tasks:
            raise bad("task.probes", p, "measures a trained network: use it with task=train"
                      if PROBES[p].tasks == frozenset({"train"}) else
                      f"runs with task={'|'.join(sorted(PROBES[p].tasks))}")
    if task not in fam.tasks:
        raise bad("task", task, f"model={fam.name} runs {', '.join('task=' + t for t in fam.tasks)} "
                  f"only; it does not {task if task in ('train', 'measure') else 'run task=' + task}")
    foreign = [p for p in probes if fam.name not in PROBES[p].families]
    if foreign:
        needs = sorted({f for p in foreign for f in PROBES[p].families})
        own = [p for p in fam.probes if task in PROBES[p].tasks]
        raise bad("task.probes", foreign, f"not probes of model={fam.name}: they need "
                  f"model={'|'.join(needs)}; model={fam.name} runs {', '.join(fam.probes)} "
                  f"(task={task}: task.probes=[{','.join(own)}])")
    if fam.name == "cifar_resnet" and (s.depth < 8 or (s.depth - 2) % 6):
        raise bad("depth", s.depth, "model=cifar_resnet needs depth = 6n+2, n ≥ 1 (He et al.: "
                  "20, 32, 44, 56, 110; smoke: 8)")
    if fam.name == "gpt2":
        _check_gpt2(s)
    if fam.name == "plain":
        _check_plain(s, probes)
    else:
        _refuse_plain_only(s)


def _check_gpt2(s: RankexpConfig) -> None:
    m = s.model
    if m.pretrained:
        if s.seeds != 1:
            raise bad("seeds", s.seeds, "pretrained weights are one network: use seeds=1")
        shape = checkpoint_shape(m.pretrained)
        if shape and (shape.get("n_embd"), shape.get("n_layer")) != (s.width, s.depth):
            raise bad("width/depth", (s.width, s.depth),
                      f"model.pretrained={m.pretrained!r} has d = {shape.get('n_embd')}, "
                      f"L = {shape.get('n_layer')} (leave width/depth unset)")
    elif m.n_head is not None and s.width % m.n_head:
        raise bad("model.n_head", m.n_head, f"must divide width={s.width}")


def _check_plain(s: RankexpConfig, probes: list[str]) -> None:
    """Its norm is N before φ (``norm=none|pre``, slots from the preset), one matrix per layer
    (no gated unit), and a batchnorm needs a batch (no probe of one input per seed)."""
    placement, op = s.norm.placement.value, s.norm.op.value
    if placement not in ("none", "pre"):
        raise bad("norm", placement, "model=plain supports norm=none or norm=pre (N before φ)")
    if s.activation.value == "swiglu":
        raise bad("activation", "swiglu", "model=plain has one matrix per layer; "
                  "the gated unit needs model=mlp matrices=2")
    for slot in ("pre", "out", "post"):
        got = getattr(s.norm, slot).value
        if got != _preset_slot(slot, placement, op):
            raise bad(f"norm.{slot}", got, "model=plain takes its norm from norm= and "
                      "norm.op (the slots P, B, R of Eq. 17 are model=mlp's)")
    single = [p for p in probes if PROBES[p].inputs == "one"]
    if op == "batchnorm" and placement == "pre" and single:
        raise bad("task.probes", single, "these differentiate one input per seed and a "
                  "batchnorm needs a batch; use correlation, gradient_norms, shattered")


def _refuse_plain_only(s: RankexpConfig) -> None:
    """The settings only a plain net has, where ``s`` uses them: σ_b, orthogonal init, batchnorm."""
    if s.bias != 0:
        raise bad("bias", s.bias, "biases (σ_b) exist only in model=plain (add model=plain)")
    if s.init.value != "gaussian":
        raise bad("init", s.init.value, "orthogonal weights exist only in model=plain "
                  "(add model=plain)")
    if s.norm.op.value == "batchnorm":
        raise bad("norm.op", "batchnorm", "batch normalization exists only in model=plain "
                  "(add model=plain norm=pre)")
    for slot in ("pre", "out", "post"):
        if getattr(s.norm, slot).value == "batchnorm":
            raise bad(f"norm.{slot}", "batchnorm", "batch normalization exists only in "
                      "model=plain (add model=plain norm=pre norm.op=batchnorm)")


#: a Hugging Face hub id: ``name`` or ``org/name`` (letters, digits, ``-``, ``_``, ``.``)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def check_pretrained(pretrained: str) -> None:
    """``model.pretrained`` names a local checkpoint directory (with its ``config.json``) or a
    hub id (``gpt2``, ``openai-community/gpt2-medium``); anything else is refused before any run.

    Raises:
        ConfigError: the value, what was found there and what belongs there.
    """
    path = Path(pretrained).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise bad("model.pretrained", pretrained, f"{path} holds no config.json: a local "
                      "checkpoint is a directory written by save_pretrained")
        return
    if path.exists():
        raise bad("model.pretrained", pretrained, f"{path} is a file; a local checkpoint is a "
                  "directory written by save_pretrained (config.json + weights)")
    looks_like_path = pretrained.startswith(("/", ".", "~")) or "\\" in pretrained
    if looks_like_path or not _HUB_ID.fullmatch(pretrained) or ".." in pretrained:
        raise bad("model.pretrained", pretrained, f"no such directory ({path.absolute()}); give "
                  "a local checkpoint directory (config.json + weights) or a hub id such as "
                  "gpt2 or openai-community/gpt2-medium")


def check_fits(s: RankexpConfig) -> None:
    """Refuse a measurement whose single seed cannot fit the device's whole memory
    (:func:`rankexp.memory.seed_bytes`), and a training run whose learning rates, probed at
    once during training (:func:`rankexp.memory.probe_bytes`), cannot.

    Raises:
        ConfigError: the estimate, what it is made of and the limit.
    """
    gb = memory.gigabytes
    if not family_of(s).checks_fit:
        return
    if isinstance(s.task, TrainTask) and s.task.probe_schedule():
        members = 1 if s.lr is not None else len(s.task.lrs)
        need, (total, what) = memory.probe_bytes(s, members), memory.total_memory_bytes(s.device)
        if need > total:
            raise ConfigError(
                f"invalid config: the probes of task.probe_every/probe_steps need ≈ {gb(need)} "
                f"at each probed step ({members} learning rates × {gb(need / members)}; "
                f"estimate), more than {what} has: {gb(total)} — fewer learning rates, "
                "smaller width/depth, or lighter task.probes")
        return
    if not isinstance(s.task, MeasureTask):
        return
    need, (total, what) = memory.seed_bytes(s), memory.total_memory_bytes(s.device)
    if need > total:
        weights = memory.weight_bytes(s, streamed=memory.streams_weights(s))
        raise ConfigError(
            f"invalid config: one seed of this measurement needs ≈ {gb(need)} (weights "
            f"{gb(weights)} + the largest probe working set; estimate), more than "
            f"{what} has: {gb(total)} — make width/depth/expansion smaller or use a device "
            "with more memory (seeds already run one at a time when they must)")


def _unknown(key: str, where: str, allowed: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], allowed, n=1, cutoff=0.6)
    hint = f"did you mean '{where}{close[0]}'? " if close else ""
    return ConfigError(
        f"invalid config: unknown key '{where}{key.rsplit('.', 1)[-1]}' — {hint}"
        f"keys{' under ' + where.rstrip('.') if where else ''}: {', '.join(sorted(allowed))}"
    )


def _parse(overrides: Sequence[str]) -> list | None:
    """Hydra's parse of command-line overrides; None on a syntax error (Hydra reports it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None


def check_override_keys(overrides: Sequence[str], groups: Sequence[str]) -> None:
    """Refuse a command-line key that no config of the schema has (``deph=4``, ``+deph=4``,
    ``task.stepz=5``; Hydra would advise ``+deph=4``), before Hydra composes anything, with a
    did-you-mean suggestion.  Group choices, ``hydra.*`` and keys under dict fields pass.

    Raises:
        ConfigError: the first unknown key, naming the allowed ones.
    """
    parsed = _parse(overrides)
    if parsed is None:
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
            if node is FREE:
                break
            if node is None:  # below a leaf
                raise ConfigError(f"invalid config: '{'.'.join(parts[:depth])}' is a value, "
                                  f"it has no key '{part}' (override {o.input_line!r})")
            kids = children(node, root=depth == 0)
            if part not in kids and not (depth == 0 and part in groups):
                raise _unknown(part, "".join(p + "." for p in parts[:depth]), list(kids))
            node = kids.get(part, FREE)


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
    """Refuse keys the schema does not have anywhere in the composed ``cfg`` (``+deph=4``);
    dict fields (``task.options``) are free-form, the ``hydra`` node is Hydra's.

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
    """A named CUDA device must exist here (no torch import where no NVIDIA driver is).

    Raises:
        ConfigError: a CUDA device on a machine without one (before any run exists).
    """
    if not name.startswith("cuda"):
        return
    index = int(name[5:]) if name.startswith("cuda:") else 0
    present = False
    if memory.cuda_possible():
        import torch

        present = torch.cuda.is_available() and index < torch.cuda.device_count()
    if not present:
        raise ConfigError(f"invalid config: device={name!r} — this machine has no such CUDA device "
                          "(use device=auto or device=cpu)")


def check_paths(s: RankexpConfig) -> None:
    """Inputs a task reads must exist before its run does: ``model.pretrained``, and for
    ``task=train`` a CIFAR-10 source at ``data.root`` (unless ``data.download=true`` may fetch
    it) and a ``task.checkpoint_dir`` that is no file.

    Raises:
        ConfigError: the path, where it was looked for, and what belongs there.
    """
    if s.model.name == "gpt2" and s.model.pretrained:
        check_pretrained(s.model.pretrained)
    if not isinstance(s.task, TrainTask):
        return
    ckpt = cache_path(s.task.checkpoint_dir)
    if ckpt.exists() and not ckpt.is_dir():
        raise bad("task.checkpoint_dir", s.task.checkpoint_dir,
                  f"{ckpt} is a file; checkpoints need a folder (created if missing)")
    if s.data.download and s.data.source in ("auto", "torchvision"):
        return
    root = resolve_path(s.data.root)
    if not root.exists():
        raise ConfigError(
            f"invalid config: data.root={s.data.root!r} — no such file or directory ({root}); "
            "point it at CIFAR-10: the folder holding cifar10-jpeg.tar.gz (default ../shared/data, "
            "or set $RANKEXP_DATA), an image-folder tree, or torchvision's cifar-10-batches-py "
            "(data.download=true fetches that where there is internet)"
        )
    try:
        locate_cifar10(root, s.data.source, s.data.download)
    except MissingDataError as e:
        raise ConfigError(f"invalid config: data.root={s.data.root!r} — {e}") from None


#: tracking options a job with the store off still uses: its run.json records the experiment
#: and whether arrays are logged, for ``python -m rankexp.sync --uri`` to log it later
_OFF_STORE_KEYS = ("", "enabled", "experiment", "log_arrays")


def check_used_overrides(overrides: Sequence[str], s: RankexpConfig) -> None:
    """Refuse a command-line override that the job would not use: ``lr=`` with
    ``task=measure``, and a store's ``tracking.*`` options when the store is off (but
    ``tracking.experiment`` and ``log_arrays``: a later ``rankexp.sync --uri`` reads them).

    Raises:
        ConfigError: the override and why it is not used.
    """
    parsed = _parse(overrides)
    if parsed is None:
        return
    for o in parsed:
        key = o.key_or_group.lstrip("+~")
        if o.is_hydra_override() or "." not in key and key in ("task", "tracking", "model"):
            continue
        top, _, sub = key.partition(".")
        if top == "lr" and s.task.name == "measure":
            raise ConfigError(f"invalid config: {o.input_line} — not used: task=measure does not "
                              "train (lr is task=train's learning rate)")
        if top == "tracking" and sub not in _OFF_STORE_KEYS and not s.tracking.enabled:
            raise ConfigError(f"invalid config: {o.input_line} — not used: the store is off "
                              "(tracking=off / tracking.enabled=false); drop it, or log to a "
                              "store (tracking=default, tracking=server)")


def check_options_used(settings: Sequence[RankexpConfig]) -> None:
    """Refuse ``task.options`` given for a probe that no job of a run or sweep runs (a sweep
    unions grids: an option for the probes of some of them is used).

    Raises:
        ConfigError: the first such probe, with its options.
    """
    ran = {p for s in settings for p in s.task.probes}
    for s in settings:
        for p, given in given_options(s.task.options).items():
            if p not in ran:
                values = " ".join(f"task.options.{p}.{k}={v}" for k, v in given.items())
                raise ConfigError(f"invalid config: {values} — not used: no job runs the probe "
                                  f"{p} (add it to task.probes, or drop the option)")


def check_job(cfg: DictConfig, *, device: bool = True,
              overrides: Sequence[str] | None = None) -> RankexpConfig:
    """Everything that can be known about one job before its run exists: keys, values, input
    paths, used overrides and (``device``: jobs that run here) the device and its memory.

    Raises:
        ConfigError: one message naming key, value or path and what is allowed.
    """
    check_keys(cfg)
    s = validate(cfg)
    check_paths(s)
    if overrides:
        check_used_overrides(overrides, s)
    if device:
        check_device(s.device)
        check_fits(s)
    return s


@dataclass(frozen=True)
class CheckedJob:
    """A job checked before it runs: its typed config, its resolved config (plain Python, no
    ``hydra`` node), its config hash (:func:`config_hash`) and the hash runs logged before
    the paths and cadences left it carry (``legacy``: resume finds those too)."""

    settings: RankexpConfig
    container: dict[str, Any]
    config_hash: str
    legacy_hash: str


#: jobs of this process's sweep the sweeper checked, by override list (:func:`checked_job`)
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
        keep_environment_text(task, s, container)
    return CheckedJob(s, container, config_hash(container), config_hash(container, legacy=True))


def keep_environment_text(task: DictConfig, s: RankexpConfig, container: dict[str, Any]) -> None:
    """Tracking's free text (note, description, tags) that reads the environment
    (``${oc.env:SECRET}``) stays as typed in the settings and resolved config, so in every run,
    tag and file: a secret there never leaves the environment."""
    if "tracking" not in task:
        return
    raw, t = OmegaConf.to_container(task.tracking, resolve=False), container["tracking"]
    for key in ("note", "description"):
        if "oc.env:" in str(raw.get(key)):
            setattr(s.tracking, key, raw[key])
            t[key] = raw[key]
    for key, value in (raw.get("tags") or {}).items():
        if "oc.env:" in str(value):
            s.tracking.tags[key] = t["tags"][key] = value


def checked_job(cfg: DictConfig, overrides: Sequence[str] | None = None) -> CheckedJob:
    """The sweeper's check of this job when it ran in this process (``overrides``: the job's
    ``hydra.overrides.task``), else the job's own check — each job is checked once.

    Raises:
        ConfigError: as :func:`check_job`.
    """
    done = CHECKED_JOBS.pop(tuple(overrides), None) if overrides is not None else None
    return done if done is not None else check_task(cfg, overrides=overrides)


def check_slurm_limits(launcher: DictConfig) -> None:
    """A Slurm launcher's values are one line each (an ``#SBATCH`` line or the ``srun`` command;
    ``setup`` is shell lines) and its warning signal comes before its time limit.

    Raises:
        ConfigError: a line break in a value (the rest of the line would run as a command of
            the batch script), ``signal_delay_s`` ≥ the limit (the job warned at its start).
    """
    for key, v in flatten(OmegaConf.to_container(launcher, resolve=True)).items():
        values = v if isinstance(v, list) else [v]
        if key != "setup" and any(isinstance(x, str) and ("\n" in x or "\r" in x) for x in values):
            raise ConfigError(f"invalid config: hydra.launcher.{key}={v!r} — a line break "
                              "ends its line of the batch script (the rest would run as a "
                              "command); give it on one line")
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
