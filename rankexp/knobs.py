"""The knob table: each config knob once — its key, default, run-name symbol, TeX label and help
(the schema's defaults, ``--help``, run names and figure labels read it) — and the one error a
refused value raises (:class:`ConfigError`).  Imports nothing (no torch, mlflow or Hydra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the value of a norm slot's default: the placement preset decides (``${rankexp_norm_slot:…}``)
PRESET = "preset"
#: images per split of CIFAR-10 (train, test): bounds ``task.batch_size`` and an epoch
CIFAR10_COUNTS = (50_000, 10_000)


class ConfigError(ValueError):
    """A config value outside what rankexp allows; the message names key, value and rule."""


def bad(key: str, value: Any, rule: str) -> ConfigError:
    """``invalid config: <key>=<value> — <rule>``: the one-line form of a refused value."""
    return ConfigError(f"invalid config: {key}={value!r} — {rule}")


@dataclass(frozen=True)
class Knob:
    """One config knob.

    Attributes:
        key: the dotted config key (``norm.op``).  default: as written on a command line.
        help: one line of plain text (``--help``).
        symbol: run-name label prefix of a swept axis (``L`` → ``L48``); ``""``: the value alone
            (``post``); ``None``: ``<last key part>=<value>`` (``steps=300``).
        tex: the figure label (mathtext), or None: the key, readable.
        task: the task that reads it, None: every task.
    """

    key: str
    default: Any
    help: str
    symbol: str | None = None
    tex: str | None = None
    task: str | None = None


KNOBS: tuple[Knob, ...] = (
    # --------------------------------------------------------------- the architecture
    Knob("depth", 48, "L, number of blocks", "L", r"$L$"),
    Knob("width", 256, "d, residual stream width", "d", r"$d$"),
    Knob("expansion", 4.0, "m/d of the two-matrix branch W_down σ(W_up x)", "m/d", r"$m/d$"),
    Knob("matrices", 2, "M: 1 → σ(W x), 2 → W_down σ(W_up x)", "M", r"$M$"),
    Knob("alpha", 1.0, "α: weights ~ N(0, α²/fan_in) (σ_w with model=plain)", "α", r"$\alpha$"),
    Knob("beta", 1.0, "β, branch scale", "β", r"$\beta$"),
    Knob("beta_scaling", "const", "const | inv_sqrt_depth (β/√L) | inv_depth (β/L)", None,
         r"$\beta$ scaling"),
    Knob("activation", "relu", "relu gelu silu abs tanh linear leaky_relu swiglu", "",
         r"$\sigma$"),
    Knob("skip_every", 1, "identity skip every k blocks; 0 = plain MLP (Figure 1)", "skip",
         "skip spacing"),
    Knob("bias", 0.0, "σ_b: biases ~ N(0, σ_b²) (model=plain only)", "σb"),
    Knob("init", "gaussian", "gaussian | orthogonal (model=plain only)", ""),
    Knob("seeds", 4, "independent seeds (weights + input), batched", "seeds", "seeds"),
    Knob("seed", 0, "first seed; members use seed, seed+1, …", "seed"),
    Knob("device", "auto", "auto (CUDA when present) | cpu | cuda | cuda:N"),
    Knob("threads", "auto", "torch threads of a job: auto (the cores it may use: its share of "
         "a parallel sweep's, else the idle ones; 1 below width 128) | N"),
    Knob("dtype", "float64", "float64 | float32: task=measure's precision (float64 keeps "
         "Post-Norm collapse exact); task=train trains in task.dtype", ""),
    Knob("lr", None, "task=train: one learning rate instead of task.lrs", "lr"),
    # --------------------------------------------------------------- the general block (Eq. 17)
    Knob("norm.placement", "pre", "pre | post | output | peri | none (the norm= preset)", "",
         "norm placement"),
    Knob("norm.op", "rmsnorm", "rmsnorm | layernorm | detached | meansub (batchnorm: model=plain)",
         "", "norm op"),
    Knob("norm.pre", PRESET, "P of Eq. 17 (an op or none; default: the preset's)", "P:"),
    Knob("norm.out", PRESET, "B of Eq. 17", "B:"),
    Knob("norm.post", PRESET, "R of Eq. 17", "R:"),
    # --------------------------------------------------------------- task=measure
    Knob("task.probes", None, "what the task runs (task=measure: the probes below; default "
         "per model family; task=train: the family's measurements of the trained network)"),
    Knob("task.max_memory_gb", 4, "task=measure: memory budget of the seeds batched in one "
         "network, GB: a fixed cap, never more than 80 % of the device's free memory "
         "(null: 80 % of the free memory, on a machine that is yours)", task="measure"),
    # --------------------------------------------------------------- task=train (CIFAR-10)
    Knob("task.steps", 5000, "optimizer steps (or task.epochs; exactly one is set)", task="train"),
    Knob("task.epochs", None, "passes over the training set instead of steps "
         "(task.steps=null task.epochs=N)", task="train"),
    Knob("task.batch_size", 256, "images per step", task="train"),
    Knob("task.lrs", [3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2], "learning rates, trained as one "
         "batched model (lr=X: one rate)", task="train"),
    Knob("task.dtype", "float32", "float32 | float64: the training precision (top-level dtype "
         "is task=measure's)", task="train"),
    Knob("task.bf16", False, "bfloat16 autocast of forward and backward (weights and optimizer "
         "stay task.dtype)", task="train"),
    Knob("task.eval_every", 500, "steps between test evaluations", task="train"),
    Knob("task.log_every", 50, "steps between train-loss reports", task="train"),
    Knob("task.checkpoint_every", 500, "steps between checkpoints (a rerun resumes)",
         task="train"),
    Knob("task.probe_every", None, "run task.probes every N optimizer steps on every learning "
         "rate (steps 0, N, 2N, …, task.steps; null: before and after training only)",
         task="train"),
    Knob("task.probe_steps", None, "run task.probes at these optimizer steps on every learning "
         "rate: a list [0,100,…] or log (0, 1, 2, 5, 10, 20, 50, … ≤ task.steps, and task.steps)",
         task="train"),
    Knob("task.checkpoint_dir", "checkpoints", "checkpoints, <config_hash>.pt (relative to "
         "$XDG_CACHE_HOME/rankexp, else ~/.cache/rankexp)", task="train"),
    Knob("task.stable_accuracy", 0.4, "a rate is stable when it does not diverge and ends at "
         "this test accuracy or more (max_stable_lr; Table 5)", task="train"),
    Knob("task.divergence_factor", 1000.0, "diverged: loss non-finite or > this × the initial "
         "loss (inf: non-finite only)", task="train"),
    Knob("task.optimizer", "adam", "adam (the study's) | sgd", task="train"),
    Knob("task.momentum", 0.9, "sgd momentum", task="train"),
    Knob("task.weight_decay", 0.0, "sgd: on conv kernels and weight matrices only", task="train"),
    Knob("task.schedule", "constant", "constant | step (× task.gamma at each task.milestones "
         "fraction)", task="train"),
    Knob("task.milestones", [0.5, 0.75], "fractions of training where a step schedule decays",
         task="train"),
    Knob("task.gamma", 0.1, "a step schedule's decay factor", task="train"),
    Knob("task.warmup_steps", 0, "steps at task.warmup_factor × the rate …", task="train"),
    Knob("task.warmup_factor", 0.1, "… the warm-up's rate factor …", task="train"),
    Knob("task.warmup_min_depth", 0, "… for networks at least this deep", task="train"),
    Knob("task.augment", "none", "none | pad_crop_flip (He et al.; on the device)", task="train"),
    Knob("task.pad", 4, "pixels padded before the random crop", task="train"),
    Knob("task.clean_train_images", 0, "> 0: unaugmented train error on that many images at the "
         "end", task="train"),
    Knob("task.compile", False, "torch.compile the forward + loss (GPU option)", task="train"),
    Knob("task.cuda_graphs", False, "replay each step as one CUDA graph (GPU only)", task="train"),
    # --------------------------------------------------------------- where runs are logged
    Knob("tracking.uri", None, "MLflow store (null: $MLFLOW_TRACKING_URI, else ./mlflow.db)"),
    Knob("tracking.experiment", "rankexp", "MLflow experiment the runs go to"),
    Knob("tracking.force", False, "rerun configs that already FINISHED (a rerun skips them)"),
)

#: key → its row
BY_KEY: dict[str, Knob] = {k.key: k for k in KNOBS}


def default(key: str) -> Any:
    """The default of knob ``key`` (a fresh copy of a list); KeyError for an unknown key."""
    value = BY_KEY[key].default
    return list(value) if isinstance(value, list) else value


def for_task(task: str | None) -> list[Knob]:
    """The knobs ``task`` reads (``None``: those every task reads)."""
    return [k for k in KNOBS if k.task == task]
