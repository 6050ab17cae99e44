"""``task=train``: config to :mod:`rankexp.tasks.loop` (re-exported) — data, network, recipe,
checkpoint, live metrics and probes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..locations import cache_path
from ..memory import probe_memory_line
from ..models import DTYPES, build_model
from ..models.classifier import NUM_CLASSES, Classifier  # noqa: F401  (re-exported)
from ..models.convnet import CifarResNet
from ..probes import INIT_PROBES
from ..result import Measurement
from ..seeding import subset_indices
from ..tracking import RESULT_DIR
from . import probing, recipes
from .data import DeviceDataset, dataset_for
from .loop import (  # noqa: F401  (re-exported: the loop's public names)
    STUDY_LRS,
    TrainResult,
    _lr_key,
    duration,
    evaluate,
    member_losses,
    progress_line,
    train,
)

if TYPE_CHECKING:
    from ..config import RankexpConfig

log = logging.getLogger(__name__)


def task_train(s: RankexpConfig, device: torch.device, job_dir: Path, run: Any, chash: str) -> Measurement:
    """``task=train``: CIFAR-10, every rate of ``task.lrs`` (or ``lr``) as one batched model; each
    rate a nested member run, the job's run the summary (``best_test_accuracy``, ``best_lr``,
    ``max_stable_lr``, finals ``<name>_lr<lr>``), probes and the dataset input."""
    t = s.task
    lrs = [s.lr] if s.lr is not None else [float(x) for x in t.lrs]
    dtype = DTYPES[t.dtype.value]
    data = dataset_for(s, device, dtype)
    if run is not None and data.source is not None:  # the UI's Dataset column
        src = data.source
        run.log_dataset("CIFAR-10", src.sha256, src.cache_file, {
            "source": f"{src.kind}: {src.path}", "train_rows": src.train_rows,
            "test_rows": src.test_rows})
    net = build_model(s, device, seeds=[s.seed] * len(lrs), dtype=dtype)
    model = net if isinstance(net, CifarResNet) else Classifier(net)
    per_epoch = data.y_train.shape[0] // t.batch_size
    if t.epochs is None:
        steps, eval_every, log_every, unit = t.steps, t.eval_every, t.log_every, 1
    else:
        steps, eval_every, log_every, unit = t.epochs * per_epoch, per_epoch, per_epoch, per_epoch
    fill = (-data.mean / data.std).to(dtype)  # black, in the normalized units
    the_recipe = recipes.recipe(t, depth=s.depth, steps=steps, batch_size=t.batch_size,
                                seed=s.seed, fill=fill, device=device)
    ckpt_dir = cache_path(t.checkpoint_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt_file = ckpt_dir / f"{chash}.pt"  # same config → same file, whichever sweep reruns it
    if s.tracking.force and ckpt_file.exists():
        log.info("tracking.force=true: discarding checkpoint %s, training from scratch", ckpt_file)
        ckpt_file.unlink()
    graphs = t.cuda_graphs and device.type == "cuda"
    if t.cuda_graphs and not graphs:
        log.warning("task.cuda_graphs=true has no effect on %s: training without CUDA graphs", device)
    out = Measurement()
    if run is not None:
        run.open_members(lrs)
    probes = _Probing(s, net, data, lrs, run, steps, device)
    probes.before(out)  # the fresh network, whether or not a checkpoint is resumed below
    first_live: list[int] = []

    def on_log(step: int, metrics: dict[str, np.ndarray]) -> None:
        if run is None:
            return
        first_live.append(step)
        if "test_acc" in metrics:
            metrics = {**metrics, "test_error": 1.0 - metrics["test_acc"]}
        run.log_member_series(step // unit, metrics)

    res = train(model, data, lrs, steps=steps, batch_size=t.batch_size,
                eval_every=eval_every, seed=s.seed, checkpoint_path=ckpt_file,
                checkpoint_every=t.checkpoint_every, log_every=log_every, on_log=on_log,
                stable_accuracy=t.stable_accuracy, divergence_factor=t.divergence_factor,
                autocast_bf16=t.bf16, compile=t.compile, cuda_graphs=graphs, recipe=the_recipe,
                probe_at=probes.schedule, on_probe=probes.on_probe if probes.schedule else None)
    out.scalars.update(best_test_accuracy=res.best_acc, best_lr=res.best_lr or float("nan"),
                       max_stable_lr=res.max_stable_lr or float("nan"), steps_per_s=res.steps_per_s,
                       train_seconds=res.wall_time_s, steps=res.steps, steps_per_epoch=per_epoch)
    clean = None
    if t.clean_train_images:
        idx = subset_indices(data.y_train.shape[0], t.clean_train_images)
        x, y = (data.x_train, data.y_train) if idx is None else (
            data.x_train[idx.to(device)], data.y_train[idx.to(device)])
        clean = 1.0 - evaluate(model, x, y, autocast_bf16=t.bf16).cpu().numpy()
    finals = _finals(res, clean)
    for name, values in finals.items():  # the config's row keeps them (one row per config)
        out.scalars.update({f"{name}_{_lr_key(lr)}": float(v) for lr, v in zip(lrs, values, strict=True)})
    probes.after(out, res, job_dir / RESULT_DIR)
    resumed_before = first_live[0] if first_live else res.steps + 1
    if run is not None:
        _backfill(run, res, resumed_before, log_every, unit)
        run.log_member_series(0, finals)
    out.arrays.update(lrs=np.array(lrs), loss=res.loss, train_error=res.train_error,
                      eval_steps=res.eval_steps, test_acc=res.test_acc)
    return out


def _finals(res: TrainResult, clean: np.ndarray | None) -> dict[str, np.ndarray]:
    return {"final_test_acc": res.final_test_acc, "final_test_error": 1.0 - res.final_test_acc,
            "best_test_acc": res.best_test_acc, "final_train_loss": res.final_train_loss,
            "diverged": res.diverged.astype(np.float64),
            **({"clean_train_error": clean} if clean is not None else {})}


class _Probing:
    """``task.probes`` before and after training, or at ``probe_every``/``probe_steps``."""

    def __init__(self, s: RankexpConfig, net: nn.Module, data: DeviceDataset, lrs: list[float],
                 run: Any, steps: int, device: torch.device):
        self.s, self.net, self.data, self.lrs, self.run = s, net, data, lrs, run
        self.schedule = [p for p in s.task.probe_schedule() if p <= steps]
        self.live: list[int] = []
        if self.schedule:
            log.info("probes %s at %d optimizer steps (%s) on each of %d learning rates; %s",
                     ",".join(s.task.probes), len(self.schedule), _steps_text(self.schedule),
                     len(lrs), probe_memory_line(s, len(lrs), str(device)))

    def before(self, out: Measurement) -> None:
        if not self.schedule:
            self._once(out, [p for p in self.s.task.probes if p in INIT_PROBES], False, 0)

    def _once(self, out: Measurement, probes: list[str], trained: bool, step: int) -> None:
        if probes:
            log.info("probes of the %s network: %s", "trained" if trained else "initial",
                     ", ".join(probes))
            m = probing.probe_net(self.net, self.data, probes, self.s.task.options, trained=trained)
            out.update(m)
            if len(self.lrs) > 1:  # (one rate: its scalars are the run's)
                log_member_series(self.run, [step], _rows(probing.member_values(m, len(self.lrs))))

    def on_probe(self, step: int) -> dict[str, torch.Tensor]:
        t = self.s.task
        m = probing.probe_members(self.net, self.data, probing.probes_at(step, t.probes), t.options,
                                  trained=step > 0, dtype=DTYPES[self.s.dtype.value])
        values = probing.member_values(m, len(self.lrs))
        self.live.append(step)
        log_member_series(self.run, [step], _rows(values))
        return values

    def after(self, out: Measurement, res: TrainResult, result_dir: Path) -> None:
        if self.schedule:
            _probe_results(out, res, self.lrs, self.live, self.run, result_dir)
        else:
            self._once(out, [p for p in self.s.task.probes if p not in INIT_PROBES], True,
                       res.steps)


def log_member_series(run: Any, steps: list[int] | np.ndarray, metrics: dict[str, np.ndarray]) -> None:
    """Log ``metrics[name]`` ``(len(steps), E)`` at ``steps`` to each rate's member run (if any)."""
    if run is None or not metrics:
        return
    run.log_member_series(np.asarray(steps), {name: np.asarray(v) for name, v in metrics.items()})


def _rows(values: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The per-member scalars among ``values`` as one row ``(1, E)`` each."""
    return {k: v[None] for k, v in probing.member_scalars(values).items()}


def _probe_results(out: Measurement, res: TrainResult, lrs: list[float], live: list[int], run: Any,
                   result_dir: Path) -> None:
    """The scheduled probes' record: cost, per-member scalars per step, one ``.npz`` per step, backfill."""
    steps = sorted(res.probes)
    share = res.probe_seconds / res.wall_time_s if res.wall_time_s > 0 else float("nan")
    log.info("probes: %.1f s at %d steps, %.0f %% of the training's %.1f s (%.2f s per step probed)",
             res.probe_seconds, len(steps), 100 * share, res.wall_time_s,
             res.probe_seconds / max(len(steps), 1))
    out.scalars.update(probe_seconds=res.probe_seconds, probe_share=share)
    out.arrays["probe_steps"] = np.array(steps)
    rows = {k: np.stack([probing.member_scalars(res.probes[st])[k].astype(np.float64) for st in steps])
            for k in probing.member_scalars(res.probes[steps[0]])} if steps else {}
    out.arrays.update({f"probe_{k}": v for k, v in rows.items()})
    probing.write_arrays(result_dir, res.probes, lrs)
    early = [i for i, st in enumerate(steps) if st not in live]
    if early:  # probed by the interrupted run: backfilled like the training curves
        log_member_series(run, [steps[i] for i in early], {k: v[early] for k, v in rows.items()})


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 12 else f"{steps[0]}, {steps[1]}, …, {steps[-1]}"


def _backfill(run: Any, res: TrainResult, resumed_before: int, log_every: int, unit: int) -> None:
    early = res.eval_steps < resumed_before
    if early.any():
        acc = res.test_acc[early]
        run.log_member_series(res.eval_steps[early] // unit, {"test_acc": acc, "test_error": 1.0 - acc})
    ends = np.arange(log_every, min(resumed_before, res.steps + 1), log_every)
    if ends.size:  # torch's float32 mean, as the live report takes it
        means = {name: np.stack([torch.as_tensor(values[e - log_every:e]).mean(0).numpy()
                                 for e in ends])
                 for name, values in (("train_loss", res.loss), ("train_error", res.train_error))}
        run.log_member_series(ends // unit, means)
