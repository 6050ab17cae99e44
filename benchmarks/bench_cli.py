"""The interactive path, before → after issue 19, every row measured in one run (``make bench``).

    python -m benchmarks.bench_cli                   # every row (≈ 1 min on an idle 2-core machine)
    python -m benchmarks.bench_cli --before <ref>    # another "before" (default: main before issue 19)

"before" is :data:`BEFORE`'s ``rankexp/``, ``conf/`` and ``hydra_plugins/`` (``git archive``), run
in subprocesses alternating with this checkout's; the fastest of ``--repeat`` rounds of each is
kept and printed as seconds and as a ratio to a bare ``python -c pass`` of the same run, with
its CPU seconds (user + system).  The targets are for an idle machine: a shared one's wall time
is its load's, so a row meets its target when the wall time or the CPU time (the wall time of
this single-threaded process where no one else runs) is within it.

1. ``rankexp --help`` (``python -m rankexp --help``): target ≤ 1 s on an idle machine.
2. A tab press: Hydra's bash completion query (``-sc query=bash`` with ``COMP_LINE``) for
   ``rankexp nor``, ``rankexp norm=`` and ``rankexp `` (every key and group): target ≤ 1 s each.
3. What they import (``python -X importtime``, this checkout): never torch, mlflow,
   transformers, torchvision or a model's code.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import ROOT, checkout, clean_env, header, load, python_wall, rounds, verdict

#: main before issue 19 (the branch point of the CLI work): the "before" of every row
BEFORE = "f6a7325"
#: the completion queries timed: what bash asks when tab is pressed after these lines
LINES = ("rankexp nor", "rankexp norm=", "rankexp ")
#: top-level packages a help or a tab press must not import
HEAVY = ("torch", "mlflow", "transformers", "torchvision")


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def rankexp_wall(tree: Path, args: list[str], line: str | None = None) -> dict:
    """A fresh ``python -m rankexp <args>`` of ``tree``'s code: wall and CPU seconds (user +
    system of the process), its stdout."""
    env = clean_env(tree)
    if line is not None:
        env.update(COMP_LINE=line, COMP_POINT=str(len(line)))
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), _cpu()
        out = subprocess.run([sys.executable, "-m", "rankexp", *args], cwd=tmp, env=env,
                             capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if out.returncode:
        raise RuntimeError(f"rankexp {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "stdout": out.stdout}


def imported(args: list[str], line: str | None = None) -> list[str]:
    """The modules a fresh ``python -X importtime -m rankexp <args>`` of this checkout imports
    that a help or a tab press must not: torch, mlflow, … and ``rankexp.models.*`` but its
    torch-free modules (``rankexp.models.TORCH_FREE``)."""
    from rankexp.models import TORCH_FREE

    env = clean_env(ROOT)
    if line is not None:
        env.update(COMP_LINE=line, COMP_POINT=str(len(line)))
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "rankexp", *args], cwd=tmp,
                             env=env, capture_output=True, text=True)
    names = [ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")]
    return sorted(n for n in names if n.split(".")[0] in HEAVY
                  or (n.startswith("rankexp.models.") and not n.startswith(TORCH_FREE)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default=BEFORE)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(header("benchmarks.bench_cli (help and completion)", 1) + f", before = {args.before}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(args.before, Path(tmp))
        if before is None:
            return
        trees = {"before": before, "after": ROOT}
        contenders = {"python -c pass": lambda: python_wall("pass")}
        for v, tree in trees.items():
            contenders[f"{v} help"] = lambda t=tree: rankexp_wall(t, ["--help"])
            for line in LINES:
                contenders[f"{v} {line}"] = lambda t=tree, q=line: rankexp_wall(t, ["-sc", "query=bash"], q)
        best = rounds(contenders, args.repeat)
    bare = best["python -c pass"]["wall_s"]
    print(f"   bare `python -c pass`: {bare:.3f} s (fastest of {args.repeat} alternating rounds; {load()})")
    rows = [("1. rankexp --help", "help")] + [(f"2. tab after {line!r}", line) for line in LINES]
    for label, key in rows:
        b, a = best[f"before {key}"], best[f"after {key}"]
        same = "same output" if b["stdout"] == a["stdout"] else "output differs"
        print(f"{label:26s} {b['wall_s']:5.2f} s → {a['wall_s']:4.2f} s = {b['wall_s'] / bare:5.1f}× → "
              f"{a['wall_s'] / bare:4.1f}× python -c pass; CPU {b['cpu_s']:5.2f} s → {a['cpu_s']:4.2f} s "
              f"({b['cpu_s'] / a['cpu_s']:.1f}× less, {same}) [target ≤ 1 s idle: "
              f"{verdict(min(a['wall_s'], a['cpu_s']) <= 1.0)}]")
    heavy = {"--help": imported(["--help"]), "task=train --help": imported(["task=train", "--help"])}
    heavy.update({f"tab after {line!r}": imported(["-sc", "query=bash"], line) for line in LINES})
    for what, mods in heavy.items():
        print(f"3. {what} imports {', '.join(mods) if mods else 'no torch, mlflow, transformers or model code'} "
              f"[{verdict(not mods)}]")
    print(f"bench_cli done; {load()}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
