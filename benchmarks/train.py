"""The training loop against a minimal loop, both timed the same way, in one process.

    python -m benchmarks.train                       # d=256, L=12, m/d=1, B=256, 1 thread
    python -m benchmarks.train --depth 48 --steps 10

Each contender is one call that trains ``--steps`` Adam steps of one member (float32) and then
evaluates the test split, timed from outside by the same clock, in alternating rounds after a
warm-up: ``rankexp.tasks.train.train`` on the study's network, and a minimal loop written here
on the same weights as plain 2-D tensors (Pre-RMSNorm blocks ``h + β W_down relu(W_up rms(h))``,
an input projection and a head; ``torch.optim.Adam``, ``F.cross_entropy``; no divergence
tracking, no per-member learning rates).  The data are CIFAR-shaped noise (step time does not
depend on the pixels).
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.nn import functional as F

from rankexp.models.classifier import Classifier
from rankexp.models.mlp import ResidualMLP
from rankexp.tasks.data import DeviceDataset
from rankexp.tasks.train import train

from .common import alternate, header, load, ratio, spread, timer


class MinimalLoop:
    """One member's network as plain tensors, copied from ``model`` (checked: the same loss)."""

    def __init__(self, model: Classifier, data: DeviceDataset, batch: int, lr: float):
        take = lambda p: p.detach()[0].clone().requires_grad_()  # noqa: E731
        self.w_in, self.w_out = take(model.w_in), take(model.w_out)
        self.blocks = [(take(b.w_up), take(b.w_down)) for b in model.stack.blocks]
        self.beta, self.data, self.batch, self.lr = model.stack.beta_eff, data, batch, lr
        self.perm = torch.randperm(data.x_train.shape[0], generator=torch.Generator().manual_seed(0))
        self.k = 0

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w_in.T
        for up, down in self.blocks:
            r = h * (math.sqrt(h.shape[-1]) / h.norm(dim=-1, keepdim=True))
            h = h + self.beta * (F.relu(r @ up.T) @ down.T)
        return h @ self.w_out.T

    def __call__(self, steps: int) -> float:
        """Train ``steps`` steps, then the test accuracy."""
        opt = torch.optim.Adam([self.w_in, *(w for pair in self.blocks for w in pair), self.w_out], lr=self.lr)
        per_epoch = len(self.perm) // self.batch
        for _ in range(steps):
            idx = self.perm[(self.k % per_epoch) * self.batch:][:self.batch]
            self.k += 1
            loss = F.cross_entropy(self.logits(self.data.x_train[idx]), self.data.y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            return (self.logits(self.data.x_test).argmax(-1) == self.data.y_test).float().mean().item()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--expansion", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=20, help="steps per call")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    header("benchmarks.train")
    b, g = args.batch_size, torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8192 + b, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (8192 + b,), generator=g)
    data = DeviceDataset.from_uint8(x[:8192], y[:8192], x[8192:], y[8192:])
    model = Classifier(ResidualMLP(args.width, args.depth, expansion=args.expansion, seeds=[0],
                                   dtype=torch.float32))
    ref = MinimalLoop(model, data, b, 1e-3)
    with torch.no_grad():
        x0, y0 = data.x_train[:b], data.y_train[:b]
        same = F.cross_entropy(ref.logits(x0), y0).item(), F.cross_entropy(model(x0)[0], y0).item()
    if abs(same[0] - same[1]) > 1e-4 * abs(same[0]):
        raise SystemExit(f"the minimal loop is not the same network: losses {same}")
    kw = dict(steps=args.steps, eval_every=args.steps, batch_size=b, eval_batch_size=b, progress=False)
    t = alternate({"minimal": timer(lambda: ref(args.steps)),
                   "train": timer(lambda: train(model, data, [1e-3], **kw))}, args.rounds)
    print(f"one member, Adam, float32, d={args.width} L={args.depth} m/d={args.expansion:g} B={b}: "
          f"{args.steps} steps + one evaluation per call, {args.rounds} rounds; per step:")
    per = {k: [s / args.steps for s in v] for k, v in t.items()}
    print(f"  minimal loop  {spread(per['minimal'], 1e3, '.1f', 'ms')}")
    print(f"  train()       {spread(per['train'], 1e3, '.1f', 'ms')} → {ratio(per['train'], per['minimal'])} "
          f"the minimal loop [target ≤ 1.05×]")
    print(f"  ({load()})")


if __name__ == "__main__":
    main()
