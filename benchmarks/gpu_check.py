"""``make gpu-check`` — the GPU claims checked in one script (< 8 min on one H200-class GPU).

    python -m benchmarks.gpu_check            # the full check
    python -m benchmarks.gpu_check --small    # the same parts at toy sizes (seconds; CI)

1. Measure engine at full size (d=256, L=96, m/d=4, 4 seeds, every default probe; Pre- and
   Post-Norm), through the CLI (``python -m rankexp ... device=… dtype=…``): CUDA float64
   and CUDA float32 against the CPU float64 result of the same config and seeds — the
   worst relative difference of the *science* (every scalar and series but the job's own
   facts: seconds, peak memory, seed chunk — :data:`rankexp.tasks.measure.RUN_FACTS`), and
   each job's ``build_seconds`` + ``measure_seconds``.  Then, in this process: the weights drawn
   on CUDA against the CPU's (the counter-based generator, its slow path's exp and log built
   from IEEE-exact steps: expected bit-identical, the share that differs printed), and the
   sweep's host syncs counted by CUDA's sync debug mode at
   two depths (the sync-free sweep: none per block).
2. Training: the six-learning-rate batched model (d=256, Pre-Norm, α=1, B=256) at
   L = 12, 48, 192 for a few hundred steps in each mode — eager fp32, bf16 autocast, CUDA
   graphs, torch.compile (L ≤ 48: compiling 192 unrolled blocks takes minutes) and their
   combinations — steps/s, GFLOP/s, and each mode's distance from eager fp32 (mean |Δ loss|
   over the steps).
3. Projected wall time of the full grids from the *whole job*: a sweep's start (one process,
   imports, store) once, then per job the sweep's per-job overhead (measured here, a sweep of
   tiny CUDA jobs) plus its weights and its measurement (``build_seconds`` +
   ``measure_seconds``, linear in L, fitted per grid and m/d from two depths): fig5 and fig6
   (measure, float64) and fig6_train (5000 steps per run, with the evaluations).

Without CUDA it runs part 1's CPU reference and a short CPU training, says there is no CUDA
device, and exits 0. Exit status 1 when CUDA float64 differs from CPU float64 by more than
1e-8 (relative) in a science metric, or a part fails.  The comparison, the projection and the
grids are plain functions of job results (:func:`science_differences`, :func:`project_grid`,
:func:`grid`), tested on the CPU (tests/test_gpu_check.py).
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

from rankexp.locations import REPO_ROOT
from rankexp.models.mlp import ResidualMLP
from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT, DeviceDataset
from rankexp.tasks.train import STUDY_LRS, Classifier, evaluate, train

from .bench_train import step_flops
from .common import header

FLOAT64_TOLERANCE = 1e-8


# --------------------------------------------------------------------------- 1. measure
@dataclasses.dataclass
class Job:
    """A running ``python -m rankexp`` job (tracking off) and where it writes its result."""

    proc: subprocess.Popen
    run_dir: Path
    args: list[str]
    t0: float


def start_job(overrides: list[str], workdir: Path, threads: int | None = None) -> Job:
    run_dir = workdir / f"job{time.monotonic_ns()}"
    args = [*overrides, "tracking.enabled=false", f"hydra.run.dir={run_dir}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    proc = subprocess.Popen([sys.executable, "-m", "rankexp", *args], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return Job(proc, run_dir, args, time.perf_counter())


def finish_job(job: Job, timeout: float = 900) -> dict:
    """The job's ``result.json`` plus ``wall_s``. Raises RuntimeError if it failed."""
    try:
        _, err = job.proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.proc.kill()
        _, err = job.proc.communicate()
    if job.proc.returncode != 0:
        raise RuntimeError(f"`rankexp {' '.join(job.args)}` exited {job.proc.returncode}:\n"
                           f"{(err or '')[-2000:]}")
    doc = json.loads((job.run_dir / "result" / "result.json").read_text())
    return {**doc, "wall_s": time.perf_counter() - job.t0}


def measure_job(overrides: list[str], workdir: Path) -> dict:
    return finish_job(start_job(overrides, workdir))


def science_differences(got: dict, ref: dict) -> list[tuple[float, str]]:
    """``(relative difference, name)`` of every science scalar and series two job results share,
    worst first (series: max |Δ| over the steps / max |ref|); the job's own facts
    (:data:`~rankexp.tasks.measure.RUN_FACTS`: seconds, peak memory, seed chunk) are not science
    and differ between devices by design."""
    from rankexp.tasks.measure import RUN_FACTS

    out = []
    for k, b in ref["scalars"].items():
        a = got["scalars"].get(k)
        if k in RUN_FACTS or k.endswith("_seconds") or a is None or not np.isfinite([a, b]).all():
            continue
        out.append((abs(a - b) / max(abs(b), 1e-12), k))
    for k, s in ref["series"].items():
        if k not in got["series"]:
            continue
        a, b = np.asarray(got["series"][k]["values"]), np.asarray(s["values"])
        ok = np.isfinite(a) & np.isfinite(b)
        if a.shape == b.shape and ok.any():
            out.append((float(np.abs(a - b)[ok].max() / max(np.abs(b[ok]).max(), 1e-12)), k))
    return sorted(out, reverse=True)


def job_compute_s(result: dict) -> float:
    """A job's own seconds beyond the sweep's per-job overhead: drawing the weights + measuring."""
    sc = result["scalars"]
    return float(sc.get("build_seconds", 0.0)) + float(sc["measure_seconds"])


NORMS = ("pre", "post")


def measure_size(small: bool) -> list[str]:
    return (["width=32", "depth=8", "expansion=2", "seeds=2"] if small
            else ["width=256", "depth=96", "expansion=4", "seeds=4"])


def start_cpu_references(args, workdir: Path, cuda: bool) -> dict[str, Job]:
    """The CPU float64 references, started at once: on a GPU machine they run on the CPU
    cores while the GPU parts run (two cores left free for launching GPU work)."""
    threads = max(1, ((os.cpu_count() or 2) - 2) // len(NORMS)) if cuda else None
    return {norm: start_job([f"norm={norm}", *measure_size(args.small), "device=cpu",
                             "dtype=float64"], workdir, threads) for norm in NORMS}


def check_measure(args, workdir: Path, cuda: bool, refs: dict[str, Job]) -> bool:
    print(f"1. measure engine, {' '.join(measure_size(args.small))}, default probes", flush=True)
    got = {}
    if cuda:  # GPU jobs first: the references are still computing on the CPU cores
        got = {(norm, dtype): measure_job([f"norm={norm}", *measure_size(args.small),
                                           "device=cuda", f"dtype={dtype}"], workdir)
               for norm in NORMS for dtype in ("float64", "float32")}
    ok = True
    for norm in NORMS:
        ref = finish_job(refs[norm])
        ref_s = job_compute_s(ref)
        print(f"   {norm}: CPU float64 {ref_s:.2f} s "
              f"(erank_io {ref['scalars'].get('erank_io', np.nan):.6g})", flush=True)
        for dtype in ("float64", "float32") if cuda else ():
            g = got[(norm, dtype)]
            diffs = science_differences(g, ref)
            worst = ", ".join(f"{k} {d:.1e}" for d, k in diffs[:3])
            bad = dtype == "float64" and bool(diffs) and diffs[0][0] > FLOAT64_TOLERANCE
            ok &= not bad
            g_s = job_compute_s(g)
            print(f"   {norm}: CUDA {dtype} {g_s:.2f} s ({ref_s / g_s:.1f}× the CPU's "
                  f"{os.cpu_count()} cores, shared); worst rel. difference vs CPU float64: "
                  f"{worst}" + ("  MISMATCH" if bad else ""), flush=True)
    return ok


# --------------------------------------------------------------------------- 2. training
def training_data(device: torch.device, small: bool) -> tuple[DeviceDataset, str]:
    """Real CIFAR-10 when this checkout has it, else CIFAR-shaped noise (same throughput)."""
    if small:
        why = "toy size"
    elif (DEFAULT_ROOT / ARCHIVE_NAME).is_file():
        from rankexp.tasks.data import load_device_dataset

        return load_device_dataset(DEFAULT_ROOT, DEFAULT_CACHE_DIR, device=device,
                                   progress=False), "CIFAR-10"
    else:
        why = f"no {DEFAULT_ROOT / ARCHIVE_NAME} here"
    n_train, n_test = (512, 256) if small else (50_000, 10_000)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n_train + n_test, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n_train + n_test,), generator=g)
    data = DeviceDataset.from_uint8(x[:n_train], y[:n_train], x[n_train:], y[n_train:],
                                    device=device)
    return data, f"synthetic CIFAR-shaped data ({why})"


@dataclasses.dataclass
class Mode:
    name: str
    bf16: bool = False
    compile: bool = False
    graphs: bool = False
    max_depth: int = 10**9


# torch.compile unrolls every block: compiling is timed at small depths only (budget)
MODES = [Mode("eager fp32"), Mode("bf16", bf16=True), Mode("CUDA graphs", graphs=True),
         Mode("CUDA graphs + bf16", bf16=True, graphs=True),
         Mode("compile", compile=True, max_depth=48),
         Mode("compile + bf16", bf16=True, compile=True, max_depth=12),
         Mode("compile + CUDA graphs", compile=True, graphs=True, max_depth=12)]


def time_training(data: DeviceDataset, width: int, depth: int, mode: Mode, steps: int
                  ) -> dict[str, float | np.ndarray]:
    """Steps/s of ``train`` in ``mode`` (after a 3-step warm-up on the same model: compile,
    allocations, cuBLAS workspaces), the per-step losses, and one full evaluation's seconds."""
    stack = ResidualMLP(width=width, depth=depth, expansion=1.0, placement="pre",
                        seeds=[0] * len(STUDY_LRS), dtype=torch.float32, device=data.device)
    model = Classifier(stack)
    kw = dict(batch_size=256, progress=False, eval_batch_size=256, autocast_bf16=mode.bf16,
              compile=mode.compile, cuda_graphs=mode.graphs, seed=0)
    one_batch_test = dataclasses.replace(data, x_test=data.x_test[:256], y_test=data.y_test[:256])
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    train(model, one_batch_test, STUDY_LRS, steps=3, eval_every=3, **kw)
    warmup_s = time.perf_counter() - t0
    model.load_state_dict(initial)  # (dynamo guards on this module object: no recompile)
    res = train(model, one_batch_test, STUDY_LRS, steps=steps, eval_every=steps, **kw)
    t0 = time.perf_counter()
    evaluate(model, data.x_test, data.y_test, batch_size=2000, autocast_bf16=mode.bf16)
    if data.device.type == "cuda":
        torch.cuda.synchronize()
    return {"steps_per_s": res.steps_per_s, "loss": res.loss, "warmup_s": warmup_s,
            "eval_s": time.perf_counter() - t0}


def check_training(args, device: torch.device) -> dict:
    small = args.small or device.type != "cuda"  # the CPU part only exercises the code
    data, source = training_data(device, small)
    width, depths = (32, [2, 4]) if small else (256, [12, 48, 192])
    steps = 20 if small else args.steps
    modes = MODES if device.type == "cuda" else [Mode("eager fp32")]
    print(f"2. training: {len(STUDY_LRS)} learning rates as one model, d={width}, Pre-Norm, "
          f"B=256, {steps} timed steps, {source}", flush=True)
    rates: dict[str, dict[int, float]] = {}
    evals: dict[int, float] = {}
    for depth in depths:
        ref = None
        flops = len(STUDY_LRS) * step_flops(width, depth, 1.0, 2, 256)
        for mode in modes:
            if depth > mode.max_depth:
                continue
            try:
                r = time_training(data, width, depth, mode, steps)
            except Exception as err:  # noqa: BLE001 — report the mode, keep checking the others
                print(f"   L={depth:3d} {mode.name:18s} FAILED: {type(err).__name__}: {err}")
                rates.setdefault(mode.name, {})[depth] = float("nan")
                continue
            ref = r if ref is None else ref
            live = np.isfinite(r["loss"]) & np.isfinite(ref["loss"])
            dist = float(np.abs(r["loss"] - ref["loss"])[live].mean()) if live.any() else np.nan
            rates.setdefault(mode.name, {})[depth] = r["steps_per_s"]
            evals[depth] = r["eval_s"]
            print(f"   L={depth:3d} {mode.name:18s} {r['steps_per_s']:8.1f} steps/s "
                  f"{r['steps_per_s'] * flops / 1e12:7.2f} TFLOP/s  warm-up {r['warmup_s']:5.1f} s"
                  f"  mean |Δ loss| vs eager fp32 {dist:.1e}", flush=True)
    return {"rates": rates, "evals": evals, "width": width}


# --------------------------------------------------------------------------- 3. projections
def grid(experiment: str) -> list[dict[str, str]]:
    """Every job of ``conf/experiment/<experiment>.yaml``'s sweep (its sweeper params)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(REPO_ROOT / "conf" / "experiment" / f"{experiment}.yaml")
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
    """Seconds of a whole sweep of ``jobs``: its start once (``start_s``: one process, imports,
    store), then per job the sweep's overhead (``per_job_s``) and the job's own weights +
    measurement ``a + b·L`` (``fits[m/d]``, :func:`linear_in_depth` of :func:`job_compute_s`)."""
    return start_s + sum(per_job_s + fits[j.get("expansion", "1")][0]
                         + fits[j.get("expansion", "1")][1] * int(j["depth"]) for j in jobs)


def sweep_overhead(workdir: Path, jobs: int = 6) -> tuple[float, float]:
    """``(start_s, per_job_s)`` of a local sweep of tiny CUDA jobs logging to a SQLite store:
    the per-job overhead is (T(n) − T(1)) / (n − 1), the start T(1) less its job's own seconds."""
    tiny = ["width=8", "depth=2", "seeds=1", "device=cuda", f"tracking.uri=sqlite:///{workdir}/mlflow.db",
            "tracking.force=true", "hydra/hydra_logging=disabled"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)

    def sweep(n: int) -> float:
        alphas = ",".join(f"{1 + i / 100:g}" for i in range(n))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rankexp", *tiny, f"alpha={alphas}",
                        f"hydra.sweep.dir={workdir}/sweep{time.monotonic_ns()}", "-m"],
                       cwd=workdir, env=env, check=True, capture_output=True)
        return time.perf_counter() - t0

    sweep(1)  # the store's schema, CUDA's first context: one-offs
    one, many = sweep(1), sweep(jobs)
    return one, max(0.0, (many - one) / (jobs - 1))


def project(args, workdir: Path, training: dict) -> None:
    start, per_job = sweep_overhead(workdir)
    print(f"3. projected wall time of the full grids on this GPU, the whole job: a sweep's start "
          f"{start:.1f} s, then per job {per_job:.3f} s of overhead + its weights and measurement",
          flush=True)
    for experiment, probe_depths in (("fig5", (48, 384)), ("fig6", (48, 192))):
        jobs = grid(experiment)
        fits = {}
        for e in sorted({j.get("expansion", "1") for j in jobs}):
            seconds = {}
            for depth in probe_depths:
                r = measure_job([f"experiment={experiment}", f"depth={depth}", f"expansion={e}",
                                 "norm=pre", "alpha=1", "device=cuda", "dtype=float64"], workdir)
                seconds[depth] = job_compute_s(r)
            fits[e] = linear_in_depth(seconds)
            print(f"   {experiment} m/d={e}: weights + measurement at L={probe_depths}: "
                  f"{', '.join(f'{s:.2f}' for s in seconds.values())} s", flush=True)
        total = project_grid(jobs, fits, per_job, start)
        print(f"   → {experiment}: {len(jobs)} jobs, {total / 60:.1f} min", flush=True)
    jobs = grid("fig6_train")
    evals_per_run = 5000 // 500  # task.eval_every
    eval_fit = linear_in_depth(training["evals"])
    for mode, rates in training["rates"].items():
        finite = {d: 1.0 / r for d, r in rates.items() if np.isfinite(r) and r > 0}
        if len(finite) < len(training["evals"]):
            continue  # a mode not timed at every depth cannot be projected over the grid
        a, b = linear_in_depth(finite)
        total = start + sum(per_job + 5000 * (a + b * int(j["depth"]))
                            + evals_per_run * (eval_fit[0] + eval_fit[1] * int(j["depth"])) for j in jobs)
        print(f"   → fig6_train ({mode}): {len(jobs)} runs × 5000 steps, {total / 3600:.2f} h",
              flush=True)


# --------------------------------------------------------------------------- 1b. in this process
def check_weights_and_syncs(device: torch.device) -> bool:
    """The weights drawn on ``device`` against the CPU's, and the sweep's host syncs per block
    (CUDA's sync debug mode counts them; the sync-free sweep makes none inside its loop)."""
    import warnings

    from rankexp.probes.jacobian import forward_sweep
    from rankexp.seeding import gaussian_input

    cpu = ResidualMLP(256, 4, seeds=[0, 1])
    dev = ResidualMLP(256, 4, seeds=[0, 1], device=device)
    diff = [(p.cpu() != q).float().mean().item() for p, q in zip(dev.parameters(), cpu.parameters(), strict=True)]
    worst = max((p.cpu() - q).abs().max().item() for p, q in zip(dev.parameters(), cpu.parameters(), strict=True))
    print(f"   weights on {device} vs CPU: {max(diff):.4%} of the numbers differ (expected none: "
          f"the slow path's exp and log are IEEE-exact steps), by at most {worst:.1e}", flush=True)
    syncs = {}
    for depth in (8, 32):
        model = ResidualMLP(256, depth, seeds=[0, 1], device=device)
        h0 = gaussian_input([0, 1], 256, device=device)
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
    print(f"   host syncs of one sweep (default probes' needs): L=8 {syncs[8]}, L=32 {syncs[32]} → "
          f"{per_block:.2f} per block", flush=True)
    return worst <= 1e-12 and per_block == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="toy sizes (a quick run of every part)")
    p.add_argument("--steps", type=int, default=300, help="timed training steps per mode")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "none"
    print(f"{header('benchmarks.gpu_check')}; CUDA device: {name}; {os.cpu_count()} CPU cores", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        refs = start_cpu_references(args, workdir, cuda)
        try:
            ok = check_measure(args, workdir, cuda, refs)
            if cuda:
                ok &= check_weights_and_syncs(device)
        finally:
            for job in refs.values():
                if job.proc.poll() is None:
                    job.proc.kill()
                    job.proc.wait()
        training = check_training(args, device)
        if not cuda:
            print("no CUDA device: ran the CPU parts only (CPU reference, CPU training); "
                  "nothing to compare, nothing to project")
            return 0
        if not args.small:
            project(args, workdir, training)
    print(f"gpu-check done in {(time.perf_counter() - t0) / 60:.1f} min"
          + ("" if ok else "; CUDA DISAGREES with the CPU (float64 science, weights) or the sweep syncs"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
