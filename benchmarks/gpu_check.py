"""``make gpu-check``: the GPU claims checked in one script (< 8 min on one H200-class GPU).

    python -m benchmarks.gpu_check            # the full check
    python -m benchmarks.gpu_check --small    # the same parts at toy sizes (seconds; CI)

1. The measure job at full size (d=256, L=96, m/d=4, 4 seeds, the default probes; Pre- and
   Post-Norm) through the CLI: CUDA float64 and float32 against the CPU float64 result — the
   worst relative difference of the science (every scalar and series but the job's own
   seconds, peak memory and seed chunk) — and each job's weights + measurement seconds; the
   weights drawn for CUDA against the CPU's (expected identical); the sweep's host syncs per
   block under CUDA's sync debug mode (expected none).
2. Training: six learning rates as one batched model (d=256, Pre-Norm, B=256) at L = 12, 48,
   192, in each mode (eager fp32, bf16 autocast, CUDA graphs, torch.compile and their
   combinations): steps/s, TFLOP/s, mean |Δ loss| against eager fp32.
3. The projected wall time of the full grids (fig5, fig6, fig6_train): a sweep's start once,
   then per job the sweep's overhead plus its weights + measurement, linear in L.

Without CUDA it runs part 1's CPU references and a short CPU training, says so, and exits 0.
Exit status 1 when CUDA float64 differs from CPU float64 by more than 1e-8 in the science, or
a check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rankexp.models.classifier import Classifier
from rankexp.models.mlp import ResidualMLP
from rankexp.tasks.data import DeviceDataset
from rankexp.tasks.train import STUDY_LRS, evaluate, train

from .common import ROOT, env, header, run

FLOAT64_TOLERANCE = 1e-8
NORMS = ("pre", "post")
#: a job's own facts, not science: they differ between devices by design
JOB_FACTS = ("peak_memory_gb", "seed_chunk")


# --------------------------------------------------------------------------- 1. measure
@dataclasses.dataclass
class Job:
    proc: subprocess.Popen
    run_dir: Path
    args: list[str]


def start_job(overrides: list[str], workdir: Path, threads: int | None = None) -> Job:
    run_dir = workdir / f"job{time.monotonic_ns()}"
    args = [*overrides, "tracking=off", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "rankexp", *args], cwd=workdir, env=env(ROOT, threads),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return Job(proc, run_dir, args)


def finish_job(job: Job, timeout: float = 900) -> dict:
    """The job's ``result.json``; raises RuntimeError if it failed."""
    try:
        _, err = job.proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.proc.kill()
        _, err = job.proc.communicate()
    if job.proc.returncode != 0:
        raise RuntimeError(f"`rankexp {' '.join(job.args)}` exited {job.proc.returncode}:\n{(err or '')[-2000:]}")
    return json.loads((job.run_dir / "result" / "result.json").read_text())


def measure_job(overrides: list[str], workdir: Path) -> dict:
    return finish_job(start_job(overrides, workdir))


def science_differences(got: dict, ref: dict) -> list[tuple[float, str]]:
    """``(relative difference, name)`` of every science scalar and series two job results share,
    worst first (a series: max |Δ| / max |ref|); the job's seconds and :data:`JOB_FACTS` are not
    science."""
    out = []
    for k, b in ref["scalars"].items():
        a = got["scalars"].get(k)
        if k in JOB_FACTS or k.endswith("_seconds") or a is None or not np.isfinite([a, b]).all():
            continue
        out.append((abs(a - b) / max(abs(b), 1e-12), k))
    for k, s in ref["series"].items():
        if k in got["series"]:
            a, b = np.asarray(got["series"][k]["values"]), np.asarray(s["values"])
            ok = np.isfinite(a) & np.isfinite(b)
            if a.shape == b.shape and ok.any():
                out.append((float(np.abs(a - b)[ok].max() / max(np.abs(b[ok]).max(), 1e-12)), k))
    return sorted(out, reverse=True)


def job_compute_s(result: dict) -> float:
    """A job's seconds beyond the sweep's per-job overhead: drawing the weights + measuring."""
    sc = result["scalars"]
    return float(sc.get("build_seconds", 0.0)) + float(sc["measure_seconds"])


def measure_size(small: bool) -> list[str]:
    return ["width=32", "depth=8", "expansion=2", "seeds=2"] if small else \
        ["width=256", "depth=96", "expansion=4", "seeds=4"]


def check_measure(small: bool, workdir: Path, cuda: bool) -> bool:
    print(f"1. measure, {' '.join(measure_size(small))}, default probes", flush=True)
    # the CPU references run on the CPU cores while the GPU jobs run (two cores left for those)
    threads = max(1, ((os.cpu_count() or 2) - 2) // len(NORMS)) if cuda else None
    refs = {n: start_job([f"norm={n}", *measure_size(small), "device=cpu", "dtype=float64"], workdir, threads)
            for n in NORMS}
    ok = True
    try:
        got = {(n, dt): measure_job([f"norm={n}", *measure_size(small), "device=cuda", f"dtype={dt}"], workdir)
               for n in NORMS for dt in ("float64", "float32")} if cuda else {}
        for n in NORMS:
            ref = finish_job(refs[n])
            print(f"   {n}: CPU float64 {job_compute_s(ref):.2f} s", flush=True)
            for dt in ("float64", "float32") if cuda else ():
                diffs = science_differences(got[(n, dt)], ref)
                bad = dt == "float64" and bool(diffs) and diffs[0][0] > FLOAT64_TOLERANCE
                ok &= not bad
                print(f"   {n}: CUDA {dt} {job_compute_s(got[(n, dt)]):.2f} s; worst rel. difference vs "
                      f"CPU float64: {', '.join(f'{k} {d:.1e}' for d, k in diffs[:3])}"
                      + ("  MISMATCH" if bad else ""), flush=True)
    finally:
        for job in refs.values():
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()
    return ok


def check_weights_and_syncs(device: torch.device) -> bool:
    """The weights built for ``device`` against the CPU's, and the sweep's host syncs per block."""
    import warnings

    from rankexp.probes.jacobian import forward_sweep

    cpu, dev = ResidualMLP(256, 4, seeds=[0, 1]), ResidualMLP(256, 4, seeds=[0, 1], device=device)
    worst = max((p.cpu() - q).abs().max().item() for p, q in zip(dev.parameters(), cpu.parameters(), strict=True))
    print(f"   weights on {device} vs CPU: largest difference {worst:.1e} (expected 0)", flush=True)
    syncs = {}
    for depth in (8, 32):
        model = ResidualMLP(256, depth, seeds=[0, 1], device=device)
        h0 = torch.randn(2, 1, 256, dtype=torch.float64, device=device)
        forward_sweep(model, h0)  # warm-up: kernels, cuBLAS/cuSOLVER handles
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                forward_sweep(model, h0)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs[depth] = sum("synchroniz" in str(w.message) for w in caught)
    per_block = (syncs[32] - syncs[8]) / 24
    print(f"   host syncs of one sweep: L=8 {syncs[8]}, L=32 {syncs[32]} → {per_block:.2f} per block", flush=True)
    return worst == 0 and per_block == 0


# --------------------------------------------------------------------------- 2. training
@dataclasses.dataclass
class Mode:
    name: str
    bf16: bool = False
    compile: bool = False
    graphs: bool = False
    max_depth: int = 10**9  # torch.compile unrolls every block: compiled at small depths only


MODES = [Mode("eager fp32"), Mode("bf16", bf16=True), Mode("CUDA graphs", graphs=True),
         Mode("CUDA graphs + bf16", bf16=True, graphs=True), Mode("compile", compile=True, max_depth=48),
         Mode("compile + bf16", bf16=True, compile=True, max_depth=12),
         Mode("compile + CUDA graphs", compile=True, graphs=True, max_depth=12)]


def step_flops(width: int, depth: int, batch: int) -> float:
    """Matmul FLOP of one training step of one member (m = d, M = 2): 2 per MAC, ×3 fwd + bwd."""
    return 6.0 * batch * (3072 * width + depth * 2 * width * width + width * 10)


def time_training(data: DeviceDataset, width: int, depth: int, mode: Mode, steps: int) -> dict:
    """Steps/s of ``train`` in ``mode`` after a 3-step warm-up, the losses, one evaluation's seconds."""
    stack = ResidualMLP(width, depth, expansion=1.0, placement="pre", seeds=[0] * len(STUDY_LRS),
                        dtype=torch.float32, device=data.device)
    model = Classifier(stack)
    kw = dict(batch_size=256, progress=False, eval_batch_size=256, autocast_bf16=mode.bf16,
              compile=mode.compile, cuda_graphs=mode.graphs, seed=0)
    one_batch = dataclasses.replace(data, x_test=data.x_test[:256], y_test=data.y_test[:256])
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    train(model, one_batch, STUDY_LRS, steps=3, eval_every=3, **kw)
    warmup_s = time.perf_counter() - t0
    model.load_state_dict(initial)  # (dynamo guards on this module object: no recompile)
    res = train(model, one_batch, STUDY_LRS, steps=steps, eval_every=steps, **kw)
    t0 = time.perf_counter()
    evaluate(model, data.x_test, data.y_test, batch_size=2000, autocast_bf16=mode.bf16)
    if data.device.type == "cuda":
        torch.cuda.synchronize()
    return {"steps_per_s": res.steps_per_s, "loss": res.loss, "warmup_s": warmup_s,
            "eval_s": time.perf_counter() - t0}


def check_training(small: bool, steps: int, device: torch.device) -> dict:
    small = small or device.type != "cuda"  # the CPU part only exercises the code
    n_train, n_test = (512, 256) if small else (50_000, 10_000)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n_train + n_test, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n_train + n_test,), generator=g)
    data = DeviceDataset.from_uint8(x[:n_train], y[:n_train], x[n_train:], y[n_train:], device=device)
    width, depths = (32, [2, 4]) if small else (256, [12, 48, 192])
    steps = 20 if small else steps
    print(f"2. training: {len(STUDY_LRS)} learning rates as one model, d={width}, Pre-Norm, B=256, "
          f"{steps} timed steps, CIFAR-shaped noise", flush=True)
    rates: dict[str, dict[int, float]] = {}
    evals: dict[int, float] = {}
    for depth in depths:
        ref, flops = None, len(STUDY_LRS) * step_flops(width, depth, 256)
        for mode in MODES if device.type == "cuda" else MODES[:1]:
            if depth > mode.max_depth:
                continue
            try:
                r = time_training(data, width, depth, mode, steps)
            except Exception as err:  # noqa: BLE001 — report the mode, check the others
                print(f"   L={depth:3d} {mode.name:22s} FAILED: {type(err).__name__}: {err}")
                rates.setdefault(mode.name, {})[depth] = float("nan")
                continue
            ref = r if ref is None else ref
            live = np.isfinite(r["loss"]) & np.isfinite(ref["loss"])
            dist = float(np.abs(r["loss"] - ref["loss"])[live].mean()) if live.any() else np.nan
            rates.setdefault(mode.name, {})[depth], evals[depth] = r["steps_per_s"], r["eval_s"]
            print(f"   L={depth:3d} {mode.name:22s} {r['steps_per_s']:8.1f} steps/s "
                  f"{r['steps_per_s'] * flops / 1e12:7.2f} TFLOP/s  warm-up {r['warmup_s']:5.1f} s  "
                  f"mean |Δ loss| vs eager fp32 {dist:.1e}", flush=True)
    return {"rates": rates, "evals": evals}


# --------------------------------------------------------------------------- 3. projections
def grid(experiment: str) -> list[dict[str, str]]:
    """Every job of ``conf/experiment/<experiment>.yaml``'s sweep (its sweeper params)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(ROOT / "conf" / "experiment" / f"{experiment}.yaml")
    params = {k: str(v).split(",") for k, v in conf.hydra.sweeper.params.items()}
    return [dict(zip(params, combo, strict=True)) for combo in itertools.product(*params.values())]


def linear_in_depth(points: dict[int, float]) -> tuple[float, float]:
    """``(a, b)`` of t = a + b·L through the measured (L, t) (least squares, a ≥ 0)."""
    depths, times = np.array(list(points)), np.array(list(points.values()))
    if len(depths) == 1:
        return 0.0, float(times[0] / depths[0])
    b, a = np.polyfit(depths, times, 1)
    return max(float(a), 0.0), float(b)


def project_grid(jobs: list[dict[str, str]], fits: dict[str, tuple[float, float]], per_job_s: float,
                 start_s: float) -> float:
    """Seconds of a sweep of ``jobs``: its start once, then per job the overhead and the job's
    own ``a + b·L`` (``fits[m/d]``, :func:`linear_in_depth` of :func:`job_compute_s`)."""
    return start_s + sum(per_job_s + fits[j.get("expansion", "1")][0]
                         + fits[j.get("expansion", "1")][1] * int(j["depth"]) for j in jobs)


def sweep_overhead(workdir: Path, jobs: int = 6) -> tuple[float, float]:
    """``(start_s, per_job_s)`` of a sweep of tiny CUDA jobs, each sweep in a folder of its own
    with a new SQLite store (the default ``tracking``)."""
    def sweep(n: int) -> float:
        where = workdir / f"sweep{time.monotonic_ns()}"
        where.mkdir()
        alphas = ",".join(f"{1 + i / 100:g}" for i in range(n))
        return run(["-m", "rankexp", "width=8", "depth=2", "seeds=1", "device=cuda", f"alpha={alphas}",
                    f"hydra.sweep.dir={where}", "-m"], ROOT, where, None)[0]

    sweep(1)  # the store's schema, CUDA's first context: one-offs
    one, many = sweep(1), sweep(jobs)
    return one, max(0.0, (many - one) / (jobs - 1))


def project(workdir: Path, training: dict) -> None:
    start, per_job = sweep_overhead(workdir)
    print(f"3. projected wall time of the full grids on this GPU: a sweep's start {start:.1f} s, "
          f"then per job {per_job:.3f} s of overhead + its weights and measurement", flush=True)
    for experiment, depths in (("fig5", (48, 384)), ("fig6", (48, 192))):
        jobs, fits = grid(experiment), {}
        for e in sorted({j.get("expansion", "1") for j in jobs}):
            seconds = {L: job_compute_s(measure_job([f"experiment={experiment}", f"depth={L}", f"expansion={e}",
                                                     "norm=pre", "alpha=1", "device=cuda", "dtype=float64"],
                                                    workdir)) for L in depths}
            fits[e] = linear_in_depth(seconds)
            print(f"   {experiment} m/d={e}: weights + measurement at L={depths}: "
                  f"{', '.join(f'{s:.2f}' for s in seconds.values())} s", flush=True)
        print(f"   → {experiment}: {len(jobs)} jobs, {project_grid(jobs, fits, per_job, start) / 60:.1f} min",
              flush=True)
    jobs = grid("fig6_train")
    eval_a, eval_b = linear_in_depth(training["evals"])
    for mode, rates in training["rates"].items():
        finite = {L: 1.0 / r for L, r in rates.items() if np.isfinite(r) and r > 0}
        if len(finite) < len(training["evals"]):
            continue  # a mode not timed at every depth cannot be projected over the grid
        a, b = linear_in_depth(finite)
        total = start + sum(per_job + 5000 * (a + b * int(j["depth"])) + 10 * (eval_a + eval_b * int(j["depth"]))
                            for j in jobs)  # 5000 steps, an evaluation every 500
        print(f"   → fig6_train ({mode}): {len(jobs)} runs × 5000 steps, {total / 3600:.2f} h", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="toy sizes (a quick run of every part)")
    p.add_argument("--steps", type=int, default=300, help="timed training steps per mode")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    header("benchmarks.gpu_check", torch.get_num_threads())
    print(f"CUDA device: {torch.cuda.get_device_name(device) if cuda else 'none'}; {os.cpu_count()} CPU cores",
          flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ok = check_measure(args.small, Path(tmp), cuda)
        if cuda:
            ok &= check_weights_and_syncs(device)
        training = check_training(args.small, args.steps, device)
        if not cuda:
            print("no CUDA device: ran the CPU parts only (CPU references, CPU training)")
            return 0
        if not args.small:
            project(Path(tmp), training)
    print(f"gpu-check done in {(time.perf_counter() - t0) / 60:.1f} min"
          + ("" if ok else "; CUDA DISAGREES with the CPU (float64 science, weights) or the sweep syncs"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
