"""Benchmark of the training engine: one batched learning-rate sweep vs sequential models.

    python -m benchmarks.bench_train                      # d=256, L=12, m/d=1, B=256, six lrs
    python -m benchmarks.bench_train --width 64 --cold    # another size; also time a cold decode

Prints, from one run: the CIFAR-10 load time (cached; cold with ``--cold``), the
sweep steps/s of the six-member batched model and of six one-member models trained
one after the other (the same engine, so the ratio is the batching alone), and the
arithmetic rate each reaches next to a large matmul's, which says whether the
device was compute-bound (then batching cannot help much) or overhead-bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import torch

from rankexp.models.mlp import ResidualMLP
from rankexp.tasks.data import (
    DEFAULT_CACHE_DIR,
    DEFAULT_ROOT,
    IN_FEATURES,
    DeviceDataset,
    load_cifar10,
)
from rankexp.tasks.train import NUM_CLASSES, STUDY_LRS, Classifier, train


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
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (best kept)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward + loss")
    p.add_argument("--cold", action="store_true", help="also time a cold decode into a temp cache")
    p.add_argument("--root", default=str(DEFAULT_ROOT))
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    lrs = list(STUDY_LRS)

    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} CPU threads")
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
        print(
            f"load average {load:.2f} on {os.cpu_count()} cores"
            + ("  (busy: timings are noisy)" if load > 0.5 else "")
        )

    if args.cold:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            load_cifar10(args.root, tmp, progress=False)
            print(
                f"CIFAR-10 cold load (extract + decode + cache): {time.perf_counter() - t0:.2f} s"
            )
    t0 = time.perf_counter()
    tensors = load_cifar10(args.root, args.cache_dir, progress=False)
    t1 = time.perf_counter()
    data = DeviceDataset.from_uint8(*tensors, device=device)
    _sync(device)
    t2 = time.perf_counter()
    print(
        f"CIFAR-10 load from cache: {t1 - t0:.3f} s; to {device} + normalize: {t2 - t1:.3f} s; total {t2 - t0:.3f} s (target ≤ 2 s)"
    )

    # the timed calls evaluate once at their end; a one-batch test split keeps that cheap
    data = dataclasses.replace(
        data, x_test=data.x_test[: args.batch_size], y_test=data.y_test[: args.batch_size]
    )
    shape = f"d={args.width}, L={args.depth}, m/d={args.expansion:g}, M={args.matrices}, B={args.batch_size}"
    print(f"model {shape}, {len(lrs)} learning rates {lrs}")
    batched_model = build(data, len(lrs), args)
    single_models = [build(data, 1, args) for _ in lrs]
    step_rate(batched_model, data, lrs, args, args.warmup)
    for model, lr in zip(single_models, lrs, strict=True):
        step_rate(model, data, [lr], args, args.warmup)
    # Interleaved rounds, best of each: a busy machine slows both alike, and the
    # fastest round is the least disturbed one.
    batched, sequential = 0.0, 0.0
    for r in range(args.rounds):
        b = step_rate(batched_model, data, lrs, args, args.steps)
        single = [
            step_rate(m, data, [lr], args, args.steps)
            for m, lr in zip(single_models, lrs, strict=True)
        ]
        s = 1.0 / sum(1.0 / x for x in single)  # one sweep step = one step of each model
        print(
            f"  round {r + 1}: batched {b:.3f}, sequential {s:.3f} sweep steps/s (ratio {b / s:.2f})"
        )
        batched, sequential = max(batched, b), max(sequential, s)
    flops = len(lrs) * step_flops(
        args.width, args.depth, args.expansion, args.matrices, args.batch_size
    )
    peak = matmul_rate(device)
    # Fixed cost of a step regardless of size (Python, dispatch, kernel launches): a
    # one-member model of width 8 and the same depth does almost no arithmetic.
    tiny_args = argparse.Namespace(**{**vars(args), "width": 8})
    tiny = build(data, 1, tiny_args)
    step_rate(tiny, data, [lrs[0]], tiny_args, args.warmup)
    overhead = 1.0 / max(
        step_rate(tiny, data, [lrs[0]], tiny_args, args.steps) for _ in range(args.rounds)
    )
    work = 1.0 / batched - overhead  # the batched step's size-dependent part
    bound = (len(lrs) * overhead + work) / (overhead + work)
    print(
        f"batched   ({len(lrs)} members, one model): {batched:7.2f} sweep steps/s  {batched * flops / 1e9:7.1f} GFLOP/s"
    )
    print(
        f"sequential ({len(lrs)} one-member models): {sequential:7.2f} sweep steps/s  {sequential * flops / 1e9:7.1f} GFLOP/s"
    )
    print(f"speed-up batched / sequential: {batched / sequential:.2f}x (target ≥ 2x)")
    print(
        f"fixed cost per step (width-8 model): {overhead * 1e3:.1f} ms of the batched step's "
        f"{1e3 / batched:.1f} ms; batching saves only the {len(lrs) - 1} extra fixed costs, "
        f"so the speed-up can be at most ≈ {bound:.2f}x here"
    )
    print(
        f"reference 2048² float32 matmul: {peak / 1e9:.1f} GFLOP/s; one sweep step = {flops / 1e9:.2f} GFLOP"
    )


if __name__ == "__main__":
    main()
