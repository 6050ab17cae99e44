"""The ``train`` task's loop, pure PyTorch: a learning-rate sweep as one batched model (member
``e`` at ``lrs[e]``), data on the device, host reads only at reports and checkpoints.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import interrupt
from ..console import progress_bar
from . import checkpoint
from .data import BatchSampler, DeviceDataset
from .optim import ADAM, MemberOptimizer, Recipe

log = logging.getLogger(__name__)

#: The study's Adam learning-rate sweep (fig6): six values log-spaced 3e-5 … 1e-2.
STUDY_LRS = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
#: Final test accuracy at or above which a learning rate counts as stable (Table 5).
STABLE_ACCURACY = 0.4
#: a member whose loss exceeds this multiple of its initial loss diverged
DIVERGENCE_FACTOR = 1000.0
NUM_CLASSES = 10


def member_losses(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy per member: logits ``(E, B, C)``, labels ``(B,)`` → ``(E,)`` (nats)."""
    members, batch, classes = logits.shape
    per_sample = F.cross_entropy(logits.reshape(-1, classes), y.repeat(members), reduction="none")
    return per_sample.view(members, batch).mean(1)


@torch.no_grad()
def evaluate(classifier: nn.Module, x: Tensor, y: Tensor, *, batch_size: int = 2000,
             autocast_bf16: bool = False) -> Tensor:
    """Accuracy ``(E,)`` (float64, on the device) of every member on ``x (N, …)``, ``y (N,)``."""
    was_training = classifier.training
    classifier.eval()
    try:
        with _autocast(x.device, autocast_bf16):
            batches = range(0, x.shape[0], batch_size)
            correct = sum((classifier(x[i : i + batch_size]).argmax(-1) == y[i : i + batch_size])
                          .sum(1) for i in batches)
    finally:
        classifier.train(was_training)
    return correct.double() / x.shape[0]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, enabled: bool):  # no cast cache: CUDA graphs need it off
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled,
                          cache_enabled=False)


@dataclass
class TrainResult:
    """One sweep's result per member: ``(steps, E)`` ``loss``/``train_error``, ``(n_evals, E)``
    ``test_acc`` at ``eval_steps``, ``(E,)`` finals; ``max_stable_lr``: Table 5."""

    lrs: list[float]
    steps: int
    completed: bool
    final_train_loss: np.ndarray
    final_test_acc: np.ndarray
    best_test_acc: np.ndarray
    diverged: np.ndarray
    diverged_step: np.ndarray
    loss: np.ndarray
    train_error: np.ndarray
    eval_steps: np.ndarray
    test_acc: np.ndarray
    best_lr: float | None
    best_acc: float
    max_stable_lr: float | None
    wall_time_s: float
    steps_per_s: float
    probes: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    probe_seconds: float = 0.0


@dataclass
class LoopState:
    """The loop's device state: ``done`` ``()``, ``alive`` ``(E,)``, ``diverged_step`` ``(E,)``,
    ``loss``/``error`` float32 ``(steps + SLACK, E)`` (SLACK absorbs the graph warm-up)."""

    SLACK = 4

    done: Tensor
    alive: Tensor
    diverged_step: Tensor
    loss: Tensor
    error: Tensor

    @classmethod
    def fresh(cls, members: int, steps: int, device: torch.device) -> LoopState:
        def record() -> Tensor:
            return torch.full((steps + cls.SLACK, members), math.nan, dtype=torch.float32,
                              device=device)

        return cls(done=torch.zeros((), dtype=torch.int64, device=device),
                   alive=torch.ones(members, dtype=torch.bool, device=device),
                   diverged_step=torch.full((members,), -1, dtype=torch.int64, device=device),
                   loss=record(), error=record())

    def tensors(self) -> list[Tensor]:
        return [self.done, self.alive, self.diverged_step, self.loss, self.error]


def _watch_divergence(state: LoopState, losses: Tensor, factor: float) -> Tensor:
    row = losses.detach().to(state.loss.dtype)
    state.loss.index_copy_(0, state.done.view(1), row[None])  # device index: graph-safe
    bad = ~torch.isfinite(row) | (row > factor * state.loss[0])
    newly = state.alive & bad
    state.diverged_step.copy_(torch.where(newly, state.done + 1, state.diverged_step))
    state.alive &= ~bad
    state.done += 1
    return state.alive


def _step_body(model: nn.Module, optimizer: MemberOptimizer, state: LoopState, data: DeviceDataset,
               loss_fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], recipe: Recipe,
               divergence_factor: float) -> Callable[[Tensor, Tensor | float], None]:
    params = list(model.parameters())

    def body(idx: Tensor, lr_scale: Tensor | float) -> None:
        x, y = data.x_train[idx], data.y_train[idx]  # a gather on the device
        if recipe.batch_transform is not None:
            x = recipe.batch_transform(x, state.done)
        losses, errors = loss_fn(x, y)  # (E,) each
        state.error.index_copy_(0, state.done.view(1), errors.detach()[None])
        alive = _watch_divergence(state, losses, divergence_factor)
        for p in params:
            p.grad = None
        # frozen members get no upstream gradient; a where, not a product, keeps NaN out
        torch.where(alive, losses, 0.0).sum().backward()
        optimizer.step(alive, lr_scale)

    return body


class _GraphedStep:
    """The step as one CUDA graph; warm-up updates are undone, so graphing changes nothing."""

    WARMUP = 3  # ≤ LoopState.SLACK

    def __init__(self, body, model: nn.Module, optimizer: MemberOptimizer, state: LoopState,
                 first_idx: Tensor):
        self.body = body
        self.idx = first_idx.clone()
        self.scale = torch.ones((), dtype=torch.float64, device=first_idx.device)
        saved_model = {k: v.clone() for k, v in model.state_dict().items()}
        saved_opt = copy.deepcopy(optimizer.state_dict())
        saved_state = [t.clone() for t in state.tensors()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP):
                body(self.idx, self.scale)
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():
            model.load_state_dict(saved_model)  # copy_ in place: addresses kept
            optimizer.load_state_dict(saved_opt)
            for t, s in zip(state.tensors(), saved_state, strict=True):
                t.copy_(s)
        for p in model.parameters():
            p.grad = None  # the captured backward allocates them from the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            body(self.idx, self.scale)

    def __call__(self, idx: Tensor, lr_scale: float) -> None:
        self.idx.copy_(idx)
        self.scale.fill_(lr_scale)
        self.graph.replay()


def train(classifier: nn.Module, data: DeviceDataset, lrs: Sequence[float], *, steps: int = 5000,
          batch_size: int = 256, eval_every: int = 250, seed: int = 0,
          checkpoint_path: str | Path | None = None, checkpoint_every: int = 500,
          progress: bool = True, autocast_bf16: bool = False, compile: bool = False,
          cuda_graphs: bool = False, eval_batch_size: int = 2000, loss_window: int = 100,
          log_every: int | None = None,
          on_log: Callable[[int, dict[str, np.ndarray]], None] | None = None,
          stable_accuracy: float = STABLE_ACCURACY, divergence_factor: float = DIVERGENCE_FACTOR,
          stop_after: int | None = None, recipe: Recipe = ADAM, probe_at: Sequence[int] = (),
          on_probe: Callable[[int], dict[str, Tensor]] | None = None) -> TrainResult:
    """Train every member of ``classifier`` at its own learning rate, as one model.

    Args:
        classifier: ``(B, …)`` → ``(E, B, C)`` logits, every parameter with the leading member
            axis E = ``len(lrs)``, on ``data``'s device; trained in place.
        checkpoint_path: written every ``checkpoint_every`` steps, at the end and on a stop
            request; a run finding it resumes.
        log_every: report every this many steps (None: at evaluations) to ``on_log(step, metrics)``.
        stop_after: end after this many steps without a checkpoint, as if killed (tests).
        probe_at: steps (0: before the first) after which ``on_probe(step)`` runs; it must leave
            model, optimizer and RNG as found.

    Raises:
        ValueError: bad rates, step counts, factor, devices, widths, ``cuda_graphs`` off CUDA, or
            another run's checkpoint.
        rankexp.interrupt.JobInterrupted: a stop was requested; the checkpoint is written.
    """
    plan = _Plan(
        steps=int(steps), batch_size=int(batch_size), eval_every=int(eval_every),
        log_every=None if log_every is None else int(log_every),
        checkpoint_every=int(checkpoint_every),
        checkpoint_path=None if checkpoint_path is None else Path(checkpoint_path),
        eval_batch_size=int(eval_batch_size), autocast_bf16=bool(autocast_bf16),
        compile=bool(compile), cuda_graphs=bool(cuda_graphs),
        divergence_factor=float(divergence_factor), recipe=recipe, progress=bool(progress),
        probe_at=frozenset(map(int, probe_at)) if on_probe else frozenset())
    lrs = _check_arguments(classifier, data, lrs, plan)
    loop = _Loop(classifier, data, lrs, int(seed), plan, on_log, on_probe)
    start = loop.resume()
    end = plan.steps if stop_after is None else max(start, min(plan.steps, int(stop_after)))
    loop.run(start, end)
    return loop.result(start, end, loss_window, stable_accuracy)


@dataclass(frozen=True)
class _Plan:
    steps: int
    batch_size: int
    eval_every: int
    log_every: int | None
    checkpoint_every: int
    checkpoint_path: Path | None
    eval_batch_size: int
    autocast_bf16: bool
    compile: bool
    cuda_graphs: bool
    divergence_factor: float
    recipe: Recipe
    progress: bool
    probe_at: frozenset[int] = frozenset()


def _check_arguments(model: nn.Module, data: DeviceDataset, lrs: Sequence[float], plan: _Plan
                     ) -> list[float]:
    lrs = [float(lr) for lr in lrs]
    params = list(model.parameters())
    members = params[0].shape[0]
    if len(lrs) != members:
        raise ValueError(
            f"len(lrs)={len(lrs)} but the classifier has {members} members (one per lr)")
    if not all(math.isfinite(lr) and lr > 0 for lr in lrs):
        raise ValueError(f"lrs={lrs}: every learning rate must be finite and > 0")
    for name in ("steps", "eval_every", "checkpoint_every", "eval_batch_size", "log_every"):
        value = getattr(plan, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be ≥ 1")
    if not plan.divergence_factor > 1:
        raise ValueError(f"divergence_factor={plan.divergence_factor} must be > 1 (a multiple "
                         "of the initial loss; inf: only non-finite losses count)")
    if data.device != params[0].device:
        raise ValueError(f"data is on {data.device}, the classifier on {params[0].device}; "
                         "put both on one device")
    want = getattr(model, "in_features", data.in_features)
    if data.in_features != want:
        raise ValueError(f"data has {data.in_features} features, classifier expects {want}")
    if any(p.shape[0] != members for p in params):
        raise ValueError("every parameter needs the leading member axis E")
    if plan.cuda_graphs and data.device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA device; the data are on {data.device}")
    return lrs


@dataclass
class _History:
    eval_steps: list[int] = field(default_factory=list)
    test_acc: list[np.ndarray] = field(default_factory=list)
    elapsed_before: float = 0.0
    warned: set[int] = field(default_factory=set)  # members whose divergence was logged
    probes: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    probe_seconds: float = 0.0


class _Loop:
    def __init__(self, model: nn.Module, data: DeviceDataset, lrs: list[float], seed: int,
                 plan: _Plan, on_log, on_probe=None):
        self.model, self.data, self.lrs, self.plan, self.on_log = model, data, lrs, plan, on_log
        self.on_probe = on_probe
        self.device = data.device
        self.sampler = BatchSampler(data.y_train.shape[0], plan.batch_size, seed, self.device)
        self._fresh()
        arch = model.architecture() if hasattr(model, "architecture") else {
            name: list(p.shape) for name, p in model.named_parameters()}
        self.identity = {"lrs": lrs, "seed": seed, "batch_size": plan.batch_size,
                         "sampler": self.sampler.state_dict(), "recipe": plan.recipe.name,
                         "divergence_factor": plan.divergence_factor, "architecture": arch}

    def _fresh(self) -> None:
        """The optimizer and loop state of step 0."""
        lrs = torch.tensor(self.lrs, dtype=torch.float64, device=self.device)
        self.optimizer = self.plan.recipe.optimizer(self.model, lrs)
        self.state = LoopState.fresh(len(self.lrs), self.plan.steps, self.device)
        self.history = _History()

    def resume(self) -> int:
        path = self.plan.checkpoint_path
        ckpt = None if path is None else checkpoint.load(
            path, self.device, self.identity, self.plan.steps)
        if ckpt is None:
            return 0
        initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        start = int(ckpt["step"])
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.state.loss[:start] = ckpt["loss"]
            if "error" in ckpt:
                self.state.error[:start] = ckpt["error"]
            self.state.alive.copy_(ckpt["alive"])
            self.state.diverged_step.copy_(ckpt["diverged_step"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            self.model.load_state_dict(initial)
            self._fresh()
            checkpoint.unusable(path, f"not loadable into this run ({type(err).__name__}: {err})")
            return 0
        self.state.done.fill_(start)
        self.history = _History(
            eval_steps=[int(s) for s in ckpt["eval_steps"]],
            test_acc=[np.asarray(a, dtype=np.float64) for a in ckpt["test_acc"]],
            elapsed_before=float(ckpt["elapsed_s"]),
            probes={int(k): v for k, v in ckpt.get("probes", {}).items()},
            probe_seconds=float(ckpt.get("probe_seconds", 0.0)))
        log.info("resuming from %s at step %d/%d", path, start, self.plan.steps)
        return start

    def save(self, done: int) -> None:
        s, h = self.state, self.history
        checkpoint.save(self.plan.checkpoint_path, {
            **self.identity, "step": done, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(), "alive": s.alive.cpu(),
            "diverged_step": s.diverged_step.cpu(), "loss": s.loss[:done].cpu(),
            "error": s.error[:done].cpu(), "eval_steps": list(h.eval_steps),
            "test_acc": [a.tolist() for a in h.test_acc],
            "elapsed_s": h.elapsed_before + time.perf_counter() - self.t0, "probes": h.probes,
            "probe_seconds": h.probe_seconds})

    def _loss_fn(self) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
        model, device, bf16 = self.model, self.device, self.plan.autocast_bf16

        def forward_loss(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            with _autocast(device, bf16):
                logits = model(x)
                return member_losses(logits, y), (logits.argmax(-1) != y).float().mean(1)

        return torch.compile(forward_loss) if self.plan.compile else forward_loss

    def _step_function(self, start: int) -> Callable[[Tensor, float], None]:
        body = _step_body(self.model, self.optimizer, self.state, self.data, self._loss_fn(),
                          self.plan.recipe, self.plan.divergence_factor)
        if not self.plan.cuda_graphs:
            return body
        return _GraphedStep(body, self.model, self.optimizer, self.state,
                            self.sampler.indices(start))

    def run(self, start: int, end: int) -> None:
        """Steps ``start … end−1`` with reports, evaluations, checkpoints and stop requests."""
        plan, schedule = self.plan, self.plan.recipe.schedule
        self.model.train()
        self.t0 = time.perf_counter()
        self.side_time, self.call_time, self.saved_at = 0.0, 0.0, -1
        if start >= end:  # a finished checkpoint, or stop_after before it
            return
        if start == 0 and 0 in plan.probe_at:
            self._probe(0)  # the initial network
        step_fn = self._step_function(start)  # (graph capture counts as bookkeeping)
        self.side_time, self.logged = time.perf_counter() - self.t0, start
        self.start_step = start
        with progress_bar(plan.steps, enabled=plan.progress, initial=start, desc="train",
                          unit="step") as bar, interrupt.deferred():
            for step in range(start, end):
                step_fn(self.sampler.indices(step), schedule(step, plan.steps))
                bar.update(1)
                done = step + 1
                self._bookkeeping(done, bar)
                if interrupt.requested() is not None:
                    self._stop(done)
        _synchronize(self.device)
        self.call_time = time.perf_counter() - self.t0

    def _stop(self, done: int) -> None:
        name = interrupt.requested()
        if self.plan.checkpoint_path is not None:
            if self.saved_at != done:
                self.save(done)
            log.warning("%s: stopped after step %d/%d; checkpoint %s (rerun to resume)",
                        name, done, self.plan.steps, self.plan.checkpoint_path)
        else:
            log.warning("%s: stopped after step %d/%d (no checkpoint_path: progress is lost)",
                        name, done, self.plan.steps)
        raise interrupt.JobInterrupted(name)

    def _bookkeeping(self, done: int, bar) -> None:
        """Reports, evaluations, probes and checkpoints due after step ``done`` (the host reads)."""
        plan = self.plan
        evaluating = done % plan.eval_every == 0 or done == plan.steps
        reporting = evaluating or (plan.log_every is not None and done % plan.log_every == 0)
        saving = plan.checkpoint_path is not None and (
            done % plan.checkpoint_every == 0 or done == plan.steps)
        probing = done in plan.probe_at
        if not (reporting or saving or probing):
            return
        _synchronize(self.device)  # so the queued steps are not timed as bookkeeping
        t_side = time.perf_counter()
        if probing:  # before the checkpoint of this step, which then holds its result
            self._probe(done)
        if reporting:
            self._report(done, evaluating, bar)
            self.logged = done
        if saving:
            self.save(done)
            self.saved_at = done
        self.side_time += time.perf_counter() - t_side

    def _probe(self, done: int) -> None:
        t = time.perf_counter()
        self.history.probes[done] = self.on_probe(done)
        _synchronize(self.device)
        self.history.probe_seconds += time.perf_counter() - t

    def _report(self, done: int, evaluating: bool, bar) -> None:
        metrics = {"train_loss": self.state.loss[self.logged:done].mean(0).cpu().numpy(),
                   "train_error": self.state.error[self.logged:done].mean(0).cpu().numpy()}
        if evaluating:
            acc = evaluate(self.model, self.data.x_test, self.data.y_test,
                           batch_size=self.plan.eval_batch_size,
                           autocast_bf16=self.plan.autocast_bf16)
            metrics["test_acc"] = acc.cpu().numpy()
            self.history.eval_steps.append(done)
            self.history.test_acc.append(metrics["test_acc"])
            bar.set_postfix(best_acc=f"{np.nanmax(metrics['test_acc']):.3f}")
        self._warn_diverged(self.state.diverged_step.cpu().numpy())
        log.info("%s", progress_line(done, self.plan.steps, time.perf_counter() - self.t0,
                                     done - self.start_step, self.lrs, metrics))
        if self.on_log is not None:
            self.on_log(done, metrics)

    def _warn_diverged(self, diverged_step: np.ndarray) -> None:
        for e in np.flatnonzero(diverged_step >= 0):
            if e in self.history.warned:
                continue
            self.history.warned.add(int(e))
            k = int(diverged_step[e])
            loss, initial = self.state.loss[[k - 1, 0], e].tolist()
            why = ("non-finite loss" if not math.isfinite(loss) else
                   f"loss {loss:.3g} > {self.plan.divergence_factor:g} × initial {initial:.3g}")
            log.warning("lr=%g diverged at step %d: %s (frozen from then on)", self.lrs[e], k, why)

    def result(self, start: int, end: int, loss_window: int, stable_accuracy: float
               ) -> TrainResult:
        h, lrs, members = self.history, self.lrs, len(self.lrs)
        diverged_step = self.state.diverged_step.cpu().numpy()
        self._warn_diverged(diverged_step)
        loss = self.state.loss[:end].cpu().numpy()
        acc = np.asarray(h.test_acc, dtype=np.float64).reshape(len(h.eval_steps), members)
        final = acc[-1] if len(acc) else np.full(members, np.nan)
        diverged = diverged_step >= 0
        window = loss[-loss_window:] if end else np.full((1, members), np.nan)
        best_lr, best_acc = None, float("nan")
        if len(acc):
            # a diverged rate is frozen at weights of no use: best only when every rate diverged
            ranked = np.where(np.isnan(final) | (diverged & ~diverged.all()), -np.inf, final)
            i = int(np.argmax(ranked))
            best_lr, best_acc = lrs[i], float(final[i])
        stable = [lr for lr, a, d in zip(lrs, final, diverged, strict=True)
                  if not d and a >= stable_accuracy]
        step_time = self.call_time - self.side_time
        return TrainResult(
            lrs=list(lrs), steps=end, completed=end == self.plan.steps,
            final_train_loss=window.astype(np.float64).mean(0), final_test_acc=final,
            best_test_acc=acc.max(0) if len(acc) else np.full(members, np.nan),
            diverged=diverged, diverged_step=diverged_step, loss=loss,
            train_error=self.state.error[:end].cpu().numpy(),
            eval_steps=np.asarray(h.eval_steps, dtype=np.int64), test_acc=acc, best_lr=best_lr,
            best_acc=best_acc, max_stable_lr=max(stable) if stable else None,
            wall_time_s=h.elapsed_before + self.call_time,
            steps_per_s=(end - start) / step_time if step_time > 0 and end > start else 0.0,
            probes=dict(sorted(h.probes.items())), probe_seconds=h.probe_seconds)


def _lr_key(lr: float) -> str:
    return f"lr{lr:g}"


def duration(seconds: float) -> str:
    """``1h02m``, ``3m07s``, ``12s``: a short human duration."""
    s = int(round(max(seconds, 0.0)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def progress_line(done: int, total: int, elapsed: float, steps_run: int, lrs: list[float],
                  metrics: dict[str, np.ndarray]) -> str:
    """One report line: step/total, elapsed, ETA and each metric per rate (``lr0.001=1.887``)."""
    eta = elapsed / steps_run * (total - done) if steps_run > 0 else float("nan")
    values = "  ".join(f"{k} " + " ".join(f"{_lr_key(lr)}={float(v):.4g}" for lr, v in zip(lrs, vals, strict=True))
                       for k, vals in metrics.items())
    return (f"step {done}/{total} ({100 * done / total:.0f}%)  elapsed {duration(elapsed)}  "
            f"ETA {duration(eta) if math.isfinite(eta) else '?'}  {values}")
