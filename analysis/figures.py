"""``make figures`` / ``make reproduce``: every experiment of the registry, swept and drawn.

    python -m analysis.figures [--out DIR] [--only fig1,fig5] [--size cpu] [--dry-run]

Each ``reproduce`` entry (document order, after the experiments it ``reads``) is swept with
``python -m rankexp experiment=<id> size=cpu -m`` into ``DIR/mlflow.db`` (Hydra output under
``DIR/multirun/<id>/``, log ``DIR/logs/<id>.log``), then drawn by its entry's commands.  An
experiment whose :class:`~analysis.core.registry.Needs` this machine lacks is skipped;
``--sweeps-only`` draws nothing.  Reruns skip FINISHED runs; a failure is reported and the
driver goes on (exit 1)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .core.registry import Experiment, Registry, default
from .core.runner import run_logged

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("analysis.figures")


@dataclass
class Outcome:
    experiment: str
    status: str = "ok"  # ok | skipped | failed
    note: str = ""
    sweep_s: float = 0.0
    analysis_s: float = 0.0
    files: list[Path] = field(default_factory=list)


def experiments(only: list[str] | None = None, registry: Registry | None = None) -> list[Experiment]:
    """The entries ``make figures`` runs, in document order (every ``reproduce`` entry, or those of
    ``only``), each after what it ``reads``; SystemExit for an unknown id."""
    reg = registry or default()
    if only:
        unknown = [e for e in only if e not in reg]
        if unknown:
            raise SystemExit(f"--only: unknown experiment(s) {unknown}; registered: {', '.join(reg.ids())}")
        wanted = set(only) | {r for e in only for r in reg[e].reads}
    else:
        wanted = {e.id for e in reg if e.reproduce}
    return [e for e in reg if e.id in wanted]


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with every override whose key ``extra`` also sets replaced, then ``extra``."""

    def key(o: str) -> str:
        return o.split("=", 1)[0].lstrip("+~")

    given = {key(o) for o in extra}
    return [o for o in base if key(o) not in given] + list(extra)


def run_sweep(experiment: str, overrides: list[str], out: Path) -> tuple[int, float]:
    """One experiment's sweep in a subprocess; output appended to ``out/logs/<id>.log``."""
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    sweep_dir = f"{(out / 'multirun' / experiment).resolve()}/${{rankexp_stamp:}}"
    argv = [sys.executable, "-m", "rankexp", f"experiment={experiment}", *overrides,
            f"tracking.uri={uri}", f"hydra.sweep.dir={sweep_dir}", "-m"]
    env = {k: v for k, v in os.environ.items() if k != "RANKEXP_STAMP"}
    logfile = out / "logs" / f"{experiment}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(logfile, "a") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n")
        fh.flush()
        rc = subprocess.run(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t0


def make_figures(out: Path, only: list[str] | None = None, extra: list[str] | None = None,
                 dry_run: bool = False, size: str = "cpu", draw: bool = True,
                 registry: Registry | None = None) -> list[Outcome]:
    """Run every experiment's sweep at ``size`` and (``draw``) its analysis commands; return
    what happened."""
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    outcomes = []
    for entry in experiments(only, registry):
        res = Outcome(entry.id)
        outcomes.append(res)
        missing = entry.needs.missing()
        if missing:
            res.status, res.note = "skipped", f"this machine lacks {missing}"
            log.info("[%s] skipped: this machine lacks %s", entry.id, missing)
            continue
        ov = merge_overrides([f"size={size}"], extra or [])
        cmd = f"python -m rankexp experiment={entry.id} {' '.join(ov)} -m"
        argvs = entry.argvs() if draw else []
        if dry_run:
            print(cmd, *(f"python -m analysis {' '.join(argv)} --uri <DIR/mlflow.db> --out {out}"
                         for argv in argvs), sep="\n")
            continue
        log.info("[%s] sweep: %s", entry.id, cmd)
        rc, dt = run_sweep(entry.id, ov, out)
        res.sweep_s += dt
        logfile = out / "logs" / f"{entry.id}.log"
        if rc != 0:
            res.status = "failed"
            res.note += f"sweep exited {rc} (see {logfile}); "
            log.error("[%s] sweep exited %d after %.0f s; log: %s", entry.id, rc, dt, logfile)
        else:
            log.info("[%s] sweep done in %.0f s", entry.id, dt)
        for argv in argvs:
            t0 = time.perf_counter()
            rc, text, files = run_logged(argv, out, uri, logfile)
            res.analysis_s += time.perf_counter() - t0
            res.files += files
            if rc != 0:
                res.status = "failed"
                last = text.strip().splitlines()[-1] if text.strip() else ""
                res.note += f"analysis {argv[0]} exited {rc}: {last[:200]}; "
                log.error("[%s] python -m analysis %s exited %d: %s", entry.id, " ".join(argv), rc,
                          last)
            else:
                log.info("[%s] analysis %s: %d files", entry.id, argv[0], len(files))
    return outcomes


def summary(outcomes: list[Outcome], total_s: float) -> str:
    """A Markdown table of the outcomes."""
    n = {s: sum(o.status == s for o in outcomes) for s in ("ok", "failed", "skipped")}
    lines = [f"make figures: {n['ok']} ok, {n['failed']} failed, {n['skipped']} skipped in "
             f"{total_s / 60:.1f} min", "",
             "| experiment | status | sweep s | analysis s | files | note |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {o.experiment} | {o.status} | {o.sweep_s:.0f} | {o.analysis_s:.0f} | "
              f"{len(o.files)} | {o.note.strip('; ')} |" for o in outcomes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="figures/cpu", type=Path,
                   help="output folder: tracking store, figures, logs (default: figures/cpu)")
    p.add_argument("--only", type=lambda s: [v for v in s.split(",") if v], default=None,
                   help="comma-separated experiment ids (default: all)")
    p.add_argument("--extra", nargs="*", default=[], help="overrides for every sweep; they "
                   "replace an override of the same key, e.g. hydra/launcher=local or seeds=1")
    p.add_argument("--size", default="cpu", choices=["smoke", "cpu", "full"],
                   help="the experiments' size (conf/size/<experiment>/<size>.yaml; default cpu)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--sweeps-only", action="store_true",
                   help="run the sweeps, draw nothing (make reproduce: the report draws)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    t0 = time.perf_counter()
    if not args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
    outcomes = make_figures(args.out, args.only, args.extra, args.dry_run, args.size,
                            draw=not args.sweeps_only)
    if args.dry_run:
        return 0
    text = summary(outcomes, time.perf_counter() - t0)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
