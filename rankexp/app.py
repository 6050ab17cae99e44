"""One Hydra job: validate → (skip if already finished) → run the task → save → log.

Data flow (design.md §3): the composed config is validated before anything
else, so a bad value never creates an MLflow run; the task returns a plain
:class:`~rankexp.measure.Measurement`; the result is written to the Hydra job
directory first (a tracking outage loses nothing) and then logged to MLflow by
:mod:`rankexp.tracking`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .config import ConfigError, RankexpConfig, config_hash, flatten, resolved_container, validate
from .measure import Measurement, run_probes
from .model import ResidualMLP, effective_beta

log = logging.getLogger("rankexp")

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; otherwise the named device.

    Raises:
        ConfigError: a CUDA device on a machine without one (before any run exists).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not (torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()):
        raise ConfigError(f"invalid config: device={name!r} — this machine has no such CUDA device "
                          "(use device=auto or device=cpu)")
    return dev


def build_model(s: RankexpConfig, device: torch.device | str = "cpu") -> ResidualMLP:
    """The :class:`ResidualMLP` a validated config describes, members = seeds ``seed … seed+seeds−1``."""
    return ResidualMLP(
        s.width,
        s.depth,
        expansion=s.expansion,
        matrices=s.matrices,
        activation=s.activation.value,
        placement=s.norm.placement.value,
        norm_op=s.norm.op.value,
        alpha=s.alpha,
        beta=s.beta,
        beta_scaling=s.beta_scaling.value,
        skip_every=s.skip_every,
        seeds=range(s.seed, s.seed + s.seeds),
        dtype=DTYPES[s.dtype.value],
        device=device,
    )


def derived_params(s: RankexpConfig) -> dict[str, float]:
    """``beta_eff`` (depth-scaled β), ``nominal_ratio`` βα^M (Eq. 21) and ``depth_factor`` βα^M√L."""
    beta = effective_beta(s.beta, s.depth, s.beta_scaling.value)
    ratio = beta * s.alpha**s.matrices
    return {"beta_eff": beta, "nominal_ratio": ratio, "depth_factor": ratio * s.depth**0.5}


def run_name(s: RankexpConfig) -> str:
    """Short readable run name, e.g. ``post·α1·β1·L48·d256``."""
    beta = f"{s.beta:g}" + {"const": "", "inv_sqrt_depth": "/√L", "inv_depth": "/L"}[s.beta_scaling.value]
    name = f"{s.norm.placement.value}·α{s.alpha:g}·β{beta}·L{s.depth}·d{s.width}"
    if s.task.name == "train":
        name += "·train" if s.lr is None else f"·lr{s.lr:g}"
    return name


# --------------------------------------------------------------------------- tasks
def task_measure(s: RankexpConfig, device: torch.device, job_dir: Path, run: Any, chash: str) -> Measurement:
    """``task=measure``: build the seeds-batched network and run ``task.probes``."""
    model = build_model(s, device)
    t0 = time.perf_counter()
    result = run_probes(model, s.task.probes, options=s.task.options,
                        progress=lambda p: log.info("probe %s", p))
    result.scalars["measure_seconds"] = time.perf_counter() - t0
    return result


REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve_path(path: str) -> Path:
    """An input path: relative ones from the launch directory if they exist there, else
    from the repository root (so ``../shared/data`` works from anywhere in a checkout)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    repo = REPO_ROOT / p
    return repo if repo.exists() else p


def cache_path(path: str) -> Path:
    """A cache path: relative ones live under the repository root, wherever the job was
    launched, so every job of a checkout shares one decoded data set and one checkpoint
    folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def _lr_key(lr: float) -> str:
    return f"lr{lr:g}"


def task_train(s: RankexpConfig, device: torch.device, job_dir: Path, run: Any, chash: str) -> Measurement:
    """``task=train``: CIFAR-10, Adam, every learning rate of ``task.lrs`` (or ``lr``) as one
    batched model whose residual stack is initialized exactly as ``measure`` analyses it.

    Live metrics (step = optimizer step): ``train_loss_lr<lr>`` every ``task.log_every``
    steps, ``test_acc_lr<lr>`` every ``task.eval_every``.  Final scalars:
    ``best_test_accuracy`` and ``best_lr`` (over learning rates, final test accuracy),
    ``max_stable_lr`` (largest LR with test accuracy ≥ ``task.stable_accuracy``; NaN if
    none), per-LR ``final_test_acc_lr<lr>``, ``final_train_loss_lr<lr>``, ``diverged_lr<lr>``.
    """
    from .data import load_device_dataset
    from .train import Classifier, train

    t = s.task
    lrs = [s.lr] if s.lr is not None else [float(x) for x in t.lrs]
    dtype = DTYPES[t.dtype.value]
    data = load_device_dataset(resolve_path(s.data.root), cache_path(s.data.cache_dir), device=device,
                               dtype=dtype, source=s.data.source, download=s.data.download)
    stack = ResidualMLP(
        s.width, s.depth, expansion=s.expansion, matrices=s.matrices, activation=s.activation.value,
        placement=s.norm.placement.value, norm_op=s.norm.op.value, alpha=s.alpha, beta=s.beta,
        beta_scaling=s.beta_scaling.value, skip_every=s.skip_every, seeds=[s.seed] * len(lrs),
        dtype=dtype, device=device,
    )
    ckpt_dir = cache_path(t.checkpoint_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = ckpt_dir / f"{chash}.pt"  # same config → same file, whichever sweep reruns it
    if s.tracking.force and checkpoint.exists():
        log.info("tracking.force=true: discarding checkpoint %s, training from scratch", checkpoint)
        checkpoint.unlink()
    first_live: list[int] = []

    def on_log(step: int, metrics: dict[str, np.ndarray]) -> None:
        if run is None:
            return
        first_live.append(step)
        series = {f"{name}_{_lr_key(lr)}": ([step], [v]) for name, values in metrics.items()
                  for lr, v in zip(lrs, values, strict=True)}
        run.log_metrics({}, series)

    res = train(Classifier(stack), data, lrs, steps=t.steps, batch_size=t.batch_size,
                eval_every=t.eval_every, seed=s.seed, checkpoint_path=checkpoint,
                checkpoint_every=t.checkpoint_every, log_every=t.log_every, on_log=on_log,
                stable_accuracy=t.stable_accuracy, autocast_bf16=t.bf16, compile=t.compile)
    out = Measurement()
    out.scalars.update(best_test_accuracy=res.best_acc, best_lr=res.best_lr or float("nan"),
                       max_stable_lr=res.max_stable_lr or float("nan"), steps_per_s=res.steps_per_s,
                       train_seconds=res.wall_time_s, steps=res.steps)
    for i, lr in enumerate(lrs):
        k = _lr_key(lr)
        out.scalars[f"final_test_acc_{k}"] = float(res.final_test_acc[i])
        out.scalars[f"best_test_acc_{k}"] = float(res.best_test_acc[i])
        out.scalars[f"final_train_loss_{k}"] = float(res.final_train_loss[i])
        out.scalars[f"diverged_{k}"] = float(res.diverged[i])
    # points from before a resume were logged by the interrupted run: backfill them here
    resumed_before = first_live[0] if first_live else res.steps + 1
    if run is not None:
        back = {}
        early = res.eval_steps < resumed_before
        for i, lr in enumerate(lrs):
            back[f"test_acc_{_lr_key(lr)}"] = (res.eval_steps[early], res.test_acc[early, i])
            ends = np.arange(t.log_every, min(resumed_before, res.steps + 1), t.log_every)
            means = [float(res.loss[e - t.log_every:e, i].mean()) for e in ends]
            back[f"train_loss_{_lr_key(lr)}"] = (ends, np.array(means))
        run.log_metrics({}, back)
    out.arrays.update(lrs=np.array(lrs), loss=res.loss, eval_steps=res.eval_steps, test_acc=res.test_acc)
    return out


#: task name → ``fn(settings, device, job_dir, run_logger_or_None, config_hash) -> Measurement``
TASKS: dict[str, Callable[..., Measurement]] = {
    "measure": task_measure,
    "train": task_train,
}


# --------------------------------------------------------------------------- results on disk
def save_result(job_dir: Path, result: Measurement, extra: dict[str, Any]) -> list[Path]:
    """Write ``result.json`` (scalars, series) and ``arrays.npz`` into the job directory."""
    job_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        **extra,
        "scalars": result.scalars,
        "series": {k: {"steps": np.asarray(st).tolist(), "values": np.asarray(v).tolist()}
                   for k, (st, v) in result.series.items()},
    }
    files = [job_dir / "result.json"]
    files[0].write_text(json.dumps(doc, indent=1, default=float))
    if result.arrays:
        files.append(job_dir / "arrays.npz")
        np.savez_compressed(files[-1], **result.arrays)
    return files


def _job_context() -> tuple[Path, Path | None, str]:
    """(job dir, sweep dir or None, override string) of the running Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return Path.cwd(), None, ""
    hc = HydraConfig.get()
    sweep = Path(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
    return Path(hc.runtime.output_dir), sweep, " ".join(hc.overrides.task)


# --------------------------------------------------------------------------- the job
FAULT_ENV = "RANKEXP_FAULT_KILL"


def _fault_injection(overrides: str) -> None:
    """Failure-handling tests: if ``$RANKEXP_FAULT_KILL`` names one of this job's overrides
    (e.g. ``alpha=2``), the job SIGKILLs itself right after its MLflow run exists — the way
    an OOM killer or a Slurm preemption ends a job, with no chance to report."""
    target = os.environ.get(FAULT_ENV)
    if target and target in overrides.split():
        log.warning("%s=%s: killing this job (pid %d)", FAULT_ENV, target, os.getpid())
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run one job end to end; returns ``{"status", "run_id", "scalars"}``.

    Raises:
        ConfigError: invalid config (before any run exists).
        Exception: whatever the task raised; the MLflow run is then FAILED.
    """
    s = validate(cfg)
    container = resolved_container(cfg)
    chash = config_hash(container)
    job_dir, sweep_dir, overrides = _job_context()
    device = resolve_device(s.device)

    uri = exp_id = None
    tags = {
        "config_hash": chash,
        "git_commit": tracking.git_commit(),
        "overrides": overrides,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "task": s.task.name,
        "job_dir": str(job_dir),
    }
    if s.tracking.enabled:
        parent = tracking.read_parent(sweep_dir) if sweep_dir else None
        if parent and parent["uri"] == tracking.resolve_uri(s.tracking.uri):
            uri, exp_id = parent["uri"], parent["experiment_id"]
            tags["mlflow.parentRunId"] = parent["run_id"]
            tags["sweep_id"] = parent["sweep_id"]
        else:
            uri = tracking.resolve_uri(s.tracking.uri)
            exp_id = tracking.prepare_experiment(uri, s.tracking.experiment)
            tags["sweep_id"] = str(sweep_dir) if sweep_dir else ""
        if s.tracking.resume and not s.tracking.force:
            done = tracking.find_finished(uri, exp_id, chash)
            if done:
                log.info("skipping: this config (hash %s) already FINISHED as run %s "
                         "(tracking.force=true reruns it)", chash, done)
                tracking.write_status(job_dir, "SKIPPED", run_id=done, config_hash=chash)
                return {"status": "SKIPPED", "run_id": done, "scalars": {}}

    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(container)))
    params = {**flatten(container), **derived_params(s)}
    task = TASKS[s.task.name]
    try:
        if uri is None:
            result = task(s, device, job_dir, None, chash)
            save_result(job_dir, result, {"config_hash": chash, "status": "FINISHED"})
            run_id = None
        else:
            with tracking.RunLogger(uri, exp_id, run_name(s), params, tags) as logger:
                run_id = logger.run_id
                _fault_injection(overrides)
                result = task(s, device, job_dir, logger, chash)
                files = save_result(job_dir, result, {"config_hash": chash, "run_id": run_id,
                                                      "status": "FINISHED"})
                logger.log_metrics(result.scalars, result.series)
                artifacts = [job_dir / "config.yaml"] + files
                logger.log_artifacts(artifacts if s.tracking.log_arrays else artifacts[:2])
    except BaseException as e:
        tracking.write_status(job_dir, "FAILED", error=f"{type(e).__name__}: {e}", config_hash=chash)
        raise
    tracking.write_status(job_dir, "FINISHED", run_id=run_id, config_hash=chash)
    headline = {k: result.scalars[k] for k in ("erank_io", "stable_rank_io", "best_test_accuracy")
                if k in result.scalars}
    log.info("%s finished%s: %s", run_name(s), f" (run {run_id})" if run_id else "",
             ", ".join(f"{k}={v:.4g}" for k, v in headline.items()))
    return {"status": "FINISHED", "run_id": run_id, "scalars": result.scalars}
