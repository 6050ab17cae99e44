"""The engine's profile against automatic differentiation, warm, in one process.

    python -m benchmarks.engine                # d=256, L=96, m/d=4, float64 (minutes: reverse mode)
    python -m benchmarks.engine --depth 24 --rounds 5

The profile is every ``∂h_l/∂h_0``, l = 1…L, and its effective rank (Eq. 3), for one seed of
the residual MLP (Pre-RMSNorm, ReLU, M = 2).  Three ways, each warmed up once, then timed in
alternating rounds:

* the engine: ``forward_sweep`` with the ``profile`` probe's needs;
* forward mode: one ``torch.func.jacfwd`` of ``h_0 ↦ (h_1, …, h_L)`` (one pass, every prefix);
* reverse mode: one ``torch.func.jacrev`` of ``h_0 ↦ h_l`` for every l (reverse mode needs a
  pass per prefix).

The two AD ways differentiate the model's own ``trajectory`` and take each spectrum the same
way (eigenvalues of the Gram matrix ``JᵀJ``), and must agree with the engine's erank/d.
"""

from __future__ import annotations

import argparse

import torch

from rankexp.models.mlp import ResidualMLP
from rankexp.probes import PROBES
from rankexp.probes.jacobian import forward_sweep
from rankexp.spectra import erank_from_sv, gram_eigenvalues

from .common import alternate, header, load, ratio, spread, timer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=96)
    p.add_argument("--expansion", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    header("benchmarks.engine")
    d, depth = args.width, args.depth
    model = ResidualMLP(d, depth, expansion=args.expansion, seeds=[0]).requires_grad_(False)
    h0 = torch.randn(1, 1, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    needs = PROBES["profile"].needs

    def trajectory(x: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        return torch.stack(model.trajectory(x.reshape(1, 1, d), upto)[1:]).reshape(-1, d)

    def erank(j: torch.Tensor) -> torch.Tensor:  # from the eigenvalues of JᵀJ
        return erank_from_sv(gram_eigenvalues(j).sqrt())

    def forward_mode() -> torch.Tensor:
        return erank(torch.func.jacfwd(trajectory)(h0.reshape(d)))

    def reverse_mode() -> torch.Tensor:
        return torch.stack([erank(torch.func.jacrev(lambda x, l=l: trajectory(x, l)[-1])(h0.reshape(d)))
                            for l in range(1, depth + 1)])

    ref = forward_sweep(model, h0, needs=needs).erank[0] / d  # these calls are the warm-up
    worst = {name: float((fn() / d - ref).abs().max()) for name, fn in
             (("forward", forward_mode), ("reverse", reverse_mode))}
    print(f"profile of d={d} L={depth} m/d={args.expansion:g}, one seed, float64; {args.rounds} "
          f"alternating rounds after a warm-up; max |Δ erank/d| vs the engine: forward "
          f"{worst['forward']:.1e}, reverse {worst['reverse']:.1e}", flush=True)
    t = alternate({"engine": timer(lambda: forward_sweep(model, h0, needs=needs)),
                   "forward": timer(forward_mode), "reverse": timer(reverse_mode)}, args.rounds, warm=False)
    print(f"  engine                          {spread(t['engine'])}")
    print(f"  forward mode (jacfwd, one pass) {spread(t['forward'])} → {ratio(t['forward'], t['engine'])} the engine")
    print(f"  reverse mode (jacrev per l)     {spread(t['reverse'])} → {ratio(t['reverse'], t['engine'])} the engine")
    print(f"  ({load()})")


if __name__ == "__main__":
    main()
