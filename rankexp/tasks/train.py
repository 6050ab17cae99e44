"""The CIFAR-10 training engine of the `train` task (science.md §1 and fig6): pure PyTorch.

The network is the measured :class:`~rankexp.models.mlp.ResidualMLP` stack between an
input projection (3072 → d) and a linear head (d → 10). A learning-rate sweep is
one batched model: member ``e`` of the ensemble axis E is the *same* initial
network (every member has the same seed) trained with Adam at ``lrs[e]``, so a
sweep step is one forward and one backward, however many rates it holds.

Per-member learning rates with one :class:`torch.optim.Adam`: without weight
decay Adam's update is linear in the learning rate,
``θ ← θ − lr · m̂/(√v̂ + ε)`` with ``m̂, v̂`` independent of lr, so the optimizer
runs at ``lr = 1`` and member ``e``'s step is scaled by ``lrs[e]`` afterwards:
``θ_e ← θ_e + lrs[e] · (θ_e^{lr=1} − θ_e)``. Every Adam operation is elementwise,
so members never mix (test: each member equals its own single-model Adam run).

A member whose loss turns NaN/inf is frozen from that step on (its parameters
are kept by a ``where``, never multiplied by a mask, so NaNs cannot spread) and
recorded as diverged; the others continue. Losses stay in a device buffer and
reach the host only at reports (``log_every``, evaluations) and checkpoints.

Typical use (the Hydra task adds the config and the tracking)::

    data = load_device_dataset(device="cuda")
    stack = ResidualMLP(width=256, depth=48, expansion=1.0, placement="post",
                        alpha=2.0, seeds=[seed] * len(STUDY_LRS),
                        dtype=torch.float32, device="cuda")
    result = train(Classifier(stack), data, STUDY_LRS, steps=5000, seed=seed)
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from tqdm.auto import tqdm

from ..locations import cache_path, resolve_path
from ..models import DTYPES, build_model
from ..models.mlp import ResidualMLP
from ..result import Measurement
from ..seeding import STREAM_HEAD, seeded_generator
from .data import IN_FEATURES, BatchSampler, DeviceDataset, load_device_dataset

if TYPE_CHECKING:
    from ..config import RankexpConfig

log = logging.getLogger(__name__)

#: The study's Adam learning-rate sweep (fig6): six values log-spaced 3e-5 … 1e-2.
STUDY_LRS = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
#: Final test accuracy at or above which a learning rate counts as stable (Table 5).
STABLE_ACCURACY = 0.4
NUM_CLASSES = 10
_CHECKPOINT_FORMAT = 1


# --------------------------------------------------------------------------- model
class Classifier(nn.Module):
    """Input projection → :class:`ResidualMLP` stack → linear head, for E members.

    Args:
        stack: the residual stack, built exactly as for measuring (its weights are
            not touched here); member ``e`` is seeded with ``stack.seeds[e]``. For
            a learning-rate sweep give it ``seeds=[seed] * len(lrs)``.
        in_features: input size (3072 for flattened CIFAR-10).
        num_classes: head size (10).

    The biasless projection ``w_in`` ``(E, d, in_features)`` and head ``w_out``
    ``(E, num_classes, d)`` are drawn in that order, in float64 on CPU, from
    ``seeded_generator(seed, STREAM_HEAD)`` with ``N(0, 1/fan_in)``, so they never
    share bits with the stack's weights (stream ``STREAM_WEIGHTS``) and
    ``rms(h_0) ≈ rms(x)``. Dtype and device follow the stack's.
    """

    def __init__(
        self, stack: ResidualMLP, *, in_features: int = IN_FEATURES, num_classes: int = NUM_CLASSES
    ):
        super().__init__()
        ref = next(stack.parameters())
        members, width = stack.members, stack.width
        self.stack = stack
        self.in_features, self.num_classes = int(in_features), int(num_classes)
        kw = {"dtype": ref.dtype, "device": ref.device}
        self.w_in = nn.Parameter(torch.empty(members, width, self.in_features, **kw))
        self.w_out = nn.Parameter(torch.empty(members, self.num_classes, width, **kw))
        self.reset_head()

    @property
    def members(self) -> int:
        return self.stack.members

    def architecture(self) -> dict:
        """What defines this network besides its weights (checkpoints are checked against it)."""
        stack = self.stack
        return {
            "width": stack.width,
            "depth": stack.depth,
            "hidden": stack.blocks[0].hidden,
            "matrices": stack.matrices,
            "activation": stack.activation,
            "placement": stack.placement,
            "norm_op": stack.norm_op,
            "alpha": stack.alpha,
            "beta": stack.beta_eff,
            "skip_every": stack.skip_every,
            "seeds": list(stack.seeds),
            "in_features": self.in_features,
            "num_classes": self.num_classes,
            "dtype": str(self.w_in.dtype),
        }

    @torch.no_grad()
    def reset_head(self) -> None:
        """Draw ``w_in`` then ``w_out`` from ``N(0, 1/fan_in)`` per member seed (stream HEAD)."""
        for e, seed in enumerate(self.stack.seeds):
            g = seeded_generator(seed, STREAM_HEAD)
            for w in (self.w_in, self.w_out):
                fan_out, fan_in = w.shape[1:]
                draw = torch.randn(fan_out, fan_in, generator=g, dtype=torch.float64)
                w[e].copy_(draw / math.sqrt(fan_in))

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(E, B, num_classes)`` for inputs ``x`` ``(B, in_features)`` shared by all members."""
        members, width = self.w_in.shape[:2]
        # One (B, in) × (in, E·d) GEMM instead of E broadcast copies of x.
        h0 = (x @ self.w_in.reshape(members * width, -1).mT).view(-1, members, width)
        return self.stack(h0.transpose(0, 1)) @ self.w_out.mT


def member_losses(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy per member: logits ``(E, B, C)``, labels ``(B,)`` → ``(E,)`` (nats)."""
    members, batch, classes = logits.shape
    # (cross_entropy runs in float32 under autocast; float64 stays float64)
    per_sample = F.cross_entropy(logits.reshape(-1, classes), y.repeat(members), reduction="none")
    return per_sample.view(members, batch).mean(1)


@torch.no_grad()
def evaluate(
    classifier: Classifier,
    x: Tensor,
    y: Tensor,
    *,
    batch_size: int = 2000,
    autocast_bf16: bool = False,
) -> Tensor:
    """Accuracy of every member on ``(x, y)``, computed on their device in chunks.

    Args:
        x: ``(N, in_features)``; y: int64 ``(N,)``.

    Returns:
        float64 ``(E,)`` fraction correct (on the device; no host sync here).
    """
    correct = torch.zeros(classifier.members, dtype=torch.int64, device=x.device)
    with _autocast(x.device, autocast_bf16):
        for start in range(0, x.shape[0], batch_size):
            logits = classifier(x[start : start + batch_size])
            correct += (logits.argmax(-1) == y[start : start + batch_size]).sum(1)
    return correct.double() / x.shape[0]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# --------------------------------------------------------------------------- result
@dataclass
class TrainResult:
    """What one learning-rate sweep produced; arrays are per member (= per learning rate).

    Attributes:
        lrs: the E learning rates.
        steps: optimizer steps completed (== the requested steps when ``completed``).
        completed: False when the call stopped early (``stop_after``).
        final_train_loss: ``(E,)`` mean train cross-entropy (nats) over the last
            ``loss_window`` steps; NaN/inf for a diverged member.
        final_test_acc, best_test_acc: ``(E,)`` test accuracy at the last evaluation
            and the best over evaluations (fraction correct, 0–1).
        diverged: ``(E,)`` bool; diverged_step: ``(E,)`` 1-based step whose loss was
            first non-finite (that member frozen from then on), -1 if never.
        loss: ``(steps, E)`` train loss of every step (row t = step t+1, before its update).
        eval_steps: ``(n_evals,)`` steps after which the test set was evaluated.
        test_acc: ``(n_evals, E)`` test accuracy at those steps.
        best_lr, best_acc: the learning rate with the highest final test accuracy
            and that accuracy (None / NaN before any evaluation).
        max_stable_lr: largest learning rate that did not diverge and reached final
            test accuracy ≥ ``stable_accuracy`` (0.4, Table 5); None if none did.
        wall_time_s: training wall time over all calls (resumes included), seconds.
        steps_per_s: sweep steps (one step of every member) per second of training in
            this call; evaluation and checkpoint writing are not counted.
    """

    lrs: list[float]
    steps: int
    completed: bool
    final_train_loss: np.ndarray
    final_test_acc: np.ndarray
    best_test_acc: np.ndarray
    diverged: np.ndarray
    diverged_step: np.ndarray
    loss: np.ndarray
    eval_steps: np.ndarray
    test_acc: np.ndarray
    best_lr: float | None
    best_acc: float
    max_stable_lr: float | None
    wall_time_s: float
    steps_per_s: float


def _summarize(
    lrs: list[float],
    steps_done: int,
    completed: bool,
    loss: np.ndarray,
    diverged_step: np.ndarray,
    eval_steps: list[int],
    test_acc: list[np.ndarray],
    wall_time_s: float,
    steps_per_s: float,
    loss_window: int,
    stable_accuracy: float,
) -> TrainResult:
    members = len(lrs)
    acc = np.asarray(test_acc, dtype=np.float64).reshape(len(eval_steps), members)
    final = acc[-1] if len(acc) else np.full(members, np.nan)
    best = acc.max(0) if len(acc) else np.full(members, np.nan)
    diverged = diverged_step >= 0
    window = loss[-loss_window:] if steps_done else np.full((1, members), np.nan)
    best_lr, best_acc = None, float("nan")
    if len(acc):
        i = int(np.argmax(np.where(np.isnan(final), -np.inf, final)))
        best_lr, best_acc = lrs[i], float(final[i])
    stable = [
        lr for lr, a, d in zip(lrs, final, diverged, strict=True) if not d and a >= stable_accuracy
    ]
    return TrainResult(
        lrs=list(lrs),
        steps=steps_done,
        completed=completed,
        final_train_loss=window.astype(np.float64).mean(0),
        final_test_acc=final,
        best_test_acc=best,
        diverged=diverged,
        diverged_step=diverged_step,
        loss=loss,
        eval_steps=np.asarray(eval_steps, dtype=np.int64),
        test_acc=acc,
        best_lr=best_lr,
        best_acc=best_acc,
        max_stable_lr=max(stable) if stable else None,
        wall_time_s=wall_time_s,
        steps_per_s=steps_per_s,
    )


# --------------------------------------------------------------------------- checkpoints
def _save_checkpoint(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically: a temporary file, fsync, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_resumable(ckpt: dict, path: Path, expected: dict, steps: int) -> None:
    if ckpt.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {path} has format {ckpt.get('format')!r}, expected {_CHECKPOINT_FORMAT}"
        )
    for key, want in expected.items():
        if ckpt[key] != want:
            raise ValueError(
                f"checkpoint {path} was written with {key}={ckpt[key]!r}, this run has {key}={want!r}; "
                "delete it or point checkpoint_path elsewhere to start afresh"
            )
    if ckpt["step"] > steps:
        raise ValueError(f"checkpoint {path} is at step {ckpt['step']} > steps={steps}")


# --------------------------------------------------------------------------- training
def train(
    classifier: Classifier,
    data: DeviceDataset,
    lrs: Sequence[float],
    *,
    steps: int = 5000,
    batch_size: int = 256,
    eval_every: int = 250,
    seed: int = 0,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int = 500,
    progress: bool = True,
    autocast_bf16: bool = False,
    compile: bool = False,
    eval_batch_size: int = 2000,
    loss_window: int = 100,
    log_every: int | None = None,
    on_log: Callable[[int, dict[str, np.ndarray]], None] | None = None,
    stable_accuracy: float = STABLE_ACCURACY,
    stop_after: int | None = None,
) -> TrainResult:
    """Train every member of ``classifier`` with Adam at its own learning rate, as one model.

    Args:
        classifier: E members (E = ``len(lrs)``), all on ``data``'s device; trained in place.
        data: the data set on the training device (:class:`DeviceDataset`).
        lrs: E Adam learning rates, member e ↔ ``lrs[e]`` (default betas 0.9/0.999,
            ε = 1e-8, no weight decay).
        steps: optimizer steps; batch_size: samples per step, shared by all members.
        eval_every: evaluate test accuracy every this many steps and after the last.
        seed: batch-sampling seed (:class:`BatchSampler`); the weights come from
            the classifier's seeds.
        checkpoint_path: if given, model + optimizer + step + partial series are
            written there atomically every ``checkpoint_every`` steps and at the end,
            and a run finding the file resumes from it (a finished one returns at
            once). On the deterministic CPU path (same thread count) a resumed run
            ends bit-identical to an uninterrupted one. Batches are a function of
            ``(seed, step)``, so no sampler state needs saving beyond the step.
        progress: show a tqdm bar.
        autocast_bf16: run forward/backward under bf16 autocast (weights, optimizer
            and loss stay in the parameters' dtype).
        compile: ``torch.compile`` the forward + loss.
        eval_batch_size: test-set chunk size for evaluation.
        loss_window: steps averaged into ``final_train_loss``.
        log_every: also report the train loss every this many steps (None: only at
            evaluations). Losses reach the host only at these reports.
        on_log: called at every report as ``on_log(step, metrics)`` with host arrays
            ``metrics["train_loss"]`` ``(E,)`` (mean since the previous report) and, at
            evaluations, ``metrics["test_acc"]`` ``(E,)`` (the hook for live tracking).
        stable_accuracy: final test accuracy that makes a learning rate stable
            (``max_stable_lr``; Table 5 uses 0.4).
        stop_after: end this call after this many (global) steps *without* writing a
            checkpoint, as if the process were killed there (tests, time limits
            handled by resuming from the last checkpoint).

    Returns:
        :class:`TrainResult`.

    Raises:
        ValueError: ``len(lrs)`` ≠ E, a non-positive or non-finite learning rate,
            non-positive step counts, data/model on different devices or of
            mismatched width, or a checkpoint from a different run (other lrs,
            seed, batch size or architecture).
    """
    lrs = [float(lr) for lr in lrs]
    members = classifier.members
    params = list(classifier.parameters())
    device, dtype = params[0].device, params[0].dtype
    if len(lrs) != members:
        raise ValueError(
            f"len(lrs)={len(lrs)} but the classifier has {members} members (one per lr)"
        )
    if not all(math.isfinite(lr) and lr > 0 for lr in lrs):
        raise ValueError(f"lrs={lrs}: every learning rate must be finite and > 0")
    for name, value in (
        ("steps", steps),
        ("eval_every", eval_every),
        ("checkpoint_every", checkpoint_every),
        ("log_every", 1 if log_every is None else log_every),
    ):
        if int(value) < 1:
            raise ValueError(f"{name}={value} must be ≥ 1")
    if data.device != device:
        raise ValueError(
            f"data is on {data.device}, the classifier on {device}; put both on one device"
        )
    if data.in_features != classifier.in_features:
        raise ValueError(
            f"data has {data.in_features} features, classifier expects {classifier.in_features}"
        )
    if any(p.shape[0] != members for p in params):
        raise ValueError("every parameter needs the leading member axis E")

    sampler = BatchSampler(data.y_train.shape[0], batch_size, seed, device)
    opt = torch.optim.Adam(params, lr=1.0, **({"fused": True} if device.type == "cuda" else {}))
    lr_vec = torch.tensor(lrs, dtype=dtype, device=device)
    alive = torch.ones(members, dtype=torch.bool, device=device)
    diverged_step = torch.full((members,), -1, dtype=torch.int64, device=device)
    loss_buf = torch.full((steps, members), float("nan"), dtype=torch.float32, device=device)
    eval_steps: list[int] = []
    test_acc: list[np.ndarray] = []
    start, elapsed_before = 0, 0.0
    identity = {
        "lrs": lrs,
        "seed": int(seed),
        "batch_size": int(batch_size),
        "sampler": sampler.state_dict(),
        "architecture": classifier.architecture(),
    }

    ckpt_path = Path(checkpoint_path) if checkpoint_path is not None else None
    if ckpt_path is not None and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        _check_resumable(ckpt, ckpt_path, identity, steps)
        try:
            classifier.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ValueError(f"checkpoint {ckpt_path} does not fit this model: {err}") from err
        start = int(ckpt["step"])
        alive.copy_(ckpt["alive"])
        diverged_step.copy_(ckpt["diverged_step"])
        loss_buf[:start] = ckpt["loss"]
        eval_steps, test_acc = list(ckpt["eval_steps"]), [np.asarray(a) for a in ckpt["test_acc"]]
        elapsed_before = float(ckpt["elapsed_s"])
        log.info("resuming from %s at step %d/%d", ckpt_path, start, steps)

    def payload(step: int, elapsed: float) -> dict:
        return {
            "format": _CHECKPOINT_FORMAT,
            **identity,
            "step": step,
            "model": classifier.state_dict(),
            "optimizer": opt.state_dict(),
            "alive": alive.cpu(),
            "diverged_step": diverged_step.cpu(),
            "loss": loss_buf[:step].cpu(),
            "eval_steps": list(eval_steps),
            "test_acc": [a.tolist() for a in test_acc],
            "elapsed_s": elapsed,
        }

    def step_losses(x: Tensor, y: Tensor) -> Tensor:
        with _autocast(device, autocast_bf16):
            return member_losses(classifier(x), y)

    loss_fn: Callable[[Tensor, Tensor], Tensor] = (
        torch.compile(step_losses) if compile else step_losses
    )
    old = [torch.empty_like(p) for p in params]
    # Broadcast shapes (E, 1, …, 1) for the per-member update of each parameter.
    views = [(members,) + (1,) * (p.dim() - 1) for p in params]
    end = steps if stop_after is None else min(steps, int(stop_after))

    def report(done: int, since: int, evaluating: bool) -> None:
        """Host-side bookkeeping at a log/eval step: the only place losses leave the device."""
        metrics = {"train_loss": loss_buf[since:done].mean(0).cpu().numpy()}
        if evaluating:
            acc = evaluate(
                classifier,
                data.x_test,
                data.y_test,
                batch_size=eval_batch_size,
                autocast_bf16=autocast_bf16,
            )
            metrics["test_acc"] = acc.cpu().numpy()
            eval_steps.append(done)
            test_acc.append(metrics["test_acc"])
            bar.set_postfix(best_acc=f"{np.nanmax(metrics['test_acc']):.3f}")
        log.info(
            "step %d/%d  %s",
            done,
            steps,
            "  ".join(f"{k} {np.array2string(v, precision=3)}" for k, v in metrics.items()),
        )
        if on_log is not None:
            on_log(done, metrics)

    classifier.train()
    t0, side_time, logged = time.perf_counter(), 0.0, start
    bar = tqdm(total=steps, initial=start, desc="train", unit="step", disable=not progress)
    for step in range(start, end):
        idx = sampler.indices(step)
        losses = loss_fn(data.x_train[idx], data.y_train[idx])  # (E,)
        loss_buf[step] = losses.detach()
        finite = torch.isfinite(losses.detach())
        diverged_step.masked_fill_(alive & ~finite, step + 1)
        alive &= finite
        opt.zero_grad(set_to_none=True)
        # Frozen members get no upstream gradient; the where (not a product) keeps NaN out.
        torch.where(alive, losses, torch.zeros_like(losses)).sum().backward()
        with torch.no_grad():
            torch._foreach_copy_(old, [p.detach() for p in params])
        opt.step()  # lr = 1: p ← p − m̂/(√v̂+ε)
        with torch.no_grad():
            for p, o, shape in zip(params, old, views, strict=True):
                # p ← o + lr_e (p − o) for live members, o for frozen ones (where, not a mask
                # product: 0 · NaN would still be NaN)
                torch.where(alive.view(shape), torch.lerp(o, p, lr_vec.view(shape)), o, out=p)
        bar.update(1)

        done = step + 1
        evaluating = done % eval_every == 0 or done == steps
        reporting = evaluating or (log_every is not None and done % log_every == 0)
        saving = ckpt_path is not None and (done % checkpoint_every == 0 or done == steps)
        if reporting or saving:
            _synchronize(device)  # so the queued steps are not timed as bookkeeping
            t_side = time.perf_counter()
            if reporting:
                report(done, logged, evaluating)
                logged = done
            if saving:
                _save_checkpoint(
                    ckpt_path, payload(done, elapsed_before + time.perf_counter() - t0)
                )
            side_time += time.perf_counter() - t_side
    bar.close()
    _synchronize(device)
    call_time = time.perf_counter() - t0
    step_time = call_time - side_time

    done = max(start, end)
    diverged_host = diverged_step.cpu().numpy()
    for e in np.flatnonzero(diverged_host >= 0):
        log.warning("lr=%g diverged at step %d (frozen from then on)", lrs[e], diverged_host[e])
    return _summarize(
        lrs,
        done,
        done == steps,
        loss_buf[:done].cpu().numpy(),
        diverged_host,
        eval_steps,
        test_acc,
        elapsed_before + call_time,
        (done - start) / step_time if step_time > 0 and done > start else 0.0,
        loss_window,
        stable_accuracy,
    )


# --------------------------------------------------------------------------- the task
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
    t = s.task
    lrs = [s.lr] if s.lr is not None else [float(x) for x in t.lrs]
    dtype = DTYPES[t.dtype.value]
    data = load_device_dataset(resolve_path(s.data.root), cache_path(s.data.cache_dir), device=device,
                               dtype=dtype, source=s.data.source, download=s.data.download)
    stack = build_model(s, device, seeds=[s.seed] * len(lrs), dtype=dtype)
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
