"""``make figures``: every figure and table of the study at a CPU size, on this machine.

    python -m analysis.figures [--out DIR] [--only fig1,fig5] [--size cpu] [--dry-run]

For every experiment config ``conf/experiment/<id>.yaml`` (all but ``demo``; the study's ids
that have no config yet are listed as skipped) the driver

1. runs the sweep at ``size=cpu`` (``--size`` picks another: ``smoke``, ``full``), i.e.
   ``python -m rankexp experiment=<id> size=cpu -m`` — the experiment's own
   ``conf/size/<id>/cpu.yaml`` sets its CPU-sized grid — into its own tracking store
   ``DIR/mlflow.db`` (Hydra output under ``DIR/multirun/<id>/``, the sweep's log in
   ``DIR/logs/<id>.log``), and
2. draws it: every ``python -m analysis …`` command of the config's header, with
   ``--uri`` pointing at that store and ``--out DIR``.

The plan comes from the config file's header comment, so each experiment's owner keeps it
next to the full-size sweep:

* ``# also: <overrides>`` — a further sweep into the same experiment (e.g. a second
  activation family whose branch needs other knobs), run at the same size;
* ``python -m analysis <command> <args>`` anywhere in a comment line — an analysis command.

``--sweeps-only`` runs the sweeps and draws nothing (``make reproduce`` then builds
``python -m analysis report``, which draws every figure into the report).

Reruns skip every run that already FINISHED in the store (the
sweeps resume by config hash), so a second ``make figures`` only redraws.  A failing sweep or
command is reported and the driver goes on; the exit status is 1 if anything failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf" / "experiment"
log = logging.getLogger("analysis.figures")

#: the study's figures and tables in drawing order (science.md §3); fig6 (ranks) precedes
#: fig6_train, whose ``analysis fig6`` reads both
STUDY = (
    "fig1",
    "fig2",
    "fig3",
    "fig4",
    "fig5",
    "fig6",
    "fig6_train",
    "fig7",
    "fig8",
    "fig16",
    "tab1",
    "tab6",
)
#: configs that are not figures of the study
NOT_FIGURES = ("demo",)
_ALSO = re.compile(r"^#\s*also:\s*(.*?)\s*$")
_ANALYSIS = re.compile(r"python -m analysis\s+([^#&;]+)")


@dataclass
class Plan:
    """What ``make figures`` does for one experiment."""

    experiment: str
    config: Path
    sweeps: list[list[str]] = field(default_factory=lambda: [[]])  # overrides, one list per sweep
    analyses: list[list[str]] = field(default_factory=list)  # argv of `python -m analysis`


@dataclass
class Outcome:
    experiment: str
    status: str = "ok"  # ok | skipped | failed
    note: str = ""
    sweep_s: float = 0.0
    analysis_s: float = 0.0
    files: list[Path] = field(default_factory=list)


def read_plan(experiment: str, config: Path | None = None) -> Plan:
    """The plan of ``conf/experiment/<experiment>.yaml`` from its header comment."""
    config = config or CONF / f"{experiment}.yaml"
    plan = Plan(experiment, config)
    for line in config.read_text().splitlines():
        if not line.lstrip().startswith("#"):
            continue
        if m := _ALSO.match(line.strip()):
            plan.sweeps.append(m.group(1).split())
        for m in _ANALYSIS.finditer(line):
            argv = m.group(1).split()
            if argv and argv not in plan.analyses:
                plan.analyses.append(argv)
    return plan


def experiments(only: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``(present, missing)`` experiment ids: configs present in drawing order (study ids
    first, then any other config), and the study ids without a config."""
    present = {p.stem for p in CONF.glob("*.yaml")} - set(NOT_FIGURES)
    order = [e for e in STUDY if e in present] + sorted(present - set(STUDY))
    missing = [e for e in STUDY if e not in present]
    if only:
        unknown = [e for e in only if e not in present and e not in STUDY]
        if unknown:
            raise SystemExit(
                f"--only: unknown experiment(s) {unknown}; configs: {', '.join(order)}"
            )
        order = [e for e in order if e in only]
        missing = [e for e in missing if e in only]
    return order, missing


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with every override whose key ``extra`` also sets replaced, then ``extra``."""

    def key(o: str) -> str:
        return o.split("=", 1)[0].lstrip("+~")

    given = {key(o) for o in extra}
    return [o for o in base if key(o) not in given] + list(extra)


def run_sweep(plan: Plan, overrides: list[str], out: Path) -> tuple[int, float]:
    """One sweep in a subprocess; output appended to ``out/logs/<id>.log``."""
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    argv = [
        sys.executable,
        "-m",
        "rankexp",
        f"experiment={plan.experiment}",
        *overrides,
        f"tracking.uri={uri}",
        f"hydra.sweep.dir={(out / 'multirun' / plan.experiment).resolve()}/${{rankexp_stamp:}}",
        "-m",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RANKEXP_STAMP"}
    logfile = out / "logs" / f"{plan.experiment}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(logfile, "a") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n")
        fh.flush()
        rc = subprocess.run(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t0


def run_analysis(
    argv: list[str], out: Path, uri: str | None = None
) -> tuple[int, str, list[Path]]:
    """One analysis command in this process (``analysis.__main__.main``) on the store ``uri``
    (default ``out/mlflow.db``), files under ``out``; returns (status, its output, its files)."""
    from . import __main__ as cli

    uri = uri or f"sqlite:///{(out / 'mlflow.db').resolve()}"
    buf = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [logging.StreamHandler(buf)]  # the command's log goes to its log file
    t0 = time.time()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                rc = cli.main([*argv, "--uri", uri, "--out", str(out)])
            except SystemExit as e:  # argparse errors, commands that exit
                rc = e.code if isinstance(e.code, int) else 1
                if not isinstance(e.code, int) and e.code:
                    print(e.code)
            except Exception:  # a bug in one command must not stop the others
                traceback.print_exc()
                rc = 1
    finally:
        root.handlers = saved
    return rc, buf.getvalue(), written_since(out, t0)


def written_since(out: Path, t0: float) -> list[Path]:
    """Figure/table files under ``out/<experiment>/`` modified at or after ``t0``."""
    skip = {"multirun", "mlartifacts", "logs", "report"}
    dirs = [d for d in out.iterdir() if d.is_dir() and d.name not in skip]
    return sorted(p for d in dirs for p in d.rglob("*") if p.is_file() and p.stat().st_mtime >= t0)


def make_figures(
    out: Path,
    only: list[str] | None = None,
    extra: list[str] | None = None,
    dry_run: bool = False,
    size: str = "cpu",
    draw: bool = True,
) -> list[Outcome]:
    """Run every experiment's sweeps at ``size`` and (``draw``) its analysis commands; return
    what happened."""
    from . import __main__ as cli

    names, missing = experiments(only)
    outcomes = [Outcome(e, "skipped", "no conf/experiment/<id>.yaml yet") for e in missing]
    for e in missing:
        log.info("[%s] skipped: no config file conf/experiment/%s.yaml yet", e, e)
    for name in names:
        plan = read_plan(name)
        res = Outcome(name)
        outcomes.append(res)
        for ov in plan.sweeps:
            ov = merge_overrides([f"size={size}", *ov], extra or [])
            cmd = f"python -m rankexp experiment={name} {' '.join(ov)} -m"
            if dry_run:
                print(cmd)
                continue
            log.info("[%s] sweep: %s", name, cmd)
            rc, dt = run_sweep(plan, ov, out)
            res.sweep_s += dt
            if rc != 0:
                res.status = "failed"
                res.note += f"sweep exited {rc} (see {out / 'logs' / (name + '.log')}); "
                log.error(
                    "[%s] sweep exited %d after %.0f s; log: %s",
                    name,
                    rc,
                    dt,
                    out / "logs" / f"{name}.log",
                )
            else:
                log.info("[%s] sweep done in %.0f s", name, dt)
        for argv in plan.analyses if draw else []:
            if argv[0] not in cli.COMMANDS:
                res.note += f"analysis {argv[0]!r} not registered yet; "
                log.warning("[%s] skipped `analysis %s`: no such command yet", name, argv[0])
                continue
            if dry_run:
                print(f"python -m analysis {' '.join(argv)} --uri <DIR/mlflow.db> --out {out}")
                continue
            t0 = time.perf_counter()
            rc, text, files = run_analysis(argv, out)
            res.analysis_s += time.perf_counter() - t0
            res.files += files
            (out / "logs").mkdir(parents=True, exist_ok=True)
            with open(out / "logs" / f"{name}.log", "a") as fh:
                fh.write(f"\n$ python -m analysis {' '.join(argv)}\n{text}")
            if rc != 0:
                res.status = "failed"
                last = text.strip().splitlines()[-1] if text.strip() else ""
                res.note += f"analysis {argv[0]} exited {rc}: {last[:200]}; "
                log.error(
                    "[%s] python -m analysis %s exited %d: %s", name, " ".join(argv), rc, last
                )
            else:
                log.info("[%s] analysis %s: %d files", name, argv[0], len(files))
    return outcomes


def summary(outcomes: list[Outcome], total_s: float) -> str:
    """A Markdown table of the outcomes."""
    lines = [
        f"make figures: {sum(o.status == 'ok' for o in outcomes)} ok, "
        f"{sum(o.status == 'failed' for o in outcomes)} failed, "
        f"{sum(o.status == 'skipped' for o in outcomes)} skipped in {total_s / 60:.1f} min",
        "",
        "| experiment | status | sweep s | analysis s | files | note |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.experiment} | {o.status} | {o.sweep_s:.0f} | {o.analysis_s:.0f} | "
            f"{len(o.files)} | {o.note.strip('; ')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m analysis.figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        default="figures/cpu",
        type=Path,
        help="output folder: tracking store, figures, logs (default: figures/cpu)",
    )
    p.add_argument(
        "--only",
        type=lambda s: [v for v in s.split(",") if v],
        default=None,
        help="comma-separated experiment ids (default: all)",
    )
    p.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="overrides for every sweep; they replace an override of the same "
        "key, e.g. hydra/launcher=local or seeds=1",
    )
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
    outcomes = make_figures(
        args.out, args.only, args.extra, args.dry_run, args.size, draw=not args.sweeps_only
    )
    if args.dry_run:
        return 0
    text = summary(outcomes, time.perf_counter() - t0)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
