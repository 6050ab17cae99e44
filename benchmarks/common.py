"""What every benchmark shares: a header (commit, threads, load average), the code of another
commit to time beside this one in the same run, fresh ``rankexp`` processes, interleaved timing.

Ratios, not seconds, are what the benchmarks report: this machine class is shared, so every
contender of a ratio is timed in the same run, in alternating rounds, the fastest round of each
kept (the least disturbed one), with the load average printed beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: main before issue 18 (the whole job at its compute bound): the "before" of bench_job's rows
BEFORE_COMMIT = "5502edd"


def commit() -> str:
    """``<short hash>`` of this checkout, ``+dirty`` when its tracked files differ."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def load() -> str:
    """The 1-, 5- and 15-minute load averages and the core count, for beside a ratio."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def header(name: str, threads: int | None = None) -> str:
    """The line every benchmark prints first: what ran, at which commit, under which load."""
    import torch

    n = threads if threads is not None else torch.get_num_threads()
    return (f"{name} — commit {commit()}, torch {torch.__version__}, {n} thread(s), {load()}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}")


def checkout(ref: str, dest: Path, parts: Sequence[str] = ("rankexp", "conf", "hydra_plugins")) -> Path | None:
    """``ref``'s ``parts`` extracted under ``dest`` (``git archive``); None when git cannot."""
    out = subprocess.run(["git", "-C", str(ROOT), "archive", ref, *parts], capture_output=True)
    if out.returncode:
        print(f"    (no comparison with {ref}: {out.stderr.decode().strip()})")
        return None
    with tarfile.open(fileobj=BytesIO(out.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def import_as(ref: str, name: str, dest: Path):
    """``ref``'s ``rankexp`` package imported in this process as ``name`` (its imports are
    relative), so its engine and this one are timed in the same rounds; None when git cannot."""
    import importlib
    import shutil

    tree = checkout(ref, dest / "tree", ("rankexp",))
    if tree is None:
        return None
    shutil.move(str(tree / "rankexp"), str(dest / name))
    sys.path.insert(0, str(dest))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(dest))


def clean_env(pythonpath: str | Path, threads: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a timed process: this code (or another commit's) first on the path,
    ``threads`` BLAS/OpenMP threads, no tracking or stamp variables inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_"))}
    env.update(PYTHONPATH=str(pythonpath), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), **extra)
    return env


def result_json(job_dir: Path) -> dict:
    """A job's ``result.json``: ``<job dir>/result/result.json`` (v1 wrote ``<job dir>/result.json``)."""
    for path in (job_dir / "result" / "result.json", job_dir / "result.json"):
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"no result.json under {job_dir}")


def fresh_job(overrides: Sequence[str], pythonpath: str | Path, *, threads: int = 1,
              tracking: bool = False, cwd: Path | None = None, multirun: bool = False) -> dict:
    """Run ``python -m rankexp <overrides>`` in a fresh process (``cwd``: a temporary directory
    with its own SQLite store when ``tracking``); returns ``{"wall_s", "scalars"}`` (scalars of a
    single run only)."""
    with tempfile.TemporaryDirectory() as tmp:
        where = cwd or Path(tmp)
        job = where / f"job{time.monotonic_ns()}"
        args = [*overrides, "device=cpu", f"hydra.run.dir={job}", f"hydra.sweep.dir={job}"]
        if not tracking:
            args.append("tracking=off")
        if multirun:
            args.append("-m")
        t0, c0 = time.perf_counter(), children_cpu()
        out = subprocess.run([sys.executable, "-m", "rankexp", *args], cwd=where,
                             env=clean_env(pythonpath, threads), capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, children_cpu() - c0
        if out.returncode:
            raise RuntimeError(f"rankexp {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
        scalars = {} if multirun else result_json(job).get("scalars", {})
    return {"wall_s": wall, "cpu_s": cpu, "scalars": scalars}


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished child processes (``getrusage``):
    the difference around one ``subprocess.run`` is that process's CPU time, which a loaded
    machine does not inflate the way it inflates wall time (a job waiting for a core)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def python_run(code: str, pythonpath: str | Path = ROOT, threads: int = 1) -> dict:
    """``{"wall_s", "cpu_s"}`` of a fresh ``python -c code``."""
    t0, c0 = time.perf_counter(), children_cpu()
    subprocess.run([sys.executable, "-c", code], env=clean_env(pythonpath, threads), check=True,
                   capture_output=True)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": children_cpu() - c0}


def python_wall(code: str, pythonpath: str | Path = ROOT, threads: int = 1) -> float:
    """Wall seconds of a fresh ``python -c code``."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=clean_env(pythonpath, threads), check=True,
                   capture_output=True)
    return time.perf_counter() - t0


def rounds(contenders: dict[str, Callable[[], dict | float]], repeat: int) -> dict[str, dict]:
    """Each contender ``repeat`` times in alternating rounds; per contender, the round with the
    smallest wall time (a float return is its wall time; a dict needs ``wall_s``), with
    ``cpu_min``: the smallest ``cpu_s`` of its rounds where it reports one."""
    best: dict[str, dict] = {}
    cpu: dict[str, float] = {}
    for _ in range(repeat):
        for name, fn in contenders.items():
            got = fn()
            got = got if isinstance(got, dict) else {"wall_s": got}
            if "cpu_s" in got:
                cpu[name] = min(cpu.get(name, got["cpu_s"]), got["cpu_s"])
            if name not in best or got["wall_s"] < best[name]["wall_s"]:
                best[name] = got
    for name, c in cpu.items():
        best[name] = {**best[name], "cpu_min": c}
    return best


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"
