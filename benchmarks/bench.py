"""``python -m benchmarks.bench`` (``make bench``) — the measurement engine's speed claims, measured in one run.

Every ratio below is measured in the same process on the same machine state (torch pinned to
one thread unless ``--threads``), at the study's benchmark point d=256, L=96, m/d=4, M=2, ReLU,
Pre-RMSNorm, one seed (``--width/--depth/--expansion`` change it):

(a) the machine's float64/float32 matmul peak (a 1024³ GEMM), the yardstick for GFLOP/s;
(b) the final ``∂h_L/∂h_0`` and its singular values: the engine (``forward_sweep(…,
    spectra=False)``) against a *plain analytic loop* written here without engine code (each
    block Jacobian ``J_P``, ``J_f = W_down diag(σ′) W_up`` and ``J_b = β J_f J_P`` formed
    densely, ``P ← P + J_b P`` multiplied densely) and against reverse mode (one
    ``torch.func.jacrev`` of h_0 ↦ h_L); float64 and float32;
(c) the full profile (every ∂h_l/∂h_0 and its L SVDs): engine vs the plain loop vs reverse mode
    per prefix (``jacrev`` of h_0 ↦ h_l for every l, timed on every ``--every``-th l and scaled by
    Σl since its cost grows ∝ l);
(d) 8 seeds as one batched sweep vs 8 one-seed sweeps;
(e) ``measure_seconds`` of a fresh ``python -m rankexp … task.probes=[io_jacobian]`` process (so
    one-off costs such as the first ``torch.func`` call's import of ``torch._dynamo`` count);
(f) with ``--v1 REF`` (default: the last commit of v1's engine), rows (b) and (c) of that
    commit's engine, timed in a subprocess of this run, so "× faster than v1" is measured too;
(g) Hydra + MLflow overhead per job of a 20-job ``measure`` sweep on a tiny network:
    (T(20 jobs) − T(1 job)) / 19, so process start-up is not counted;
(h) the training benchmark (``benchmarks/bench_train.py``).

``--only engine`` runs (a)–(f); ``--engine-json`` prints rows (b)–(c) of whatever ``rankexp`` is
importable as JSON (what (f) runs against the old commit).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rankexp.models.mlp import ResidualMLP
from rankexp.probes.jacobian import forward_sweep
from rankexp.seeding import gaussian_input
from rankexp.spectra import erank

ROOT = Path(__file__).resolve().parents[1]
#: v1's engine (vmap(jacfwd) block Jacobians, every per-layer SVD): the relayout commit on main
V1_COMMIT = "89ee409"


def best_of(fn, repeat: int) -> float:
    """Fastest of ``repeat`` wall-clock timings of ``fn()`` (seconds): the least-disturbed run."""
    return race({"fn": fn}, repeat)["fn"]


def race(fns: dict, repeat: int) -> dict[str, float]:
    """Fastest of ``repeat`` timings of each function, run round-robin so that the load of a
    shared machine disturbs every contestant alike (the ratios are what this file reports)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


# --------------------------------------------------------------------------- (a) peak
def matmul_peak(dtype: torch.dtype, n: int = 1024, repeat: int = 3) -> float:
    """GFLOP/s of an n×n×n GEMM (2n³ FLOP), best of ``repeat``."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    return 2 * n**3 / best_of(lambda: a @ b, repeat) / 1e9


# --------------------------------------------------------------------------- (b, c) plain loop
def plain_loop(model: ResidualMLP, h0: torch.Tensor, profile: bool) -> tuple[torch.Tensor, list[float]]:
    """The reference a careful hand-written loop gets, sharing no engine code.

    Pre-RMSNorm ReLU blocks, member 0 only: ``J_P = c (I − x̂x̂ᵀ)`` formed as a d×d matrix,
    ``J_f = (W_down ⊙ σ′) W_up`` (dense, 2md² FLOP), ``J_b = β J_f J_P`` (a d×d product) and
    ``P ← (P + J_b P)/‖·‖_F`` (a d×d product), i.e. ``2md² + 4d³`` FLOP per block.

    Returns the final unit-Frobenius product and, if ``profile``, erank/d of every partial.
    """
    d = model.width
    eye = torch.eye(d, dtype=h0.dtype)
    p = eye / math.sqrt(d)
    h = h0[0, 0]
    ranks = []
    for block in model.blocks:
        w_up, w_down = block.w_up[0], block.w_down[0]
        norm = h.norm()
        xhat = h / norm
        jp = (math.sqrt(d) / norm) * (eye - torch.outer(xhat, xhat))
        z = w_up @ (math.sqrt(d) * xhat)
        jf = (w_down * (z > 0).to(h.dtype)) @ w_up
        jb = block.beta * (jf @ jp)
        p = p + jb @ p
        p = p / torch.linalg.matrix_norm(p)
        h = h + block.beta * (w_down @ torch.relu(z))
        if profile:
            ranks.append(float(erank(p.detach())) / d)
    return p, ranks


def plain_loop_flops(width: int, depth: int, expansion: float) -> float:
    m = round(expansion * width)
    return depth * (2 * m * width**2 + 4 * width**3)


def engine_flops(model: ResidualMLP, h0: torch.Tensor) -> float:
    """FLOP the closed-form engine needs for ∂h_L/∂h_0: per block ``2|a|d²`` for
    ``J_f = W_down[:, a] W_up[a, :]`` over the |a| active ReLU units, plus ``2d³`` for the product."""
    d, flops, h = model.width, 0.0, h0
    with torch.no_grad():
        for block in model.blocks:
            active = int((block.preactivation(h) > 0).sum())
            flops += 2 * active * d**2 + 2 * d**3
            h = block(h, h)
    return flops


# --------------------------------------------------------------------------- engine rows
def engine_fns(width: int, depth: int, expansion: float, plain: bool = False) -> dict:
    """The timed calls: the engine's final Jacobian + SVD (float64, float32) and full profile,
    and with ``plain`` the same rows of the plain loop.

    The engine rows use only the API v1 and this version share (``forward_sweep(model, h0,
    spectra=…)``), so the same function times the old commit's engine in (f).
    """
    fns = {}
    for name, dtype in (("64", torch.float64), ("32", torch.float32)):
        model = ResidualMLP(width, depth, expansion=expansion, seeds=[0], dtype=dtype)
        h0 = gaussian_input([0], width, dtype=dtype)
        forward_sweep(ResidualMLP(width, 2, expansion=expansion, seeds=[0], dtype=dtype), h0)  # warm-up
        fns[f"final{name}_s"] = lambda m=model, h=h0: forward_sweep(m, h, spectra=False)
        if plain:
            fns[f"plain_final{name}_s"] = lambda m=model, h=h0: torch.linalg.svdvals(plain_loop(m, h, False)[0])
        if dtype == torch.float64:
            fns["profile_s"] = lambda m=model, h=h0: forward_sweep(m, h)
            if plain:
                fns["plain_profile_s"] = lambda m=model, h=h0: plain_loop(m, h, True)
    return fns


def engine_rows(width: int, depth: int, expansion: float, repeat: int) -> dict[str, float]:
    """Seconds of :func:`engine_fns` (what ``--engine-json`` prints)."""
    return race(engine_fns(width, depth, expansion), repeat)


def bench_engine(args) -> dict[str, float]:
    w, L, x, rep = args.width, args.depth, args.expansion, args.repeat
    r: dict[str, float] = {"peak64": matmul_peak(torch.float64), "peak32": matmul_peak(torch.float32)}
    r.update(race(engine_fns(w, L, x, plain=True), rep))
    model = ResidualMLP(w, L, expansion=x, seeds=[0])
    h0 = gaussian_input([0], w)
    sweep = forward_sweep(model, h0)
    _, ranks = plain_loop(model, h0, True)
    r["plain_max_diff"] = max(abs(a - b) for a, b in zip(ranks, (sweep.erank[0] / w).tolist(), strict=True))
    r["engine_flops"] = engine_flops(model, h0)
    r["plain_flops"] = plain_loop_flops(w, L, x)
    t0 = time.perf_counter()
    jac = torch.func.jacrev(lambda v: model(v.reshape(1, 1, -1))[0, 0])(h0[0, 0])
    torch.linalg.svdvals(jac)
    r["jacrev_final64_s"] = time.perf_counter() - t0
    r.update(reverse_per_prefix(w, L, x, args.every))
    r.update(seeds_batched(w, L, x, args.seeds))
    r.update(fresh_process(w, L, x))
    return r


def reverse_per_prefix(width: int, depth: int, expansion: float, every: int) -> dict[str, float]:
    """All L partials and their SVDs by reverse mode: ``jacrev`` of every prefix h_0 ↦ h_l."""
    model = ResidualMLP(width, depth, expansion=expansion, seeds=[0])
    h0 = gaussian_input([0], width)
    sweep = forward_sweep(model, h0)
    layers = list(range(every, depth + 1, every))
    t_rev, worst = 0.0, 0.0
    for l in layers:
        t0 = time.perf_counter()
        jac = torch.func.jacrev(lambda v, l=l: model.trajectory(v.reshape(1, 1, -1), upto=l)[l][0, 0])(h0[0, 0])
        er = erank(jac)
        t_rev += time.perf_counter() - t0
        worst = max(worst, abs(er.item() - sweep.erank[0, l - 1].item()) / width)
    return {"reverse_profile_s": t_rev * sum(range(1, depth + 1)) / sum(layers),
            "reverse_layers": len(layers), "reverse_max_diff": worst}


def seeds_batched(width: int, depth: int, expansion: float, seeds: int) -> dict[str, float]:
    """Final Jacobian + SVD of ``seeds`` seeds: one batched sweep vs one sweep per seed."""
    ids = list(range(seeds))
    h = gaussian_input(ids, width)
    batched = ResidualMLP(width, depth, expansion=expansion, seeds=ids)
    t_b = best_of(lambda: forward_sweep(batched, h, spectra=False), 1)
    batched = None  # free its weights before the one-seed runs
    t_s = 0.0
    for s in ids:
        one = ResidualMLP(width, depth, expansion=expansion, seeds=[s])
        h1 = gaussian_input([s], width)
        t_s += best_of(lambda m=one, v=h1: forward_sweep(m, v, spectra=False), 1)
    return {"seeds": seeds, "seeds_batched_s": t_b, "seeds_separate_s": t_s}


def fresh_process(width: int, depth: int, expansion: float, pythonpath: str | None = None) -> dict[str, float]:
    """``measure_seconds`` and wall time of a fresh ``python -m rankexp … task.probes=[io_jacobian]``
    (of the ``rankexp`` on ``pythonpath`` when given)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env = {k: v for k, v in env.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "rankexp", f"width={width}", f"depth={depth}",
               f"expansion={expansion:g}", "seeds=1", "task.probes=[io_jacobian]", "tracking=off",
               "device=cpu", f"hydra.run.dir={d}/run"]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=d, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        doc = json.loads((Path(d) / "run" / "result" / "result.json").read_text())
    return {"fresh_measure_s": doc["scalars"]["measure_seconds"], "fresh_wall_s": wall,
            "fresh_build_s": doc["scalars"].get("build_seconds", float("nan"))}


def bench_v1(commit: str, args) -> dict[str, float] | None:
    """Rows (b)/(c) of ``commit``'s engine: its ``rankexp`` extracted by ``git archive``, timed by
    this file's :func:`engine_rows` in a subprocess."""
    with tempfile.TemporaryDirectory() as d:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "rankexp", "conf"],
                                 capture_output=True)
        if archive.returncode:
            print(f"    (no v1 comparison: git archive {commit} failed: {archive.stderr.decode().strip()})")
            return None
        subprocess.run(["tar", "-x", "-C", d], input=archive.stdout, check=True)
        env = {**os.environ, "PYTHONPATH": d}
        cmd = [sys.executable, str(Path(__file__)), "--engine-json", "--width", str(args.width),
               "--depth", str(args.depth), "--expansion", str(args.expansion), "--repeat", str(args.repeat),
               "--threads", str(args.threads)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode:
            print(f"    (v1 run failed: {res.stderr.strip().splitlines()[-1:]})")
            return None
        out = json.loads(res.stdout.strip().splitlines()[-1])
        fresh = fresh_process(args.width, args.depth, args.expansion, pythonpath=d)
        return {**out, "fresh_measure_s": fresh["fresh_measure_s"], "fresh_wall_s": fresh["fresh_wall_s"]}


def report_engine(r: dict[str, float], v1: dict[str, float] | None, args) -> None:
    w, L, x = args.width, args.depth, args.expansion
    gf = r["engine_flops"] / r["final64_s"] / 1e9
    print(f"(a) matmul peak (1024³ GEMM): float64 {r['peak64']:.1f} GFLOP/s, float32 {r['peak32']:.1f} GFLOP/s")
    print(f"(b) final ∂h_L/∂h_0 + SVD, d={w} L={L} m/d={x:g} M=2 ReLU pre-RMSNorm, one seed:")
    for n in ("64", "32"):
        e, p = r[f"final{n}_s"], r[f"plain_final{n}_s"]
        line = f"    float{n}: engine {e:.3f} s, plain loop {p:.3f} s → engine/plain = {e / p:.2f}× [target ≤ 0.8×]"
        if v1:
            line += f"; v1 {v1[f'final{n}_s']:.3f} s → {v1[f'final{n}_s'] / e:.2f}× faster than v1 [≈ 3×]"
        print(line)
    print(f"    reverse mode (one jacrev of h_0 ↦ h_L + SVD): {r['jacrev_final64_s']:.3f} s → "
          f"engine {r['jacrev_final64_s'] / r['final64_s']:.1f}× faster")
    print(f"    engine {r['engine_flops'] / 1e9:.2f} GFLOP (plain loop {r['plain_flops'] / 1e9:.2f}) → "
          f"{gf:.1f} GFLOP/s = {gf / r['peak64']:.0%} of the float64 peak")
    e, p = r["profile_s"], r["plain_profile_s"]
    line = (f"(c) full profile (all L partials + L SVDs): engine {e:.3f} s, plain loop {p:.3f} s → "
            f"engine/plain = {e / p:.2f}× [target ≤ 0.8×]")
    if v1:
        line += f"; v1 {v1['profile_s']:.3f} s → {v1['profile_s'] / e:.2f}× faster than v1"
    print(line + f"; max |Δ erank/d| vs plain = {r['plain_max_diff']:.1e}")
    print(f"    reverse mode per prefix (timed on {r['reverse_layers']} layers, scaled by Σl): "
          f"{r['reverse_profile_s']:.1f} s → engine {r['reverse_profile_s'] / e:.0f}× faster [target ≥ 100×]; "
          f"max |Δ erank/d| = {r['reverse_max_diff']:.1e}")
    print(f"(d) {r['seeds']} seeds, final Jacobian + SVD: batched {r['seeds_batched_s']:.2f} s vs "
          f"{r['seeds']} runs {r['seeds_separate_s']:.2f} s → {r['seeds_separate_s'] / r['seeds_batched_s']:.2f}×")
    print(f"(e) fresh `python -m rankexp … task.probes=[io_jacobian]`: measure_seconds {r['fresh_measure_s']:.2f} s "
          f"(drawing the weights {r['fresh_build_s']:.2f} s; process wall {r['fresh_wall_s']:.1f} s)"
          + (f"; v1 {v1['fresh_measure_s']:.2f} s (wall {v1['fresh_wall_s']:.1f} s)" if v1 else ""))


# --------------------------------------------------------------------------- (g) sweep overhead
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
    p.add_argument("--repeat", type=int, default=3, help="timings per row; the fastest is kept")
    p.add_argument("--seeds", type=int, default=8, help="seeds for row (d)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the shared-machine rule)")
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--v1", default=V1_COMMIT, help="commit whose engine row (f) times ('' to skip)")
    p.add_argument("--only", choices=("engine", "all"), default="all")
    p.add_argument("--engine-json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.engine_json:
        print(json.dumps(engine_rows(args.width, args.depth, args.expansion, args.repeat)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), device cpu")
    v1 = bench_v1(args.v1, args) if args.v1 else None
    r = bench_engine(args)
    if v1:  # once before and once after this version's rows: keep the faster of each
        again = bench_v1(args.v1, args) or v1
        v1 = {k: min(v, again[k]) for k, v in v1.items()}
    report_engine(r, v1, args)
    if args.only == "engine":
        return
    o = bench_overhead(args.jobs)
    print(f"(g) Hydra+MLflow overhead per job ({args.jobs}-job sweep, tiny net): {o['per_job_s']:.3f} s "
          f"[target ≤ 0.1 s] (1 job {o['one_job_s']:.1f} s, {args.jobs} jobs {o[f'{args.jobs}_jobs_s']:.1f} s)")
    extra = Path(__file__).with_name("bench_train.py")
    if extra.exists():
        print("--- (h) training (python -m benchmarks.bench_train)")
        sys.stdout.flush()
        subprocess.run([sys.executable, "-m", "benchmarks.bench_train"], check=False)


if __name__ == "__main__":
    main()
