"""The degradation replication's cost: FLOPs per training step, measured CPU step times, and the
projected wall time of the full replication (10 networks × 164 epochs) at given GPU rates.

    python -m benchmarks.bench_convnet [--steps 3] [--batch 128] [--gpu-tflops 5 20 50]

FLOPs are counted per operator by ``torch.utils.flop_counter.FlopCounterMode`` (forward and
backward of one step: convolutions and matrix products, 2 FLOPs per multiply-add; batch norm,
ReLU and the optimizer's elementwise work are not counted). The CPU step time is measured here
on one thread (the house rule on this shared machine); the GPU figures are projections at an
assumed *sustained* rate — small-channel CIFAR convs (16–64 filters) run far below a GPU's
peak, so several rates are shown rather than one guess. Where a GPU is present, ``--cuda``
also measures its step time (eager; add ``--bf16``).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from rankexp.models.convnet import HE_DEPTHS, CifarResNet
from rankexp.tasks.augment import PadCropFlip
from rankexp.tasks.recipes import MemberSGD, decays
from rankexp.tasks.train import member_losses

from .common import header

EPOCHS, TRAIN, TEST = 164, 50_000, 10_000


def step_flops(depth: int, batch: int) -> tuple[float, float]:
    """(train-step FLOPs, forward FLOPs) of one batch for a depth-``depth`` network."""
    model = CifarResNet(depth)
    x, y = torch.randn(batch, 3 * 32 * 32), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as fwd:
        model(x)
    forward = fwd.get_total_flops()
    with FlopCounterMode(display=False) as total:
        member_losses(model(x), y).sum().backward()
    return float(total.get_total_flops()), float(forward)


def step_seconds(depth: int, batch: int, steps: int, device: str, bf16: bool) -> float:
    """Fastest wall time of one full training step (augment, forward, backward, SGD) on ``device``."""
    model = CifarResNet(depth, device=device)
    params = list(model.parameters())
    opt = MemberSGD(params, [0.1], momentum=0.9, weight_decay=1e-4, decay=[decays(p) for p in params])
    aug = PadCropFlip(steps + 1, batch, 0, device=device)
    x = torch.randn(batch, 3 * 32 * 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    alive = torch.ones(1, dtype=torch.bool, device=device)
    times = []
    for s in range(steps + 1):  # the first is warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss = member_losses(model(aug(x, s)), y).sum()
        loss.backward()
        opt.step(alive)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times[1:])  # the least disturbed step on a shared machine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_convnet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="timed steps per depth (default 3)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--gpu-tflops", type=float, nargs="+", default=[5.0, 20.0, 50.0],
                   help="sustained GPU rates to project at, TFLOP/s (default 5 20 50)")
    p.add_argument("--cuda", action="store_true", help="also time the steps on CUDA")
    p.add_argument("--bf16", action="store_true", help="(with --cuda) under bf16 autocast")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    steps_per_run = EPOCHS * (TRAIN // args.batch)
    total, total_cpu, total_gpu = 0.0, 0.0, 0.0
    head = f"{'depth':>5} {'GFLOP/step':>10} {'CPU s/step':>10} {'CPU GFLOP/s':>11}"
    print(header("benchmarks.bench_convnet (the degradation replication's cost)"))
    print(f"one training step at batch {args.batch}, {steps_per_run} steps per run "
          f"({EPOCHS} epochs); per run also {EPOCHS} test evaluations + probes")
    print(head + (f" {'GPU s/step':>10}" if args.cuda else ""))
    for depth in HE_DEPTHS:
        flops, fwd = step_flops(depth, args.batch)
        cpu = step_seconds(depth, args.batch, args.steps, "cpu", False)
        # a run: the training steps, a test evaluation per epoch, the clean train error,
        # the lesions (≈ half a forward per block) and responses on the test set
        n = (depth - 2) // 6
        per_image_fwd = fwd / args.batch
        run = steps_per_run * flops + per_image_fwd * (EPOCHS * TEST + TRAIN + TEST * (1 + 1.5 * n))
        total += 2 * run  # plain and residual: the same FLOPs (option A has none)
        total_cpu += 2 * run / (flops / cpu)
        line = f"{depth:>5} {flops / 1e9:>10.2f} {cpu:>10.3f} {flops / cpu / 1e9:>11.1f}"
        if args.cuda:
            gpu = step_seconds(depth, args.batch, args.steps, "cuda", args.bf16)
            total_gpu += 2 * steps_per_run * gpu
            line += f" {gpu:>10.4f}"
        print(line)
    print(f"\nfull replication (10 runs): {total / 1e15:.1f} PFLOP")
    print(f"  this CPU, one thread, at its measured rate: {total_cpu / 3600 / 24:.0f} days")
    for rate in args.gpu_tflops:
        print(f"  GPU at a sustained {rate:g} TFLOP/s: {total / (rate * 1e12) / 3600:.1f} GPU-hours")
    if args.cuda:
        print(f"  this GPU, measured steps (training only): {total_gpu / 3600:.2f} GPU-hours")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
