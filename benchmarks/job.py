"""The whole job a user runs, as fresh ``python -m rankexp`` processes, against another commit.

    python -m benchmarks.job --rev cd9a9b7                 # every row, this tree vs cd9a9b7
    python -m benchmarks.job --rev HEAD --rows job sweep   # some rows
    python -m benchmarks.job --rows sweep --launcher local # the sweep row through joblib

``--rev`` is checked out with ``git worktree add`` (removed afterwards); both trees run with
this interpreter, one torch thread, in alternating rounds after one untimed job of each (disk
caches, compiled code).  Printed: min and median of the rounds, the load.

* ``job``: the benchmark job, d=256, L=96, m/d=4, one seed, ``task.probes=[io_jacobian]``,
  tracking off: the whole process's wall seconds (and its CPU seconds, user + system), beside a
  bare ``python -c "import torch"``, and the drawing and measurement seconds its
  ``result.json`` reports.  The targets: at most 1.3× ``--rev``'s; drawing ≤ the measurement.
* ``cli``: ``rankexp --help`` and a tab press (Hydra's completion query), beside a bare
  ``python -c "import torch"``: the target is at most its time.
* ``sweep``: a sweep's overhead per job, ``(T(n jobs) − T(1 job)) / (n − 1)`` of tiny jobs
  (d=8, L=2) logging to a fresh SQLite store (``--launcher``: ``hydra/launcher=…``).
* ``seeds``: the same job with 8 seeds, against one sweep process running the 8 one-seed jobs
  (``seed=0,…,7 -m``) and against 8 fresh processes of one seed (this tree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from .common import ROOT, alternate, checkout, commit, header, load, rankexp, ratio, run, spread

JOB = ["width=256", "depth=96", "expansion=4", "task.probes=[io_jacobian]", "tracking=off"]
TINY = ["width=8", "depth=2", "seeds=1"]
ROWS = ["job", "cli", "sweep", "seeds"]


def wall(args: list[str], tree: Path, cpu: list[float] | None = None, parts: list[tuple] | None = None) -> float:
    """Wall seconds of a fresh job in a temporary folder; its CPU seconds appended to ``cpu``, and
    to ``parts`` the (drawing, measurement) seconds its ``result.json`` reports, where it has one."""
    with tempfile.TemporaryDirectory(prefix="bench-job-") as tmp:
        w, c, _ = rankexp(args, tree, Path(tmp))
        for result in Path(tmp).rglob("result.json") if parts is not None else ():
            sc = json.loads(result.read_text()).get("scalars", {})
            if "measure_seconds" in sc:
                parts.append((sc.get("build_seconds", 0.0), sc["measure_seconds"]))
    if cpu is not None:
        cpu.append(c)
    return w


def import_torch() -> float:
    return run(["-c", "import torch"])[0]


def row_cli(trees: dict[str, Path], rounds: int) -> None:
    line = "rankexp norm="  # a tab press: Hydra's bash completion query for this line
    contenders = {"import torch": import_torch}
    for v, tree in trees.items():
        contenders[f"{v} --help"] = lambda tree=tree: run(["-m", "rankexp", "--help"], tree)[0]
        contenders[f"{v} tab"] = lambda tree=tree: run(["-m", "rankexp", "-sc", "query=bash"], tree,
                                                       COMP_LINE=line, COMP_POINT=str(len(line)))[0]
    t = alternate(contenders, rounds, warm=False)
    print(f"cli: `rankexp --help` and a tab press after {line!r}, fresh processes ({rounds} rounds):")
    for name, ts in t.items():
        print(f"  {name:40s} wall {spread(ts, fmt='.2f')}"
              + ("" if name == "import torch" else f" → {ratio(ts, t['import torch'])} import torch [target ≤ 1×]"))
    print(f"  ({load()})", flush=True)


def row_job(trees: dict[str, Path], rounds: int) -> None:
    cpu: dict[str, list[float]] = {v: [] for v in trees}
    parts: dict[str, list[tuple]] = {v: [] for v in trees}
    contenders = {"import torch": import_torch}
    for v, tree in trees.items():
        contenders[v] = lambda v=v, tree=tree: wall([*JOB, "seeds=1"], tree, cpu[v], parts[v])
    t = alternate(contenders, rounds, warm=False)
    print(f"job: d=256 L=96 m/d=4, one seed, io_jacobian, tracking off, fresh process ({rounds} rounds):")
    for name, ts in t.items():
        print(f"  {name:28s} wall {spread(ts, fmt='.2f')}"
              + (f"; CPU {spread(cpu[name], fmt='.2f')}" if name in cpu else ""))
        if parts.get(name):  # as the job reports them
            draw, measure = zip(*parts[name], strict=True)
            print(f"  {'':28s} of which drawing the weights {spread(draw, fmt='.2f')}, the measurement "
                  f"{spread(measure, fmt='.2f')} → drawing / measurement {ratio(draw, measure)}")
    if len(trees) == 2:
        (b, bt), (a, at) = list(t.items())[1:]
        r = statistics.median(at) / statistics.median(bt)
        print(f"  {a} / {b}: wall {ratio(at, bt)}, CPU {ratio(cpu[a], cpu[b])} "
              f"[target ≤ 1.3×: {'met' if r <= 1.3 else 'NOT met'}]")
    print(f"  ({load()})", flush=True)


def row_seeds(tree: Path, rounds: int) -> None:
    seeds = ",".join(map(str, range(8)))
    t = alternate({
        "one job, 8 seeds": lambda: wall([*JOB, "seeds=8"], tree),
        "one sweep, 8 jobs": lambda: wall([*JOB, "seeds=1", f"seed={seeds}", "-m"], tree),
        "8 processes": lambda: sum(wall([*JOB, "seeds=1", f"seed={s}"], tree) for s in range(8)),
    }, rounds, warm=False)
    print(f"seeds: 8 seeds of the job above, this tree ({rounds} rounds):")
    one = t["one job, 8 seeds"]
    for name, ts in t.items():
        print(f"  {name:28s} wall {spread(ts, fmt='.2f')}" + ("" if ts is one else f" → {ratio(ts, one)} one job"))
    print(f"  ({load()})", flush=True)


def row_sweep(trees: dict[str, Path], rounds: int, jobs: int, launcher: str | None) -> None:
    extra = [*TINY, "-m"] + ([f"hydra/launcher={launcher}"] if launcher else [])
    cpu: dict[str, list[float]] = {}

    def sweep(name: str, tree: Path, n: int) -> float:  # a fresh SQLite store in the job's own folder
        return wall([*extra, "alpha=" + ",".join(f"{1 + i / 100:g}" for i in range(n))], tree,
                    cpu.setdefault(name, []))

    contenders = {}
    for v, tree in trees.items():
        for n in (1, jobs):
            contenders[f"{v} {n}"] = lambda name=f"{v} {n}", tree=tree, n=n: sweep(name, tree, n)
    t = alternate(contenders, rounds, warm=False)
    print(f"sweep: overhead per job, (T({jobs} tiny jobs) − T(1)) / {jobs - 1}, SQLite store, "
          f"launcher {launcher or 'the default'} ({rounds} rounds):")

    def per_job(x: dict[str, list[float]], v: str, f=statistics.median) -> float:
        return (f(x[f"{v} {jobs}"]) - f(x[f"{v} 1"])) / (jobs - 1)

    for v in trees:
        one, many, med = t[f"{v} 1"], t[f"{v} {jobs}"], per_job(t, v)
        print(f"  {v:28s} 1 job {spread(one, fmt='.2f')}; {jobs} jobs {spread(many, fmt='.2f')} → "
              f"{med:.3f} s per job (of minima {per_job(t, v, min):.3f} s; T(1)'s spread alone "
              f"±{(max(one) - min(one)) / (jobs - 1):.3f} s per job) [target ≤ 0.25 s: {'met' if med <= 0.25 else 'NOT met'}]")
        if launcher in (None, "basic"):  # the jobs run in the sweep's process: its CPU seconds are theirs
            print(f"  {'':28s} in CPU seconds {per_job(cpu, v):.3f} s per job (of minima {per_job(cpu, v, min):.3f} s)")
    print(f"  ({load()})", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", help="the commit to compare with (a git worktree of it); none: this tree alone")
    p.add_argument("--rows", nargs="+", choices=ROWS, default=ROWS)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=20, help="jobs of the sweep row")
    p.add_argument("--launcher", help="hydra/launcher of the sweep row (local, slurm …)")
    args = p.parse_args(argv)
    header("benchmarks.job")
    with checkout(args.rev) if args.rev else tempfile.TemporaryDirectory() as before:
        trees = {f"this tree ({commit()})": ROOT}
        if args.rev:
            c = commit(Path(before))
            trees = {args.rev if c.startswith(args.rev) else f"{args.rev} ({c})": Path(before), **trees}
        for tree in trees.values():  # untimed: disk caches, anything a tree compiles on first use
            wall([*TINY, "tracking=off"], tree)
        for row in args.rows:
            if row == "job":
                row_job(trees, args.rounds)
            elif row == "cli":
                row_cli(trees, args.rounds)
            elif row == "seeds":
                row_seeds(ROOT, max(1, args.rounds // 2))
            else:
                row_sweep(trees, args.rounds, args.jobs, args.launcher)


if __name__ == "__main__":
    main()
