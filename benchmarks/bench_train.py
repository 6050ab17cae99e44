"""Benchmark of the training engine, every number from one run (``make bench`` runs it).

    python -m benchmarks.bench_train                      # d=256, L=12, m/d=1, B=256, 1 thread
    python -m benchmarks.bench_train --width 64 --cold    # another size; also time a cold decode

(a) CIFAR-10 load time (cached; cold with ``--cold``).
(b) One training step of :func:`rankexp.tasks.train.train` (one member, Adam, fp32) against a
    minimal loop written here: the same network as plain 2-D tensors (pre-RMSNorm residual
    blocks ``h + W_down relu(W_up rms(h))``, an input projection and a head), the data on the
    device, ``torch.optim.Adam``, ``F.cross_entropy``; no divergence tracking, no checkpoints,
    no per-member learning rates.  Target: engine ≤ 1.05× the minimal loop's step time.
(c) The six-learning-rate sweep as one batched model against six one-member models trained
    one after the other (the same engine, so the ratio is the batching alone), with the
    arithmetic rate each reaches next to a large matmul's.

Timings are interleaved rounds, the best of each kept: a busy machine slows every contender
alike, and the fastest round is the least disturbed one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import torch
from torch.nn import functional as F

from rankexp.models.mlp import ResidualMLP
from rankexp.models.norms import rmsnorm
from rankexp.tasks.data import (
    DEFAULT_CACHE_DIR,
    DEFAULT_ROOT,
    IN_FEATURES,
    DeviceDataset,
    load_cifar10,
)
from rankexp.tasks.train import NUM_CLASSES, STUDY_LRS, Classifier, train

from .common import header


def step_flops(width: int, depth: int, expansion: float, matrices: int, batch: int) -> float:
    """Matmul FLOPs of one training step of one member: 2 per MAC, ×3 for forward + backward."""
    hidden = width if matrices == 1 else round(expansion * width)
    macs = IN_FEATURES * width + depth * matrices * width * hidden + width * NUM_CLASSES
    return 6.0 * batch * macs


def matmul_rate(device: torch.device, n: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of an n×n float32 matmul: the device's practical compute ceiling."""
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _sync(device)
    return repeats * 2 * n**3 / (time.perf_counter() - t0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(data: DeviceDataset, members: int, args) -> Classifier:
    stack = ResidualMLP(
        width=args.width,
        depth=args.depth,
        expansion=args.expansion,
        matrices=args.matrices,
        seeds=[0] * members,
        dtype=torch.float32,
        device=data.device,
    )
    return Classifier(stack)


def step_rate(model: Classifier, data: DeviceDataset, lrs: list[float], args, steps: int) -> float:
    """Training steps/s of ``train`` on ``model`` (evaluation and checkpoints not counted)."""
    kw = dict(batch_size=args.batch_size, progress=False, eval_batch_size=args.batch_size)
    kw.update(autocast_bf16=args.bf16, compile=args.compile)
    return train(model, data, lrs, steps=steps, eval_every=steps, **kw).steps_per_s


# --------------------------------------------------------------------------- (b) minimal loop
class MinimalLoop:
    """The hand-written reference: one network, plain tensors, ``torch.optim.Adam``.

    Its weights are copied from a fresh one-member :class:`Classifier`, so both start from the
    same network (checked: equal first-step losses); batches come from one ``randperm``.
    """

    def __init__(self, data: DeviceDataset, args, lr: float = 1e-3):
        if args.matrices != 2:
            raise SystemExit("the minimal loop is written for M = 2 branches (--matrices 2)")
        model = build(data, 1, args)
        take = lambda p: p.detach()[0].clone().requires_grad_()  # noqa: E731
        self.w_in, self.w_out = take(model.w_in), take(model.w_out)
        self.blocks = [(take(b.w_up), take(b.w_down)) for b in model.stack.blocks]
        self.beta = model.stack.beta_eff
        params = [self.w_in, *(w for pair in self.blocks for w in pair), self.w_out]
        self.opt = torch.optim.Adam(params, lr=lr)
        self.data, self.batch = data, args.batch_size
        n = data.x_train.shape[0]
        g = torch.Generator(device=data.device).manual_seed(0)
        self.perm = torch.randperm(n, generator=g, device=data.device)
        self.per_epoch = n // self.batch

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w_in.T
        for up, down in self.blocks:
            h = h + self.beta * (F.relu(rmsnorm(h) @ up.T) @ down.T)
        return h @ self.w_out.T

    def step(self, step: int) -> torch.Tensor:
        k = step % self.per_epoch
        idx = self.perm[k * self.batch : (k + 1) * self.batch]
        loss = F.cross_entropy(self.logits(self.data.x_train[idx]), self.data.y_train[idx])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def rate(self, steps: int) -> float:
        _sync(self.data.device)
        t0 = time.perf_counter()
        for s in range(steps):
            self.step(s)
        _sync(self.data.device)
        return steps / (time.perf_counter() - t0)


def bench_minimal(data: DeviceDataset, args) -> dict[str, float]:
    """Step time of ``train`` (one member) over the minimal loop's, interleaved rounds."""
    model, ref = build(data, 1, args), MinimalLoop(data, args)
    x0, y0 = data.x_train[: args.batch_size], data.y_train[: args.batch_size]
    with torch.no_grad():
        same = F.cross_entropy(ref.logits(x0), y0).item(), F.cross_entropy(model(x0)[0], y0).item()
    if abs(same[0] - same[1]) > 1e-4 * abs(same[0]):
        raise SystemExit(f"the minimal loop is not the same network: losses {same}")
    ref.rate(args.warmup)
    step_rate(model, data, [1e-3], args, args.warmup)
    best_ref = best_eng = 0.0
    for r in range(args.rounds):
        a = ref.rate(args.steps)
        b = step_rate(model, data, [1e-3], args, args.steps)
        print(f"  round {r + 1}: minimal {1e3 / a:.1f} ms, engine {1e3 / b:.1f} ms per step "
              f"(ratio {a / b:.3f})", flush=True)
        best_ref, best_eng = max(best_ref, a), max(best_eng, b)
    return {"minimal_ms": 1e3 / best_ref, "engine_ms": 1e3 / best_eng, "ratio": best_ref / best_eng}


# --------------------------------------------------------------------------- (c) batching
def bench_batched(data: DeviceDataset, args) -> None:
    lrs = list(STUDY_LRS)
    batched_model = build(data, len(lrs), args)
    single_models = [build(data, 1, args) for _ in lrs]
    step_rate(batched_model, data, lrs, args, args.warmup)
    for model, lr in zip(single_models, lrs, strict=True):
        step_rate(model, data, [lr], args, args.warmup)
    batched, sequential = 0.0, 0.0
    for r in range(args.rounds):
        b = step_rate(batched_model, data, lrs, args, args.steps)
        single = [
            step_rate(m, data, [lr], args, args.steps)
            for m, lr in zip(single_models, lrs, strict=True)
        ]
        s = 1.0 / sum(1.0 / x for x in single)  # one sweep step = one step of each model
        print(f"  round {r + 1}: batched {b:.3f}, sequential {s:.3f} sweep steps/s "
              f"(ratio {b / s:.2f})", flush=True)
        batched, sequential = max(batched, b), max(sequential, s)
    flops = len(lrs) * step_flops(
        args.width, args.depth, args.expansion, args.matrices, args.batch_size
    )
    peak = matmul_rate(data.device)
    print(f"batched   ({len(lrs)} members, one model): {batched:7.2f} sweep steps/s  "
          f"{batched * flops / 1e9:7.1f} GFLOP/s")
    print(f"sequential ({len(lrs)} one-member models): {sequential:7.2f} sweep steps/s  "
          f"{sequential * flops / 1e9:7.1f} GFLOP/s")
    print(f"speed-up batched / sequential: {batched / sequential:.2f}x")
    print(f"reference 2048² float32 matmul: {peak / 1e9:.1f} GFLOP/s; one sweep step = "
          f"{flops / 1e9:.2f} GFLOP")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--expansion", type=float, default=1.0)
    p.add_argument("--matrices", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=10, help="timed steps per model and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (best kept)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: a shared box)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward + loss")
    p.add_argument("--skip-batched", action="store_true", help="only (a) and (b)")
    p.add_argument("--cold", action="store_true", help="also time a cold decode into a temp cache")
    p.add_argument("--root", default=str(DEFAULT_ROOT))
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    print(header("benchmarks.bench_train (the training engine)") + f", device {device}")
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} on {os.cpu_count()} cores"
              + ("  (busy: timings are noisy)" if load > 0.5 else ""))

    if args.cold:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            load_cifar10(args.root, tmp, progress=False)
            print(f"(a) CIFAR-10 cold load (extract + decode + cache): "
                  f"{time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    tensors = load_cifar10(args.root, args.cache_dir, progress=False)
    t1 = time.perf_counter()
    data = DeviceDataset.from_uint8(*tensors, device=device)
    _sync(device)
    t2 = time.perf_counter()
    print(f"(a) CIFAR-10 load from cache: {t1 - t0:.3f} s; to {device} + normalize: "
          f"{t2 - t1:.3f} s; total {t2 - t0:.3f} s (target ≤ 2 s)")

    # the timed calls evaluate once at their end; a one-batch test split keeps that cheap
    data = dataclasses.replace(
        data, x_test=data.x_test[: args.batch_size], y_test=data.y_test[: args.batch_size]
    )
    shape = (f"d={args.width}, L={args.depth}, m/d={args.expansion:g}, M={args.matrices}, "
             f"B={args.batch_size}")
    print(f"(b) one training step, one member, Adam, fp32, {shape}: train() vs a minimal loop")
    m = bench_minimal(data, args)
    print(f"    minimal loop {m['minimal_ms']:.1f} ms, train() {m['engine_ms']:.1f} ms per step "
          f"→ {m['ratio']:.3f}× [target ≤ 1.05×]")
    if not args.skip_batched:
        print(f"(c) {len(STUDY_LRS)} learning rates {list(STUDY_LRS)} as one batched model vs "
              "one after the other")
        bench_batched(data, args)


if __name__ == "__main__":
    main()
