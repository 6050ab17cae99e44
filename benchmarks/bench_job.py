"""The whole job a user runs, before → after issue 18, every row measured in one run.

    python -m benchmarks.bench_job                  # every row (≈ 15 min on an idle 2-core machine)
    python -m benchmarks.bench_job --rows 1 3 4 2   # some rows, in this order
    python -m benchmarks.bench_job --before <ref>   # another "before" (default: main before issue 18)

"before" is :data:`benchmarks.common.BEFORE_COMMIT`'s code, extracted with ``git archive`` and run
in subprocesses of this run, alternating with this checkout's, the fastest of ``--repeat``
rounds of each kept; the load average is printed beside every row.  One torch thread unless a
row says otherwise.

1. A fresh ``task.probes=[io_jacobian]`` job, d=256, L=96, one seed: drawing the weights,
   the measurement, everything else (imports, composition, store, writing the result) against a
   bare ``python -c "import torch"``; a tiny job (depth=4 width=16 seeds=1) with a SQLite store;
   where the seconds go by cProfile.
2. 8 seeds in one job against 8 one-seed jobs (fresh processes, a SQLite store), the whole job,
   at 1 thread and at 2.
3. Sweep overhead per job: (T(20 tiny jobs) − T(1 job)) / 19; job configs built and checks run.
4. Memory: L=384, d=256, profile, ``task.max_memory_gb=1`` (3 seeds): chunk size, peak RSS,
   the per-seed estimate; L=192, 3 seeds in chunks of 1 against 2 seeds in one batch.
"""

from __future__ import annotations

import argparse
import ast
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import (
    BEFORE_COMMIT,
    ROOT,
    checkout,
    clean_env,
    fresh_job,
    header,
    load,
    python_run,
    rounds,
    verdict,
)

BIG = ["width=256", "depth=96", "expansion=4", "seeds=1", "task.probes=[io_jacobian]"]
#: the big job's weights: L = 96 blocks of two d × m float64 matrices, d = 256, m = 4d
BIG_WEIGHT_BYTES = 96 * 2 * 256 * 1024 * 8
FIRST_TOUCH = ("import sys, time, torch\n"
               "x = torch.empty({n} // 8, dtype=torch.float64)\n"
               "t = time.perf_counter(); x.fill_(0.0); print(time.perf_counter() - t)")


def first_touch() -> dict:
    """Seconds a fresh process takes to write the big job's weight bytes once (the page faults
    of new memory: the floor under drawing them, whatever the generator)."""
    out = subprocess.run([sys.executable, "-c", FIRST_TOUCH.format(n=BIG_WEIGHT_BYTES)],
                         env=clean_env(ROOT), check=True, capture_output=True, text=True)
    return {"wall_s": float(out.stdout.strip())}
TINY = ["width=16", "depth=4", "seeds=1"]


class Store:
    """A working directory with a SQLite store whose schema exists (created once, not timed)."""

    def __init__(self, tree: Path):
        self.tree, self.dir = tree, Path(tempfile.mkdtemp(prefix="bench-store-"))
        self.uri = f"sqlite:///{self.dir}/mlflow.db"
        fresh_job([*TINY, f"tracking.uri={self.uri}"], tree, tracking=True, cwd=self.dir)

    def job(self, overrides, **kw) -> dict:
        """A job logging to this store; ``tracking.force``: a config run before runs again
        (a resumed sweep would skip it)."""
        return fresh_job([*overrides, f"tracking.uri={self.uri}", "tracking.force=true"],
                         self.tree, tracking=True, cwd=self.dir, **kw)


# --------------------------------------------------------------------------- 1. a fresh job
def row_fresh(trees: dict[str, Path], stores: dict[str, Store], repeat: int) -> None:
    contenders = {"import torch": lambda: python_run("import torch"), "first touch": first_touch}
    for v, tree in trees.items():
        contenders[f"{v} job"] = lambda t=tree: fresh_job(BIG, t)
        contenders[f"{v} tiny"] = lambda v=v: stores[v].job(TINY)
    best = rounds(contenders, repeat)
    torch_s = best["import torch"]["wall_s"]
    print(f"1. fresh task.probes=[io_jacobian] job, d=256 L=96 m/d=4, one seed, tracking off "
          f"(fastest of {repeat} alternating rounds; {load()}):")
    parts = {}
    for v in trees:
        b = best[f"{v} job"]
        draw, meas = b["scalars"]["build_seconds"], b["scalars"]["measure_seconds"]
        rest = b["wall_s"] - draw - meas
        parts[v] = (draw, meas, rest)
        print(f"   {v:6s}: wall {b['wall_s']:5.2f} s = drawing the weights {draw:.2f} s + "
              f"measurement {meas:.2f} s + everything else {rest:.2f} s ({rest / torch_s:.2f}× import torch)")
    draw_b, _, rest_b = parts["before"]
    draw, meas, rest = parts["after"]
    print(f"   bare `python -c 'import torch'`: {torch_s:.2f} s")
    print(f"   drawing: {draw_b / draw:.2f}× faster [target ≥ 3×: {verdict(draw_b / draw >= 3)}]; "
          f"drawing / measurement {draw / meas:.2f} [target ≤ 0.5: {verdict(draw <= 0.5 * meas)}]")
    touch = best["first touch"]["wall_s"]
    print(f"   the floor under drawing a network whole: writing its {BIG_WEIGHT_BYTES / 1e6:.0f} MB "
          f"of weights once in a fresh process (page faults of new memory) takes {touch:.2f} s = "
          f"{touch / meas:.2f} × the measurement (a streamed job, io_jacobian alone, holds one "
          f"block's weights and pays it once per block buffer)")
    print(f"   everything else / import torch: {rest_b / torch_s:.2f}× → {rest / torch_s:.2f}× "
          f"[target ≤ 1.5×: {verdict(rest <= 1.5 * torch_s)}]")
    tb, ta = best["before tiny"]["wall_s"], best["after tiny"]["wall_s"]
    print(f"   tiny job (depth=4 width=16 seeds=1, SQLite store): {tb:.2f} s → {ta:.2f} s = "
          f"{tb / torch_s:.2f}× → {ta / torch_s:.2f}× import torch [target ≤ 2×: {verdict(ta <= 2 * torch_s)}]")
    cpu = {k: v["cpu_min"] for k, v in best.items() if "cpu_min" in v}
    print(f"   the same in CPU seconds of the process (user + sys, least of the rounds; a loaded "
          f"machine inflates wall, not these): import torch {cpu['import torch']:.2f} s; "
          + "; ".join(f"{v} job {cpu[f'{v} job']:.2f} s, tiny {cpu[f'{v} tiny']:.2f} s" for v in trees))
    # CPU seconds of drawing and measuring where the job logs them (this change on), else wall
    split = {v: (sc.get("build_cpu_seconds", sc["build_seconds"]),
                 sc.get("measure_cpu_seconds", sc["measure_seconds"]))
             for v in trees for sc in [best[f"{v} job"]["scalars"]]}
    rest_cpu = {v: cpu[f"{v} job"] - sum(split[v]) for v in trees}
    print("   CPU: " + "; ".join(f"{v} drawing {d:.2f} s + measurement {m:.2f} s"
                           + ("" if "build_cpu_seconds" in best[f"{v} job"]["scalars"] else " (wall: not logged)")
                           for v, (d, m) in split.items())
          + f" → drawing / measurement {split['after'][0] / split['after'][1]:.2f} [target ≤ 0.5: "
          f"{verdict(split['after'][0] <= 0.5 * split['after'][1])}]")
    print(f"   CPU: everything else / import torch {rest_cpu['before'] / cpu['import torch']:.2f}× → "
          f"{rest_cpu['after'] / cpu['import torch']:.2f}× [target ≤ 1.5×: "
          f"{verdict(rest_cpu['after'] <= 1.5 * cpu['import torch'])}]; tiny job / import torch "
          f"{cpu['before tiny'] / cpu['import torch']:.2f}× → {cpu['after tiny'] / cpu['import torch']:.2f}× "
          f"[target ≤ 2×: {verdict(cpu['after tiny'] <= 2 * cpu['import torch'])}]")
    for v, tree in trees.items():
        print(f"   cProfile, {v}: {profile_breakdown(tree)}")


def profile_breakdown(tree: Path) -> str:
    """Where a fresh job's seconds go, by cProfile (as the issue measured it)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "prof"
        cmd = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "rankexp", *BIG,
               "tracking=off", "device=cpu", f"hydra.run.dir={tmp}/run"]
        subprocess.run(cmd, cwd=tmp, env=clean_env(tree), check=True, capture_output=True)
        stats = pstats.Stats(str(out)).stats  # (file, line, name) → (cc, nc, tt, ct, callers)

    def cum(name: str, where: str = "") -> tuple[float, int]:
        hits = [(v[3], v[1]) for k, v in stats.items() if k[2] == name and where in k[0]]
        return (max(h[0] for h in hits), sum(h[1] for h in hits)) if hits else (0.0, 0)

    total = cum("<module>", "rankexp/__main__.py")[0] or max(v[3] for v in stats.values())
    imports = cum("_find_and_load")[0]
    compose, n = cum("load_configuration", "config_loader_impl")
    draw = (cum("__init__", "rankexp/models/mlp.py")[0]  # drawn whole, or block by block in the sweep
            + cum("_draw_streamed", "rankexp/models/mlp.py")[0] + cum("_draw_down", "rankexp/models/mlp.py")[0])
    task = cum("task_measure")[0]
    return (f"{total:.1f} s: imports {imports:.1f} s ({imports / total:.0%}), Hydra composing "
            f"{compose:.2f} s ({n}×), drawing the weights {draw:.2f} s ({draw / total:.0%}), the "
            f"measurement {task - draw:.2f} s ({(task - draw) / total:.0%})")


# --------------------------------------------------------------------------- 2. seeds batched
def row_seeds(trees: dict[str, Path], stores: dict[str, Store]) -> None:
    print(f"2. 8 seeds in one job vs 8 one-seed jobs (SQLite store, the whole job; d=256 L=96 "
          f"io_jacobian; {load()}):")
    got = {}
    for v in trees:  # the 8 one-seed jobs as one sweep: one process, imports paid once
        one = stores[v].job([*BIG[:3], "seeds=8", BIG[4]])
        sweep = stores[v].job([*BIG, "seed=" + ",".join(map(str, range(8)))], multirun=True)
        got[v] = sweep["wall_s"] / one["wall_s"]
        print(f"   {v:6s}, 1 thread, one sweep of 8 one-seed jobs {sweep['wall_s']:6.1f} s "
              f"({sweep['cpu_s']:.1f} s CPU), one 8-seed job {one['wall_s']:5.1f} s "
              f"({one['cpu_s']:.1f} s CPU) → {got[v]:.2f}× wall, {sweep['cpu_s'] / one['cpu_s']:.2f}× CPU")
    print(f"   → {got['before']:.2f}× → {got['after']:.2f}× in one process [target ≥ 3×: "
          f"{verdict(got['after'] >= 3)}]; as 8 separate commands (fresh processes):")
    for threads in (1, 2):
        got, cpu = {}, {}
        for v in trees:
            one = stores[v].job([*BIG[:3], "seeds=8", BIG[4]], threads=threads)
            jobs = [stores[v].job([*BIG, f"seed={k}"], threads=threads) for k in range(8)]
            each, each_cpu = sum(j["wall_s"] for j in jobs), sum(j["cpu_s"] for j in jobs)
            got[v], cpu[v] = each / one["wall_s"], each_cpu / one["cpu_s"]
            print(f"   {v:6s}, {threads} thread(s): 8 jobs {each:6.1f} s ({each_cpu:.1f} s CPU), one "
                  f"job {one['wall_s']:5.1f} s ({one['cpu_s']:.1f} s CPU) → {got[v]:.2f}× wall, {cpu[v]:.2f}× CPU")
        print(f"   → {got['before']:.2f}× → {got['after']:.2f}× wall, {cpu['before']:.2f}× → "
              f"{cpu['after']:.2f}× CPU at {threads} thread(s) [target ≥ 3×: wall "
              f"{verdict(got['after'] >= 3)}, CPU {verdict(cpu['after'] >= 3)}]")


# --------------------------------------------------------------------------- 3. sweep overhead
COUNTER = """
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
import rankexp.config.checks as config
calls = {"configs": 0, "checks": 0}
apply, check = ConfigLoaderImpl._apply_overrides_to_config, config.check_job
def counted_apply(*a, **k):
    calls["configs"] += 1
    return apply(*a, **k)
def counted_check(*a, **k):
    calls["checks"] += 1
    return check(*a, **k)
ConfigLoaderImpl._apply_overrides_to_config = staticmethod(counted_apply)
config.check_job = counted_check
from rankexp import cli
sys.argv = ["rankexp", *sys.argv[1:]]
try:
    cli.cli()
except SystemExit:
    pass
print("COUNTS", calls)
"""


def sweep_counts(tree: Path, jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        alphas = ",".join(f"{1 + i / 100:g}" for i in range(jobs))
        out = subprocess.run([sys.executable, "-c", COUNTER, "width=8", "depth=2", "seeds=1",
                              "tracking=off", f"alpha={alphas}", f"hydra.sweep.dir={tmp}/s", "-m"],
                             cwd=tmp, env=clean_env(tree), capture_output=True, text=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("COUNTS")]
    return ast.literal_eval(line[-1].split(" ", 1)[1]) if line else {}


def row_overhead(trees: dict[str, Path], stores: dict[str, Store], repeat: int, jobs: int = 20) -> None:
    tiny = ["width=8", "depth=2", "seeds=1"]
    alphas = ",".join(f"{1 + i / 100:g}" for i in range(jobs))
    contenders = {}
    for v in trees:
        contenders[f"{v} 1"] = lambda v=v: stores[v].job([*tiny, "alpha=1.5"], multirun=True)
        contenders[f"{v} {jobs}"] = lambda v=v: stores[v].job([*tiny, f"alpha={alphas}"], multirun=True)
    best = rounds(contenders, repeat)
    print(f"3. sweep overhead per job, {jobs} tiny jobs (SQLite store; fastest of {repeat} "
          f"alternating rounds; {load()}):")
    per = {}
    for v, tree in trees.items():
        t1, tn = best[f"{v} 1"]["wall_s"], best[f"{v} {jobs}"]["wall_s"]
        per[v] = (tn - t1) / (jobs - 1)
        c = sweep_counts(tree, jobs)
        print(f"   {v:6s}: 1 job {t1:.2f} s, {jobs} jobs {tn:.2f} s → {per[v]:.3f} s per job; job "
              f"configs built {c.get('configs', '?')} (Hydra: 2 + 2×{jobs}), checks {c.get('checks', '?')}")
    print(f"   → {per['before']:.3f} s → {per['after']:.3f} s per job [target ≤ 0.1 s: "
          f"{verdict(per['after'] <= 0.1)}]; composed and checked once per job: "
          f"{verdict(sweep_counts(trees['after'], jobs) == {'configs': 2 + jobs, 'checks': jobs})}")


# --------------------------------------------------------------------------- 4. memory
#: row 4's probe sets: the issue's (since streaming, one block's weights in memory) and one that
#: draws the network whole (``stream`` reads the weights in a walk of its own), whose chunks
#: are what the budget decides
MEMORY_PROBES = {"profile": "[profile]", "profile + stream, drawn whole": "[profile,stream]"}


def row_memory(trees: dict[str, Path]) -> None:
    print(f"4. memory (peak RSS of the job process; {load()}):")
    for what, probes in MEMORY_PROBES.items():
        deep = ["width=256", "depth=384", f"task.probes={probes}"]
        for v, tree in trees.items():
            base = fresh_job(["width=16", "depth=1", "seeds=1"], tree)["scalars"]["peak_memory_gb"]
            one = fresh_job([*deep, "seeds=1"], tree)["scalars"]
            three = fresh_job([*deep, "seeds=3", "task.max_memory_gb=1"], tree)["scalars"]
            chunk = one["peak_memory_gb"] - base
            over = three["peak_memory_gb"] - base
            ok = over <= 1.0 + chunk + 1e-9
            print(f"   {v:6s} L=384 d=256 {what}, 3 seeds, task.max_memory_gb=1: chunks of "
                  f"{three['seed_chunk']:.0f}, peak {three['peak_memory_gb']:.2f} GB (process "
                  f"footprint {base:.2f} GB; one seed alone {one['peak_memory_gb']:.2f} GB) → above "
                  f"the footprint {over:.2f} GB vs budget + one chunk {1 + chunk:.2f} GB [{verdict(ok)}]")
            mid = ["width=256", "depth=192", f"task.probes={probes}"]
            chunked = fresh_job([*mid, "seeds=3", "task.max_memory_gb=0.9"], tree)["scalars"]
            batch = fresh_job([*mid, "seeds=2"], tree)["scalars"]
            print(f"   {v:6s} L=192 {what}: 3 seeds in chunks of {chunked['seed_chunk']:.0f} peak "
                  f"{chunked['peak_memory_gb']:.2f} GB, 2 seeds in one batch {batch['peak_memory_gb']:.2f} GB "
                  f"[never more with chunking: {verdict(chunked['peak_memory_gb'] <= batch['peak_memory_gb'])}]")
        est = subprocess.run([sys.executable, "-c", ESTIMATE.format(probes=probes)],
                             env=clean_env(trees["after"]), capture_output=True, text=True).stdout.strip()
        print(f"   per-seed estimate (after), L=384 d=256 {what}: {est} GB (tests/test_memory.py "
              f"holds it within 1.5× of a seed's live memory)")


ESTIMATE = """
from hydra import compose, initialize_config_dir
from rankexp.cli import CONF_DIR
from rankexp.config import validate
from rankexp.memory import seed_bytes
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    s = validate(compose("config", ["width=256", "depth=384", "task.probes={probes}"]))
print(f"{{seed_bytes(s, 'cpu') / 1e9:.3f}}")
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default=BEFORE_COMMIT)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rows", type=int, nargs="*", default=[1, 2, 3, 4], choices=[1, 2, 3, 4],
                   help="rows to run, in this order")
    args = p.parse_args(argv)
    print(header("benchmarks.bench_job (the whole job)", 1) + f", before = {args.before}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(args.before, Path(tmp))
        if before is None:
            return
        trees = {"before": before, "after": ROOT}
        stores = {v: Store(t) for v, t in trees.items()} if {1, 2, 3} & set(args.rows) else {}
        t0 = time.perf_counter()
        rows = {1: lambda: row_fresh(trees, stores, args.repeat),
                2: lambda: row_seeds(trees, stores),
                3: lambda: row_overhead(trees, stores, args.repeat),
                4: lambda: row_memory(trees)}
        for row in args.rows:  # in the order given: the longest (2) last on a loaded machine
            rows[row]()
            sys.stdout.flush()
        print(f"bench_job done in {(time.perf_counter() - t0) / 60:.1f} min; {load()}")


if __name__ == "__main__":
    main()
