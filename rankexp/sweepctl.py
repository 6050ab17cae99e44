"""Slurm around the stock submitit launcher.

* :class:`SlurmCheck` (``hydra.callbacks.slurm_check`` of ``hydra/launcher=slurm*``): the
  launcher's request checked against the cluster (:func:`check_cluster`) and its signal delay
  against its limit before the sweep starts; any problem: one line each, exit 2.
* ``rankexp detach OVERRIDES -m``: the whole sweep as one small Slurm job, the *driver*, which
  runs ``rankexp OVERRIDES -m`` on a compute node; :data:`DETACHED_FILE` in the sweep
  directory names it.
* ``rankexp status DIR|JOBID``: the driver's and array tasks' Slurm states, the jobs done and
  an ETA; the driver's last log lines once it failed.
* ``rankexp cancel DIR|JOBID``: SIGTERM to the driver, then to its arrays (the runs close
  KILLED), ``scancel`` after :data:`WAIT_S` at the latest.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import submitit
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .config import ConfigError, check_override_keys, check_slurm_limits, config_groups, sweep_stamp
from .locations import CONF_DIR

DETACHED_FILE = "detached.json"  #: in a detached sweep's directory: the driver job
ENDED = ("FINISHED", "SKIPPED", "FAILED", "KILLED")  #: a job's ``status.json`` once it is over
LIVE = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING", "CONFIGURING")
WAIT_S = 60.0  # how long `cancel` waits for Slurm to end what it cancelled


class SweepNotFound(ValueError):
    """``DIR|JOBID`` names no detached sweep this machine can see."""


# --------------------------------------------------------------------------- the pre-check
class SlurmCheck(Callback):
    """Refuse a Slurm sweep the cluster cannot run, before anything exists (exit 2)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = config.hydra.launcher
        errors = check_cluster(launcher)
        try:
            check_slurm_limits(launcher)
        except ValueError as e:
            errors.append(str(e))
        if errors:
            print("error: invalid sweep — nothing was started:\n"
                  + "\n".join(f"  launcher: {m}" for m in errors), file=sys.stderr)
            raise SystemExit(2)


def check_cluster(launcher: Any, who: str = "hydra/launcher=slurm") -> list[str]:
    """One message per problem of a launcher request with the cluster (``sinfo``): the
    partition is up, CPUs, memory, GPUs, nodes and ``timeout_min`` fit, and every
    ``additional_parameters`` key is an sbatch option."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        local = ", or drop it for a local sweep" if who.startswith("hydra/") else ""
        return [f"{who} needs Slurm, and sbatch/sinfo are not on PATH: this machine is not a Slurm "
                f"submit host (run it where sbatch works{local})"]
    part = launcher.get("partition")
    rows = _sinfo(["-p", str(part)] if part else [])
    if isinstance(rows, str):
        return [rows]
    if not part:
        rows = [r for r in rows if r["partition"].endswith("*")] or rows
    if not rows:
        names = _sinfo([])
        known = ", ".join(sorted({r["partition"].rstrip("*") for r in names})
                          ) if isinstance(names, list) else "?"
        return [f"hydra.launcher.partition={part!r}: Slurm has no such partition (it has: {known})"]
    return _fits(launcher, rows) + _unknown_options(launcher)


def _sinfo(args: list[str]) -> list[dict[str, str]] | str:
    fields = ("partition", "avail", "cpus", "memory", "timelimit", "gres", "nodes")
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%P|%a|%c|%m|%l|%G|%D", *args],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as e:
        p = subprocess.CompletedProcess([], 1, "", f"{type(e).__name__}, after at most 15 s")
    if p.returncode != 0:
        line = next((x for x in p.stderr.splitlines() if x.strip()), f"exit {p.returncode}")
        return f"Slurm does not answer (sinfo: {line.strip()}); is slurmctld up, SLURM_CONF right?"
    return [dict(zip(fields, line.split("|"), strict=True)) for line in p.stdout.splitlines()
            if line.count("|") == len(fields) - 1]


def _number(text: str) -> float:
    """``"2+"`` → 2; no leading number (``n/a``) → infinity."""
    m = re.match(r"\d+", text.strip())
    return float(m[0]) if m else math.inf


def _minutes(limit: str) -> float:
    """A Slurm time limit (``infinite``, ``1-00:00:00``, ``2:00:00``, ``30:00``) in minutes."""
    limit = limit.strip().lower()
    if not limit or limit in ("infinite", "unlimited", "n/a", "none"):
        return math.inf
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + h * 60 + m + sec / 60


def _fits(launcher: Any, rows: list[dict[str, str]]) -> list[str]:
    where = f"partition {rows[0]['partition'].rstrip('*')}"
    if all(r["avail"] != "up" for r in rows):
        return [f"{where} is {rows[0]['avail']} (sinfo): no job would start there"]
    cpus, mem = max(_number(r["cpus"]) for r in rows), max(_number(r["memory"]) for r in rows)
    limit = max(_minutes(r["timelimit"]) for r in rows)
    nodes = sum(int(_number(r["nodes"])) for r in rows)
    gpus = max((_number(g.split(":")[-1].split("(")[0]) for r in rows for g in r["gres"].split(",")
                if g.startswith("gpu")), default=0)
    tasks = launcher.get("tasks_per_node") or 1
    checks = [  # (key, asked for more than the partition has, what it has)
        ("cpus_per_task", int(launcher.get("cpus_per_task") or 1) * int(tasks) > cpus,
         f" (× tasks_per_node={tasks}) — {where}'s largest node has {cpus:g} CPUs"),
        ("mem_gb", float(launcher.get("mem_gb") or 0) * 1024 > mem,
         f" — {where}'s largest node has {mem / 1024:.1f} GB ({mem:g} MB)"),
        ("timeout_min", float(launcher.get("timeout_min") or 0) > limit,
         f" — {where} allows at most {limit:g} min"),
        ("nodes", int(launcher.get("nodes") or 1) > nodes, f" — {where} has {nodes} nodes"),
        ("gpus_per_node", int(launcher.get("gpus_per_node") or 0) > gpus,
         f" — {where}'s nodes have {gpus:g} GPUs (gres {rows[0]['gres']})")]
    return [f"hydra.launcher.{k}={launcher.get(k)}{has}" for k, over, has in checks if over]


def _unknown_options(launcher: Any) -> list[str]:
    extra = [str(k).replace("_", "-") for k in (launcher.get("additional_parameters") or {})]
    try:
        text = subprocess.run(["sbatch", "--help"], capture_output=True, text=True,
                              timeout=30).stdout if extra else ""
    except (OSError, subprocess.SubprocessError):
        text = ""
    known = sorted(set(re.findall(r"--([a-z][a-z0-9-]*)", text)))
    errors = []
    for k in [k for k in extra if known and k not in known]:
        close = difflib.get_close_matches(k, known, n=1)
        errors.append(f"hydra.launcher.additional_parameters.{k}: sbatch has no option --{k}"
                      + (f" (did you mean --{close[0]}?)" if close else ""))
    return errors


# --------------------------------------------------------------------------- detach
def detach(argv: list[str], out=sys.stdout) -> int:
    """``rankexp detach [--partition P] [--timeout-min N] [--cpus N] [--mem-gb G] OVERRIDES -m``."""
    ap = argparse.ArgumentParser(prog="rankexp detach", description=(
        "Run `rankexp OVERRIDES -m` as one Slurm job (the driver) and return; the options are "
        "the driver's own resources (its sweep's jobs get hydra.launcher.*)."))
    ap.add_argument("--partition", help="the driver's partition (default: the cluster's)")
    ap.add_argument("--timeout-min", type=int, default=1440, help="the driver's time limit (1440)")
    ap.add_argument("--cpus", type=int, default=1,
                    help="the driver's CPUs (1; more for hydra/launcher=local)")
    ap.add_argument("--mem-gb", type=float, default=4, help="the driver's memory (4 GB)")
    args, rest = ap.parse_known_args(argv)
    overrides = [a for a in rest if a not in ("-m", "--multirun")]
    check_override_keys(overrides, config_groups(CONF_DIR))
    request = {"partition": args.partition, "timeout_min": args.timeout_min,
               "cpus_per_task": args.cpus, "mem_gb": args.mem_gb}
    errors = "; ".join(check_cluster(OmegaConf.create(request), who="rankexp detach"))
    for key in request:  # the driver's options, not a launcher's keys
        option = key.replace("_per_task", "").replace("_", "-")
        errors = errors.replace(f"hydra.launcher.{key}", f"--{option}")
    if errors:
        raise ConfigError(errors)
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")]
    # the default sweep directory's stamp: set here, inherited by the driver (RANKEXP_STAMP)
    sweep = Path(given[-1] if given else f"multirun/{sweep_stamp()}").resolve()
    executor = submitit.AutoExecutor(folder=sweep / ".submitit" / "%j", cluster="slurm")
    executor.update_parameters(name="rankexp-detach", slurm_partition=args.partition, **{
        k: v for k, v in request.items() if k != "partition"})
    command = [sys.executable, "-m", "rankexp", *overrides, "-m"]
    try:
        job = executor.submit(submitit.helpers.CommandFunction(command, cwd=os.getcwd()))
    except Exception as e:  # sbatch refused it (account, QOS, …): submitit's message, one line
        print(f"error: Slurm did not take the driver: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    tracking.write_json(sweep / DETACHED_FILE, {"job_id": job.job_id, "command": command[3:],
                                                "cwd": os.getcwd(), "submitted": time.time()})
    print(f"detached: the sweep runs in Slurm job {job.job_id} (rankexp {' '.join(overrides)} -m); its "
          f"directory {sweep}\n  follow: rankexp status {job.job_id}\n  stop:   rankexp cancel {job.job_id}",
          file=out, flush=True)
    return 0


# --------------------------------------------------------------------------- status, cancel
def locate(target: str) -> tuple[Path, dict]:
    """The sweep directory and :data:`DETACHED_FILE` named by ``target``: a directory, or the
    driver's Slurm job id (under ``multirun/`` where it was submitted, else here);
    :class:`SweepNotFound` when nothing matches."""
    path = Path(target).expanduser()
    if path.is_dir():
        doc = tracking.read_json(path / DETACHED_FILE)
        if not doc:
            raise SweepNotFound(f"{path} is no detached sweep (it has no {DETACHED_FILE}); a sweep "
                                "in the foreground stops with Ctrl-C")
        return path.resolve(), doc
    if target.isdigit():
        roots = [Path.cwd()]
        if shutil.which("sacct"):
            where = subprocess.run(["sacct", "-j", target, "-X", "-n", "-P", "-o", "WorkDir"],
                                   capture_output=True, text=True, timeout=30).stdout.split()
            roots = [Path(w) for w in where[:1]] + roots
        for root in roots:
            for f in root.glob(f"multirun/*/*/{DETACHED_FILE}"):
                doc = tracking.read_json(f) or {}
                if str(doc.get("job_id")) == target:
                    return f.parent, doc
    raise SweepNotFound(f"{target!r} is no directory, nor the Slurm job id of a sweep detached "
                        "here or in its submit directory (rankexp detach); give its directory")


def _jobs(sweep: Path, doc: dict) -> tuple[Any, list]:
    """submitit's view of the driver and of every array task its sweep submitted."""
    folder = sweep / ".submitit" / "%j"
    tasks = sorted((d.name for d in (sweep / ".submitit").glob("*_*") if re.fullmatch(r"\d+_\d+", d.name)),
                   key=lambda t: tuple(map(int, t.split("_"))))
    return submitit.SlurmJob(folder, str(doc["job_id"])), [submitit.SlurmJob(folder, t) for t in tasks]


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Seconds until every job has ended at the rate so far; None before the first ended."""
    if done >= total:
        return 0.0
    return (total - done) * elapsed / done if done else None


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA — (no job has ended yet)"
    m, s = divmod(int(round(seconds)), 60)
    return f"ETA {m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"ETA {m}:{s:02d}"


def status(target: str, out=sys.stdout) -> int:
    """``rankexp status DIR|JOBID``: the driver, the array tasks, the jobs done; returns 0."""
    sweep, doc = locate(target)
    driver, tasks = _jobs(sweep, doc)
    print(f"driver {driver.job_id}: {driver.state}  (rankexp {' '.join(doc.get('command', []))})", file=out)
    if tasks:
        states = Counter(t.state for t in tasks)
        arrays = sorted({t.job_id.split("_")[0] for t in tasks})
        print(f"array {','.join(arrays)}: "
              + ", ".join(f"{n} {s}" for s, n in sorted(states.items())), file=out)
    plan = tracking.read_json(sweep / tracking.NAMES_FILE) or {}
    docs = [tracking.read_json(Path(d) / "status.json") or {} for d in plan.get("job_dirs") or []]
    if docs:
        counts = Counter((d.get("status") or "not started").lower() for d in docs)
        done = sum(counts[s.lower()] for s in ENDED)
        eta = eta_seconds(done, len(docs), time.time() - float(plan.get("started") or time.time()))
        print(f"{sweep}: {done}/{len(docs)} done (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
              + f"); {_eta(eta)}", file=out)
    else:
        print(f"{sweep}: the sweep has not started", file=out)
    if driver.state not in LIVE and driver.state not in ("COMPLETED", "UNKNOWN"):
        log = (driver.stderr() or driver.stdout() or "").strip().splitlines()
        print(f"the driver ended {driver.state}; its log ({driver.paths.stderr}) ends:\n  "
              + "\n  ".join(log[-8:]), file=out)
    return 0


def cancel(target: str, out=sys.stdout) -> int:
    """``rankexp cancel DIR|JOBID``: stop the driver, then the arrays it submitted; returns 0."""
    sweep, doc = locate(target)
    driver, _ = _jobs(sweep, doc)
    _stop([driver.job_id], [driver])
    _, tasks = _jobs(sweep, doc)  # every array it submitted, now that it submits no more
    _stop(sorted({t.job_id.split("_")[0] for t in tasks}), tasks)
    counts = tracking.count_jobs(tracking.planned_job_dirs(sweep))
    print(f"cancelled Slurm job {driver.job_id} and its {len(tasks)} array tasks; {sweep}: "
          f"{tracking.summary(counts)}", file=out)
    return 0


def _stop(ids: list[str], jobs: list) -> None:
    """Pending jobs cancelled; running ones sent SIGTERM and given :data:`WAIT_S` to close their
    runs, then cancelled."""
    if not ids:
        return
    for how in ("--state=PENDING", "--signal=TERM"):
        subprocess.run(["scancel", how, *ids], capture_output=True, timeout=60)
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end and not all(j.done(force_check=True) for j in jobs):
        time.sleep(1)
    subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def main(argv: list[str]) -> int:
    """``rankexp detach …`` / ``rankexp status DIR|JOBID`` / ``rankexp cancel DIR|JOBID``."""
    try:
        if argv[:1] == ["detach"]:
            return detach(argv[1:])
        ap = argparse.ArgumentParser(prog="rankexp", description=(
            "Follow or stop a sweep detached with `rankexp detach`: its directory "
            "(multirun/DATE/TIME) or its driver's Slurm job id."))
        ap.add_argument("command", choices=("status", "cancel"))
        ap.add_argument("sweep", metavar="DIR|JOBID")
        args = ap.parse_args(argv)
        return (status if args.command == "status" else cancel)(args.sweep)
    except (SweepNotFound, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
