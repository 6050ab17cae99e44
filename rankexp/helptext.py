"""``rankexp --help``: the sections of the app help built from the code (conf/hydra/help/rankexp.yaml).

The help template is YAML; what would go stale there comes from its source of truth through the
resolver ``rankexp_help``: the probes, their needs and options from
:data:`rankexp.probes.PROBES`, the config groups a user chooses from the folders of ``conf/``
(not the schema nodes of the ConfigStore, not the per-experiment ``size/<experiment>/`` files).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

#: config groups a user picks, in the order the help lists them, with what they choose
GROUPS = {
    "experiment": "a figure's sweep (run with -m); header comment = what it shows",
    "size": "an experiment's size: smoke (seconds), cpu (every figure on 2 cores), full (the study's)",
    "model": "the network family",
    "norm": "where the norm sits (P, B, R of Eq. 17); norm.op=rmsnorm|layernorm|detached|meansub",
    "task": "what a job does",
    "tracking": "where runs are logged (MLflow)",
    "data": "the training data",
    "hydra/launcher": "how jobs run: in this process (basic), joblib (local), Slurm",
    "hydra/sweeper": "rankexp (whole-sweep check, parent run) or Hydra's basic",
}
HYDRA_CHOICES = {"hydra/launcher": ["basic", "local", "slurm", "slurm_gpu"],
                 "hydra/sweeper": ["rankexp", "basic"]}


#: the knobs ``--help`` lists, with what they mean (their values come from the composed config)
KNOBS = {
    "depth": "L, number of blocks",
    "width": "d, residual stream width",
    "expansion": "m/d of the two-matrix branch W_down σ(W_up x)",
    "matrices": "M: 1 → σ(W x), 2 → W_down σ(W_up x)",
    "alpha": "α: weights ~ N(0, α²/fan_in) (σ_w with model=plain)",
    "beta": "β, branch scale",
    "beta_scaling": "const | inv_sqrt_depth (β/√L) | inv_depth (β/L)",
    "activation": "relu gelu silu abs tanh linear leaky_relu swiglu",
    "skip_every": "identity skip every k blocks; 0 = plain MLP (Figure 1)",
    "bias": "σ_b: biases ~ N(0, σ_b²) (model=plain only)",
    "init": "gaussian | orthogonal (model=plain only)",
    "seeds": "independent seeds (weights + input), batched",
    "seed": "first seed; members use seed, seed+1, …",
    "device": "auto (CUDA when present) | cpu | cuda | cuda:N",
    "dtype": "float64 | float32: the measurement's precision",
    "lr": "task=train: one learning rate instead of task.lrs",
    "norm.placement": "pre | post | output | peri | none (the norm= preset)",
    "norm.op": "rmsnorm | layernorm | detached | meansub (batchnorm: model=plain)",
    "norm.pre": "P of Eq. 17 (an op or none; default: the preset's)",
    "norm.out": "B of Eq. 17",
    "norm.post": "R of Eq. 17",
    "task.probes": "what task=measure runs (below)",
    "tracking.uri": "MLflow store (null: $$MLFLOW_TRACKING_URI, else ./mlflow.db)",
    "tracking.experiment": "MLflow experiment the runs go to",
    "tracking.force": "rerun configs that already FINISHED (a rerun skips them)",
}
#: size choices in the order they grow
SIZES = ["smoke", "cpu", "full"]


def _choices(group: str) -> list[str]:
    if group in HYDRA_CHOICES:
        return HYDRA_CHOICES[group]
    if group == "size":
        return SIZES
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def knobs(root) -> str:
    """One line per knob: ``key=value`` as composed (the default unless overridden) and its
    meaning."""
    from omegaconf import OmegaConf

    width = max(len(k) for k in KNOBS) + 12
    lines = []
    for key, meaning in KNOBS.items():
        v = OmegaConf.select(root, key, throw_on_resolution_failure=False)
        v = OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
        shown = f"{key}={_value(getattr(v, 'value', v))}"
        lines.append(f"  {shown:<{width}} {meaning}" if len(shown) < width
                     else f"  {shown}\n  {'':<{width}} {meaning}")
    return "\n".join(lines)


def groups() -> str:
    """One line per config group: its choices and what it picks."""
    lines = []
    for g, what in GROUPS.items():
        lines += textwrap.wrap(f"{g}: {', '.join(_choices(g))}", 94, initial_indent="  ",
                               subsequent_indent="      ")
        lines.append(f"      {what}")
    return "\n".join(lines)


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return "null" if v is None else str(v).replace(" ", "").replace("'", "")


def probes() -> str:
    """One entry per probe: its name (★ = default), summary, what it computes, its options."""
    from .probes import DEFAULT_PROBES, PROBES

    lines = []
    for name, p in PROBES.items():
        doc = p.doc.replace("``", "")  # read from the source: --help imports no probe code
        star = "*" if name in DEFAULT_PROBES else " "
        lines.append(f" {star}{name}")
        lines += textwrap.wrap(doc, 92, initial_indent="      ", subsequent_indent="      ")
        extra = []
        if p.needs:
            extra.append("needs " + ", ".join(sorted(p.needs)))
        if p.options:
            extra.append("options " + " ".join(f"{k}={_value(v)}" for k, v in p.options.items()))
        if extra:
            lines += textwrap.wrap("; ".join(extra), 92, initial_indent="      ",
                                   subsequent_indent="        ")
    return "\n".join(lines)


def section(name: str, *, _root_) -> str:
    """Resolver ``rankexp_help:<name>``: the text of a help section (``knobs``, ``groups``,
    ``probes``)."""
    return knobs(_root_) if name == "knobs" else {"groups": groups, "probes": probes}[name]()
