"""One Hydra job: validate → (skip if already finished) → run the task → save → log.

Data flow (design.md §3): the composed config is validated before anything
else, so a bad value never creates an MLflow run; the task returns a plain
:class:`~rankexp.result.Measurement`; the result is written to the Hydra job
directory first (a tracking outage loses nothing) and then logged to MLflow by
:mod:`rankexp.tracking`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .config import ConfigError, RankexpConfig, config_hash, flatten, resolved_container, validate
from .models.mlp import effective_beta
from .result import Measurement
from .tasks import TASKS

log = logging.getLogger("rankexp")

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


def derived_params(s: RankexpConfig) -> dict[str, float]:
    """``beta_eff`` (depth-scaled β), ``nominal_ratio`` βα^M (Eq. 21; M = 1 for ``model=plain``,
    one matrix per layer) and ``depth_factor`` βα^M√L."""
    beta = effective_beta(s.beta, s.depth, s.beta_scaling.value)
    ratio = beta * s.alpha ** (1 if s.model.name == "plain" else s.matrices)
    return {"beta_eff": beta, "nominal_ratio": ratio, "depth_factor": ratio * s.depth**0.5}


def run_name(s: RankexpConfig) -> str:
    """Short readable run name, e.g. ``post·α1·β1·L48·d256``; ``model=gpt2``: ``gpt2·L12·d768``
    (``<checkpoint>·L12·d768`` when pretrained); ``model=cifar_resnet``: ``resnet·L110·train``."""
    if s.model.name == "gpt2":
        source = Path(s.model.pretrained).name if s.model.pretrained else s.model.config
        return f"{source}·L{s.depth}·d{s.width}"
    if s.model.name == "cifar_resnet":
        name = f"{'resnet' if s.model.residual else 'plain'}·L{s.depth}"
        if s.model.base_width != 16:
            name += f"·w{s.model.base_width}"
        return name + ("·" + s.task.name if s.lr is None else f"·lr{s.lr:g}")
    beta = f"{s.beta:g}" + {"const": "", "inv_sqrt_depth": "/√L", "inv_depth": "/L"}[s.beta_scaling.value]
    name = f"{s.norm.placement.value}·α{s.alpha:g}·β{beta}·L{s.depth}·d{s.width}"
    if s.task.name == "train":
        name += "·train" if s.lr is None else f"·lr{s.lr:g}"
    return name


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
    # (βα^M and friends describe the MLP; a ConvNet has no β or α)
    derived = derived_params(s) if s.model.name != "cifar_resnet" else {}
    params = {**flatten(container), **derived}
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
