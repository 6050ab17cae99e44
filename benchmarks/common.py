"""What the benchmarks share: the header (commit, load), alternating rounds, fresh processes.

The machine is shared, so a benchmark reports ratios of contenders timed in the same run, in
alternating rounds after one untimed warm-up each, as min and median of the rounds, with the
load average (``os.getloadavg``) printed beside them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(tree: Path = ROOT) -> str:
    """The short hash of ``tree``'s HEAD, ``+dirty`` when its tracked files differ from it."""
    return git("rev-parse", "--short", "HEAD", cwd=tree) + (
        "+dirty" if git("status", "--porcelain", "--untracked-files=no", cwd=tree) else "")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def header(name: str, threads: int | str = 1) -> None:
    print(f"{name} — commit {commit()}, torch {version('torch')}, {threads} torch thread(s), {load()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)


def alternate(contenders: dict[str, Callable[[], float]], rounds: int,
              warm: bool = True) -> dict[str, list[float]]:
    """Seconds of each contender (its call returns them) in ``rounds`` alternating rounds, after
    one untimed warm-up call each (caches, allocator, lazy imports) unless the caller ``warm``ed
    them already."""
    for fn in contenders.values() if warm else ():
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            times[name].append(fn())
    return times


def timer(fn: Callable[[], object]) -> Callable[[], float]:
    """``fn`` as a contender: its call returns the wall seconds ``fn()`` took."""
    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed


def spread(ts: Sequence[float], unit: float = 1.0, fmt: str = ".3f", name: str = "s") -> str:
    return f"min {min(ts) * unit:{fmt}} {name}, median {statistics.median(ts) * unit:{fmt}} {name}"


def ratio(a: Sequence[float], b: Sequence[float]) -> str:
    """``a / b`` of the medians (and of the minima) of two positive timings."""
    return f"{statistics.median(a) / statistics.median(b):.2f}× (minima {min(a) / min(b):.2f}×)"


def env(tree: Path, threads: int | None = 1) -> dict[str, str]:
    """A timed process's environment: ``tree``'s code first on the path, ``threads`` threads
    (None: torch's default), no tracking, thread or rankexp variables inherited."""
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "RANKEXP_", "OMP_NUM", "MKL_NUM"))}
    n = {} if threads is None else {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return {**out, **n, "PYTHONPATH": str(tree)}


def run(argv: Sequence[str], tree: Path = ROOT, cwd: Path | None = None,
        threads: int | None = 1, **extra: str) -> tuple[float, float, float]:
    """``(wall s, CPU s, peak RSS MB)`` of a fresh ``python <argv>`` of ``tree``'s code, its own
    rusage from ``os.wait4`` (``extra``: more environment); raises when it fails."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        pid = subprocess.Popen([sys.executable, *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=err, env={**env(tree, threads), **extra}).pid
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - t0
        if status:
            err.seek(0)
            raise RuntimeError(f"python {' '.join(argv[:3])} ({tree}) exited "
                               f"{os.waitstatus_to_exitcode(status)}:\n{err.read()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def rankexp(args: Sequence[str], tree: Path, cwd: Path, threads: int = 1) -> tuple[float, ...]:
    """:func:`run` of ``python -m rankexp <args>`` on the CPU, started in ``cwd``, its outputs under it."""
    out = cwd / f"out{time.monotonic_ns()}"
    return run(["-m", "rankexp", *(a for a in args if a != "-m"), "device=cpu", f"hydra.run.dir={out}",
                f"hydra.sweep.dir={out}", *(["-m"] if "-m" in args else [])], tree, cwd, threads)


@contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A ``git worktree`` of ``rev`` in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-rev-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), rev)
        try:
            yield tree
        finally:
            git("worktree", "remove", "--force", str(tree))
