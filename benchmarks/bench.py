"""``python -m benchmarks.bench`` (``make bench``) — the measurement engine's speed claims and the
whole job's, every ratio measured in one run.

Every ratio below is measured in the same process (or in subprocesses of the same run, timed in
alternating rounds) on the same machine state, torch pinned to one thread unless ``--threads``,
with the commit and the load average printed beside it, at the study's benchmark point d=256,
L=96, m/d=4, M=2, ReLU, Pre-RMSNorm, one seed (``--width/--depth/--expansion`` change it):

(a) the machine's float64/float32 matmul peak (a 1024³ GEMM), the yardstick for GFLOP/s;
(b) the final ``∂h_L/∂h_0`` and its singular values: the engine (``forward_sweep(…,
    spectra=False)``) against a *plain analytic loop* written here without engine code (each
    block Jacobian ``J_P``, ``J_f = W_down diag(σ′) W_up`` and ``J_b = β J_f J_P`` formed
    densely, ``P ← P + J_b P`` multiplied densely) and against reverse mode (one
    ``torch.func.jacrev`` of h_0 ↦ h_L); float64 and float32;
(c) the full profile (every ∂h_l/∂h_0 and its spectrum): the engine against the plain loop, and
    against reverse mode the fair way — ``jacrev`` of a plain functional forward (no module) on
    *every* prefix h_0 ↦ h_l, l = 1…L, each with the same spectrum routine, the engine's own
    profile timed in between (interleaved), nothing scaled; before (main before issue 18, SVD
    spectra) → after (Gram spectra where exact); one spectrum by Gram matrix vs SVD;
(d) 8 seeds as one batched sweep vs 8 one-seed sweeps (the engine alone);
(f) with ``--v1 REF`` (default: the last commit of v1's engine), rows (b) and (c) of that
    commit's engine, timed in the same rounds, so "× faster than v1" is measured too; drawing the
    network (its weights) before → after, in the same rounds;
(g) the whole job, before → after (``benchmarks/bench_job.py``): a fresh job's imports,
    composition, weights and measurement; 8 seeds in one job vs 8 jobs; the sweep's overhead
    per job; memory in budget;
(h) the training benchmark (``benchmarks/bench_train.py``).

``--only engine`` runs (a)–(f); ``--engine-json`` prints rows (b)–(c) of whatever ``rankexp`` is
importable as JSON.  Older engines (v1, before) are imported in this process under other package
names and timed in the same rounds as this one (:func:`benchmarks.common.import_as`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
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

from .common import BEFORE_COMMIT, header, import_as, load, verdict

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
@dataclasses.dataclass(frozen=True)
class Engine:
    """One version's engine: the few names every version since v1 has."""

    prefix: str  # "" for this checkout, "v1_", "before_"
    mlp: type
    forward_sweep: object
    gaussian_input: object


def engines(dest: Path, refs: dict[str, str]) -> list[Engine]:
    """This checkout's engine and, in the same process, each ``prefix → commit`` of ``refs``
    (imported under another package name: :func:`benchmarks.common.import_as`)."""
    out = [Engine("", ResidualMLP, forward_sweep, gaussian_input)]
    for prefix, ref in refs.items():
        if not ref or import_as(ref, f"rankexp_{prefix}", dest / prefix) is None:
            continue
        mods = [importlib.import_module(f"rankexp_{prefix}.{m}") for m in
                ("models.mlp", "probes.jacobian", "seeding")]
        out.append(Engine(f"{prefix}_", mods[0].ResidualMLP, mods[1].forward_sweep, mods[2].gaussian_input))
    return out


def engine_fns(width: int, depth: int, expansion: float, plain: bool = False,
               versions: list[Engine] | None = None) -> dict:
    """The timed calls of each engine version: the final Jacobian + SVD (float64, float32), the
    full profile and drawing the network; with ``plain`` the same rows of the plain loop.

    The engine rows use only the API v1 and this version share (``forward_sweep(model, h0,
    spectra=…)``), so the same function times every version, in the same rounds.
    """
    fns = {}
    for v in versions or [Engine("", ResidualMLP, forward_sweep, gaussian_input)]:
        for name, dtype in (("64", torch.float64), ("32", torch.float32)):
            model = v.mlp(width, depth, expansion=expansion, seeds=[0], dtype=dtype)
            h0 = v.gaussian_input([0], width, dtype=dtype)
            v.forward_sweep(v.mlp(width, 2, expansion=expansion, seeds=[0], dtype=dtype), h0)  # warm-up
            fns[f"{v.prefix}final{name}_s"] = lambda m=model, h=h0, f=v.forward_sweep: f(m, h, spectra=False)
            fns[f"{v.prefix}draw{name}_s"] = lambda v=v, dt=dtype: v.mlp(width, depth, expansion=expansion,
                                                                           seeds=[0], dtype=dt)
            if plain and not v.prefix:
                fns[f"plain_final{name}_s"] = lambda m=model, h=h0: torch.linalg.svdvals(plain_loop(m, h, False)[0])
            if dtype == torch.float64:
                fns[f"{v.prefix}profile_s"] = lambda m=model, h=h0, f=v.forward_sweep: f(m, h)
                if plain and not v.prefix:
                    fns["plain_profile_s"] = lambda m=model, h=h0: plain_loop(m, h, True)
    return fns


def engine_rows(width: int, depth: int, expansion: float, repeat: int) -> dict[str, float]:
    """Seconds of :func:`engine_fns` (what ``--engine-json`` prints)."""
    return race(engine_fns(width, depth, expansion), repeat)


def bench_engine(args, versions: list[Engine]) -> dict[str, float]:
    w, L, x, rep = args.width, args.depth, args.expansion, args.repeat
    r: dict[str, float] = {"peak64": matmul_peak(torch.float64), "peak32": matmul_peak(torch.float32)}
    r.update(race(engine_fns(w, L, x, plain=True, versions=versions), rep))
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
    r.update(spectra_rows(model, h0, rep))
    r.update(seeds_batched(w, L, x, args.seeds))
    return r


def spectra_rows(model: ResidualMLP, h0: torch.Tensor, repeat: int) -> dict[str, float]:
    """One spectrum of a d×d partial by the Gram matrix vs an SVD, and the engine's profile with
    each (the engine picks by this measurement: :data:`rankexp.probes.jacobian.PROFILE_SPECTRA`)."""
    from rankexp.spectra import gram_ranks, singular_values

    u = forward_sweep(model, h0, spectra=False).io_unit
    times = race({"gram_one_s": lambda: gram_ranks(u), "svd_one_s": lambda: singular_values(u),
                  "profile_gram_s": lambda: forward_sweep(model, h0, spectra_method="gram"),
                  "profile_svd_s": lambda: forward_sweep(model, h0, spectra_method="svd")}, repeat)
    return times


def plain_functional(model: ResidualMLP):
    """The benchmark point as a pure function ``f(h_0, l) = h_l`` of plain tensors (Pre-RMSNorm
    ReLU blocks ``h + β W_down relu(W_up rms(h))``): what reverse mode is fairly timed on."""
    d = model.width
    ups = [b.w_up[0].detach() for b in model.blocks]
    downs = [b.w_down[0].detach() for b in model.blocks]
    beta = model.blocks[0].beta

    def f(x: torch.Tensor, depth: int) -> torch.Tensor:
        for up, down in zip(ups[:depth], downs[:depth], strict=True):
            x = x + beta * (down @ torch.relu(up @ (x * (math.sqrt(d) / torch.linalg.vector_norm(x)))))
        return x

    return f


def reverse_every_prefix(width: int, depth: int, expansion: float, every: int,
                         versions: list[Engine]) -> dict[str, float]:
    """The profile by reverse mode, honestly: ``jacrev`` of :func:`plain_functional` on every prefix
    h_0 ↦ h_l, l = 1…L, each followed by the engine's own spectrum routine; every engine
    version's profile timed after every ``every``-th prefix (interleaved: all see the same
    machine), the fastest of those runs kept; nothing scaled."""
    from rankexp.probes.jacobian import PROFILE_SPECTRA
    from rankexp.spectra import spectral_ranks

    model = ResidualMLP(width, depth, expansion=expansion, seeds=[0])
    h0 = gaussian_input([0], width)
    f = plain_functional(model)
    assert torch.allclose(f(h0[0, 0], depth), model(h0)[0, 0], rtol=1e-12, atol=1e-12)
    ref = forward_sweep(model, h0)
    others = [(v, v.mlp(width, depth, expansion=expansion, seeds=[0]), v.gaussian_input([0], width))
              for v in versions if v.prefix]
    engine: dict[str, list[float]] = {v.prefix: [] for v in versions}
    rev, worst = 0.0, 0.0
    for l in range(1, depth + 1):
        if (l - 1) % every == 0:
            for v, m, h in [(versions[0], model, h0), *others]:
                t0 = time.perf_counter()
                v.forward_sweep(m, h)
                engine[v.prefix].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        jac = torch.func.jacrev(lambda v, l=l: f(v, l))(h0[0, 0])
        er, _ = spectral_ranks((jac / torch.linalg.matrix_norm(jac))[None], PROFILE_SPECTRA)
        rev += time.perf_counter() - t0
        worst = max(worst, abs(er.item() - ref.erank[0, l - 1].item()) / width)
    out = {"reverse_profile_s": rev, "reverse_engine_runs": len(engine[""]), "reverse_max_diff": worst}
    out.update({f"reverse_{p}engine_s": min(t) for p, t in engine.items()})
    return out


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


def report_engine(r: dict[str, float], args) -> None:
    w, L, x = args.width, args.depth, args.expansion
    gf = r["engine_flops"] / r["final64_s"] / 1e9
    print(f"(a) matmul peak (1024³ GEMM): float64 {r['peak64']:.1f} GFLOP/s, float32 {r['peak32']:.1f} GFLOP/s")
    print(f"(b) final ∂h_L/∂h_0 + SVD, d={w} L={L} m/d={x:g} M=2 ReLU pre-RMSNorm, one seed:")
    for n in ("64", "32"):
        e, p = r[f"final{n}_s"], r[f"plain_final{n}_s"]
        line = f"    float{n}: engine {e:.3f} s, plain loop {p:.3f} s → engine/plain = {e / p:.2f}× [target ≤ 0.8×]"
        if f"v1_final{n}_s" in r:
            line += f"; v1 {r[f'v1_final{n}_s']:.3f} s → {r[f'v1_final{n}_s'] / e:.2f}× faster than v1 [≈ 3×]"
        print(line)
    print(f"    reverse mode (one jacrev of h_0 ↦ h_L + SVD): {r['jacrev_final64_s']:.3f} s → "
          f"engine {r['jacrev_final64_s'] / r['final64_s']:.1f}× faster")
    print(f"    engine {r['engine_flops'] / 1e9:.2f} GFLOP (plain loop {r['plain_flops'] / 1e9:.2f}) → "
          f"{gf:.1f} GFLOP/s = {gf / r['peak64']:.0%} of the float64 peak")
    e, p = r["profile_s"], r["plain_profile_s"]
    line = (f"(c) full profile (all L partials + L spectra): engine {e:.3f} s, plain loop (L SVDs) {p:.3f} s "
            f"→ engine/plain = {e / p:.2f}× [target ≤ 0.8×]")
    if "before_profile_s" in r:
        line += f"; before {r['before_profile_s']:.3f} s → {r['before_profile_s'] / e:.2f}× faster"
    if "v1_profile_s" in r:
        line += f"; v1 {r['v1_profile_s']:.3f} s → {r['v1_profile_s'] / e:.2f}× faster than v1"
    print(line + f"; max |Δ erank/d| vs plain = {r['plain_max_diff']:.1e}")
    if "before_draw64_s" in r:
        d64, d32 = r["draw64_s"], r["draw32_s"]
        b64, b32 = r["before_draw64_s"], r["before_draw32_s"]
        print(f"    drawing the network (weights; in this process, memory reused by the allocator): "
              f"float64 {b64:.3f} s → {d64:.3f} s = {b64 / d64:.2f}× faster, float32 {b32:.3f} s → "
              f"{d32:.3f} s = {b32 / d32:.2f}× [target ≥ 3×: {verdict(b64 / d64 >= 3)}]; drawing / "
              f"io measurement {d64 / r['final64_s']:.2f} [target ≤ 0.5: {verdict(d64 <= 0.5 * r['final64_s'])}]")
    print(f"    one spectrum of a {w}×{w} partial: Gram matrix + eigvalsh {r['gram_one_s'] * 1e3:.2f} ms, "
          f"SVD {r['svd_one_s'] * 1e3:.2f} ms → Gram {r['svd_one_s'] / r['gram_one_s']:.2f}× faster; "
          f"engine profile with Gram spectra {r['profile_gram_s']:.3f} s, with SVDs {r['profile_svd_s']:.3f} s")
    if "reverse_profile_s" in r:
        rev, eng = r["reverse_profile_s"], r["reverse_engine_s"]
        ratio = rev / eng
        line = (f"    reverse mode on every prefix (jacrev of a plain functional forward, all {L} prefixes "
                f"timed, each engine's profile timed {r['reverse_engine_runs']}× in between): {rev:.1f} s vs "
                f"engine {eng:.3f} s → {ratio:.0f}× [target ≥ 100×: {verdict(ratio >= 100)}]")
        if "reverse_before_engine_s" in r:
            b = r["reverse_before_engine_s"]
            line += f"; before (SVD spectra, engine {b:.3f} s): {rev / b:.0f}×"
        print(line + f"; max |Δ erank/d| = {r['reverse_max_diff']:.1e}")
    print(f"(d) {r['seeds']} seeds, final Jacobian + SVD: batched {r['seeds_batched_s']:.2f} s vs "
          f"{r['seeds']} runs {r['seeds_separate_s']:.2f} s → {r['seeds_separate_s'] / r['seeds_batched_s']:.2f}×")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=96)
    p.add_argument("--expansion", type=float, default=4.0)
    p.add_argument("--every", type=int, default=12, help="time the engine's profile after every k-th prefix")
    p.add_argument("--repeat", type=int, default=3, help="timings per row; the fastest is kept")
    p.add_argument("--seeds", type=int, default=8, help="seeds for row (d)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the shared-machine rule)")
    p.add_argument("--v1", default=V1_COMMIT, help="commit whose engine row (f) times ('' to skip)")
    p.add_argument("--before", default=BEFORE_COMMIT, help="main before issue 18 ('' to skip)")
    p.add_argument("--no-reverse", action="store_true", help="skip reverse mode on every prefix")
    p.add_argument("--only", choices=("engine", "all"), default="all")
    p.add_argument("--engine-json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.engine_json:
        print(json.dumps(engine_rows(args.width, args.depth, args.expansion, args.repeat)))
        return
    print(header("benchmarks.bench (the engine)", args.threads) + ", device cpu", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        versions = engines(Path(tmp), {"v1": args.v1, "before": args.before})
        r = bench_engine(args, versions)
        if not args.no_reverse:
            r.update(reverse_every_prefix(args.width, args.depth, args.expansion, args.every, versions))
    report_engine(r, args)
    print(f"    ({load()}; v1 = {args.v1}, before = {args.before}: their engines imported in this "
          "process and timed in the same rounds)")
    if args.only == "engine":
        return
    sys.stdout.flush()
    print("--- (g) the whole job (python -m benchmarks.bench_job)", flush=True)
    subprocess.run([sys.executable, "-m", "benchmarks.bench_job"], check=False)
    extra = Path(__file__).with_name("bench_train.py")
    if extra.exists():
        print("--- (h) training (python -m benchmarks.bench_train)", flush=True)
        subprocess.run([sys.executable, "-m", "benchmarks.bench_train"], check=False)


if __name__ == "__main__":
    main()
