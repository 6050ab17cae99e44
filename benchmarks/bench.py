"""``python -m benchmarks.bench`` (``make bench``) — the measurement engine's speed claims, measured in one run.

(a) Per-layer profile erank(∂h_l/∂h_0)/d, l = 1…L, at d=256, L=96, m/d=4: the
    forward sweep (one pass, forward-mode block Jacobians) against reverse mode
    (``torch.func.jacrev`` of every prefix h_0 ↦ h_l), both ending in the same SVDs.
(b) Hydra + MLflow overhead per job of a 20-job ``measure`` sweep on a tiny
    network: (T(20 jobs) − T(1 job)) / 19, so process start-up is not counted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.func import jacrev

from rankexp.models.mlp import ResidualMLP
from rankexp.probes.jacobian import forward_sweep
from rankexp.seeding import gaussian_input
from rankexp.spectra import erank


def bench_profile(width: int, depth: int, expansion: float, every: int) -> dict[str, float]:
    """Seconds for all L partial Jacobians ∂h_l/∂h_0 (and with their SVDs): forward sweep vs
    reverse mode (``jacrev`` of the prefix h_0 ↦ h_l, l = 1…L; timed on every ``every``-th
    layer and scaled by Σl, since its cost grows ∝ l)."""
    model = ResidualMLP(width, depth, expansion=expansion, seeds=[0])
    h0 = gaussian_input([0], width)
    forward_sweep(ResidualMLP(width, 2, expansion=expansion, seeds=[0]), h0)  # warm-up
    t0 = time.perf_counter()
    forward_sweep(model, h0, spectra=False)
    t_fwd_jac = time.perf_counter() - t0
    t0 = time.perf_counter()
    sweep = forward_sweep(model, h0)
    t_fwd = time.perf_counter() - t0

    layers = list(range(every, depth + 1, every))
    t_rev_jac = t_rev_svd = worst = 0.0
    for l in layers:
        t0 = time.perf_counter()
        jac = jacrev(lambda x, l=l: model.trajectory(x.reshape(1, 1, -1), upto=l)[l][0, 0])(h0[0, 0])
        t1 = time.perf_counter()
        er = erank(jac)
        t_rev_jac += t1 - t0
        t_rev_svd += time.perf_counter() - t1
        worst = max(worst, abs(er.item() - sweep.erank[0, l - 1].item()) / width)
    scale = sum(range(1, depth + 1)) / sum(layers)
    rev_jac = t_rev_jac * scale
    rev = rev_jac + t_rev_svd * depth / len(layers)
    return {"forward_jac_s": t_fwd_jac, "forward_s": t_fwd, "reverse_jac_s": rev_jac, "reverse_s": rev,
            "reverse_measured_layers": len(layers), "speedup_jac": rev_jac / t_fwd_jac,
            "speedup": rev / t_fwd, "max_erank_diff": worst}


def bench_overhead(jobs: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    tiny = ["width=8", "depth=2", "seeds=1"]

    def sweep(n: int) -> float:
        with tempfile.TemporaryDirectory() as d:
            alphas = ",".join(f"{1 + i / 100:g}" for i in range(n))
            # the store exists before timing: schema creation is a one-off per store
            subprocess.run([sys.executable, "-m", "rankexp", *tiny, "hydra/hydra_logging=disabled"],
                           cwd=d, env=env, check=True, capture_output=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rankexp", *tiny, f"alpha={alphas}", "-m"],
                           cwd=d, env=env, check=True, capture_output=True)
            return time.perf_counter() - t0

    t1, tn = sweep(1), sweep(jobs)
    return {"one_job_s": t1, f"{jobs}_jobs_s": tn, "per_job_s": (tn - t1) / (jobs - 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=96)
    p.add_argument("--expansion", type=float, default=4.0)
    p.add_argument("--every", type=int, default=12, help="time reverse mode on every k-th layer (1 = all)")
    p.add_argument("--jobs", type=int, default=20)
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu, float64")
    r = bench_profile(args.width, args.depth, args.expansion, args.every)
    print(f"(a) per-layer profile d={args.width} L={args.depth} m/d={args.expansion:g}, one seed "
          f"(reverse mode timed on {r['reverse_measured_layers']} layers, scaled by Σl):\n"
          f"    all ∂h_l/∂h_0:       forward sweep {r['forward_jac_s']:.2f} s, reverse mode "
          f"{r['reverse_jac_s']:.1f} s → {r['speedup_jac']:.1f}× faster [target ≥ 10×]\n"
          f"    with the L SVDs:     forward sweep {r['forward_s']:.2f} s, reverse mode "
          f"{r['reverse_s']:.1f} s → {r['speedup']:.1f}× faster; max |Δ erank/d| = {r['max_erank_diff']:.1e}")
    o = bench_overhead(args.jobs)
    print(f"(b) Hydra+MLflow overhead per job ({args.jobs}-job sweep, tiny net): {o['per_job_s']:.3f} s "
          f"[target ≤ 0.3 s] (1 job {o['one_job_s']:.1f} s, {args.jobs} jobs {o[f'{args.jobs}_jobs_s']:.1f} s)")
    extra = Path(__file__).with_name("bench_train.py")
    if extra.exists():
        print("--- training (python -m benchmarks.bench_train)")
        sys.stdout.flush()
        subprocess.run([sys.executable, "-m", "benchmarks.bench_train"], check=False)


if __name__ == "__main__":
    main()
