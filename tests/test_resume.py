"""Every run reaches a terminal state, and the same command again resumes (issue 8, row 1).

A local sweep is stopped from outside while its third job computes — SIGTERM to the sweep
(``kill PID``), SIGKILL (the OOM killer, ``kill -9``) — or by Ctrl-C (SIGINT to its process
group) between jobs.  Then the same command runs again.  Checked against the real SQLite
store: no run is left RUNNING, the interrupted runs say why (``rankexp.end_reason``), no
config is FINISHED twice, the parents' counts and the exit statuses tell the truth.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from services import clean_env, finish, rankexp, start_rankexp, sweep_runs

from rankexp.config import config_hash
from rankexp.locations import DATA_CACHE, cache_path

# Hydra's basic launcher runs the jobs one after another in this order: two cheap jobs
# (L=4), then the two L=64 ones.  Job 3 is caught running by making it wait for the signal
# (RANKEXP_FAULT_HANG; the engine computes an L=64 job faster than the store can be polled).
SWEEP = ("norm=post", "depth=4,64", "alpha=1,2", "width=16", "seeds=1", "-m")
GRID = {("4", "1.0"), ("4", "2.0"), ("64", "1.0"), ("64", "2.0")}


def statuses(runs) -> list[str]:
    return sorted(r.info.status for r in runs)


def stop_after_two_finished(tmp_path, uri: str, sig: int, in_job: bool, group: bool = False):
    """Start the sweep, poll its store, send ``sig`` once two runs are FINISHED (and, if
    ``in_job``, the third is RUNNING); returns the sweep's Result."""
    # each job 0.5 s longer, idle: the poll sees exactly two FINISHED however fast jobs start
    env = clean_env(RANKEXP_FAULT_SLEEP="0.5", **({"RANKEXP_FAULT_HANG": "depth=64"} if in_job else {}))
    proc = start_rankexp(*SWEEP, cwd=tmp_path, env=env)
    deadline, seen = time.monotonic() + 240, None
    while proc.poll() is None and time.monotonic() < deadline:
        # poll only once the sweep has created the store (no schema race with it)
        if list(tmp_path.glob("multirun/*/*/mlflow_parent.json")):
            now = statuses(sweep_runs(uri)[1])
            if now.count("FINISHED") >= 2 and (not in_job or "RUNNING" in now):
                if group:
                    os.killpg(proc.pid, sig)
                else:
                    os.kill(proc.pid, sig)
                seen = now
                break
        time.sleep(0.05)
    result = finish(proc, timeout=60)  # a stopped sweep must stop promptly
    assert seen is not None and seen.count("FINISHED") == 2, (seen, result.output[-3000:])
    return result


def rerun_resumes(tmp_path, uri: str, before: set[str]):
    """The same command again: the two unfinished configs run, the two finished are skipped,
    and every config ends FINISHED exactly once, with nothing left RUNNING."""
    second = rankexp(*SWEEP, cwd=tmp_path, env=clean_env(), timeout=300).check()
    assert "2 finished, 2 skipped (already FINISHED), 0 failed, 0 killed, 0 not run" in second.output
    parents, jobs = sweep_runs(uri)
    assert "RUNNING" not in statuses(jobs) + statuses(parents), (statuses(jobs), statuses(parents))
    jobs = [r for r in jobs if r.data.tags["task"] == "measure"]
    finished = [r for r in jobs if r.info.status == "FINISHED"]
    assert len(finished) == 4 and len({r.data.tags["config_hash"] for r in finished}) == 4
    assert {(r.data.params["depth"], r.data.params["alpha"]) for r in finished} == GRID
    assert len({r.info.run_id for r in jobs} - before) == 2
    newest = max(parents, key=lambda p: p.info.start_time)
    assert newest.info.status == "FINISHED"
    m = newest.data.metrics
    assert (m["jobs_finished"], m["jobs_skipped"], m["jobs_failed"], m["jobs_killed"]) == (2, 2, 0, 0)
    return second


def test_sigterm_mid_job_closes_run_and_parent_killed_and_rerun_resumes(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = stop_after_two_finished(tmp_path, uri, signal.SIGTERM, in_job=True)
    assert first.returncode == 128 + signal.SIGTERM, first.output[-3000:]
    assert "2 finished, 0 skipped (already FINISHED), 0 failed, 1 killed, 1 not run" in first.output
    (parent,), jobs = sweep_runs(uri)
    assert statuses(jobs) == ["FINISHED", "FINISHED", "KILLED"]
    (killed,) = [r for r in jobs if r.info.status == "KILLED"]
    assert killed.data.tags["rankexp.end_reason"] == "SIGTERM"
    assert parent.info.status == "KILLED" and parent.data.tags["rankexp.end_reason"] == "SIGTERM"
    assert "rerun the same command" in parent.data.tags["error"]
    m = parent.data.metrics
    assert (m["jobs_finished"], m["jobs_killed"], m["jobs_not_run"], m["jobs_total"]) == (2, 1, 1, 4)
    status = json.loads((tmp_path / killed.data.tags["job_dir"] / "status.json").read_text())
    assert status["status"] == "KILLED" and status["run_id"] == killed.info.run_id
    rerun_resumes(tmp_path, uri, {r.info.run_id for r in jobs})


def test_sigkill_leaves_runs_that_the_next_command_reconciles(tmp_path):
    """Nothing in a SIGKILLed job can report.  A ``task=train`` run SIGKILLed once its run
    exists (RANKEXP_FAULT_KILL) stays RUNNING until the next command in its experiment — here
    a sweep — finds its owner (this host, that pid) gone; that sweep, SIGKILLed mid-job,
    leaves its parent and in-flight child RUNNING until the same sweep again closes them."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train = ("task=train", "depth=2", "width=8", "task.steps=20", "task.eval_every=10",
             "task.lrs=[0.001]", f"task.checkpoint_dir={tmp_path / 'ckpt'}")
    killed = rankexp(*train, cwd=tmp_path, env=clean_env(RANKEXP_FAULT_KILL="depth=2"), timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.output[-2000:]
    (lone,) = sweep_runs(uri)[1]
    assert lone.info.status == "RUNNING"

    first = stop_after_two_finished(tmp_path, uri, signal.SIGKILL, in_job=True)
    assert first.returncode == -signal.SIGKILL
    assert first.output.count("closed stale run") == 1, first.output[-3000:]
    (parent,), jobs = sweep_runs(uri)
    runs = {r.info.run_id: r for r in jobs}
    assert runs[lone.info.run_id].info.status == "KILLED"
    assert runs[lone.info.run_id].data.tags["rankexp.end_reason"] == "owner_gone"
    # killed before its first batch, it gets its config from its job directory's run.json
    assert runs[lone.info.run_id].data.params["task.name"] == "train"
    assert runs[lone.info.run_id].data.params["depth"] == "2"
    measured = [r for r in jobs if r.data.tags["task"] == "measure"]
    assert statuses(measured) == ["FINISHED", "FINISHED", "RUNNING"] and parent.info.status == "RUNNING"
    stale = {parent.info.run_id} | {r.info.run_id for r in measured if r.info.status == "RUNNING"}

    second = rerun_resumes(tmp_path, uri, {r.info.run_id for r in jobs})
    assert second.output.count("closed stale run") == 2, second.output[-3000:]
    parents, jobs = sweep_runs(uri)
    for r in parents + jobs:
        if r.info.run_id in stale:
            assert r.info.status == "KILLED" and r.data.tags["rankexp.end_reason"] == "owner_gone"
            assert f"process {r.data.tags['rankexp.pid']} " in r.data.tags["error"]
    old = next(p for p in parents if p.info.run_id == parent.info.run_id)
    assert old.data.metrics["jobs_finished"] == 2  # counted from its sweep directory


@pytest.mark.slow
def test_ctrl_c_between_jobs_ends_parent_killed_with_the_jobs_not_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = stop_after_two_finished(tmp_path, uri, signal.SIGINT, in_job=False, group=True)
    assert first.returncode == 128 + signal.SIGINT, first.output[-3000:]
    (parent,), jobs = sweep_runs(uri)
    # the signal lands between jobs or just as job 3 created its run: KILLED then, never RUNNING
    assert statuses(jobs) in (["FINISHED", "FINISHED"], ["FINISHED", "FINISHED", "KILLED"])
    assert parent.info.status == "KILLED", parent.info.status
    assert "interrupted by SIGINT" in parent.data.tags["error"]
    m = parent.data.metrics
    assert m["jobs_finished"] == 2 and m["jobs_killed"] + m["jobs_not_run"] == 2
    rerun_resumes(tmp_path, uri, {r.info.run_id for r in jobs})


# ------------------------------------------------- the hash is the experiment, not the machine
#: a tiny training job (20 steps of a 2-block MLP on CIFAR-10)
TINY = ("task=train", "width=8", "task.steps=20", "task.eval_every=10", "task.lrs=[0.001]")
#: a run logged before paths, cadences and compile flags left the hash (issue 28's main): TINY
#: at depth 3 with its data at ``moved/``, and the ``config_hash`` tag main gave it
BEFORE = ("depth=3", "data.root=moved/"), "dd3a2e1547e9c53a"
#: each key that says where or how often, not what is computed, with two of its values
PLACE_VALUES = [("data.root", "../shared/data", "/scratch/elsewhere/cifar/"),
                ("data.cache_dir", "data", "/scratch/cache"), ("data.download", False, True),
                ("task.checkpoint_dir", "checkpoints", "/scratch/ckpt"),
                ("task.checkpoint_every", 500, 7), ("task.log_every", 50, 3),
                ("task.compile", False, True), ("task.cuda_graphs", False, True)]
REPO = Path(__file__).resolve().parent.parent
#: what a snapshot of the checkout leaves out: the environment, git's objects, tools' caches
SKIP = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "shared"}


@functools.cache
def tiny_container(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir

    from rankexp.cli import CONF_DIR
    from rankexp.config import resolved_container
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return resolved_container(compose("config", [*TINY, "depth=2", *overrides]))


def with_value(key: str, value) -> dict:
    node, name = key.split(".")
    c = copy.deepcopy(tiny_container())
    c[node][name] = value
    return c


@pytest.mark.parametrize(("key", "a", "b"), PLACE_VALUES, ids=[k for k, *_ in PLACE_VALUES])
def test_where_and_how_often_leave_the_config_hash(key, a, b):
    """Issue 28 row 3: two training configs that differ only in a path, a logging or
    checkpoint cadence or a compile flag have one hash; what is computed still counts."""
    assert config_hash(with_value(key, a)) == config_hash(with_value(key, b))
    assert config_hash(with_value("task.steps", 20)) != config_hash(with_value("task.steps", 21))


def test_the_legacy_hash_is_the_one_runs_logged_before_carry():
    """What main tagged the run of BEFORE's config with: the legacy hash, not today's."""
    container = tiny_container(*BEFORE[0])
    assert config_hash(container, legacy=True) == BEFORE[1] != config_hash(container)


def checkout_files() -> dict[str, int]:
    """Every file and folder of the checkout (its caches followed through a link; not .venv,
    git's objects, bytecode or the extracted archives) with its mtime, and git's index."""
    out = {}
    for top, dirs, files in os.walk(REPO, followlinks=True):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith("cifar10-jpeg-")]
        for name in dirs + files:
            p = Path(top, name)
            out[str(p.relative_to(REPO))] = p.lstat().st_mtime_ns
    index = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute",
                            "--git-path", "index"], capture_output=True, text=True).stdout.strip()
    out["<git index>"] = Path(index).stat().st_mtime_ns if index else 0
    return out


def test_finished_runs_are_skipped_after_the_data_moves_and_nothing_lands_in_the_checkout(
        tmp_path):
    """Issue 28 rows 3 and 8, one sweep of TINY at depths 2, 3, 4 with the data moved to
    ``moved/``: depth 2, FINISHED with the data at ``../shared/data``, is skipped; depth 3, a
    run main logged under its old hash, is skipped too and re-tagged with today's hash (the old
    one kept) so later lookups (sync, a contour's read-back) find it as any other; depth 4
    trains, its checkpoint in the user's cache dir ($XDG_CACHE_HOME/rankexp), and nothing is
    written in the checkout."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("rankexp", (tmp_path / "artifacts").as_uri())
    done = {h: c.create_run(exp, tags={"config_hash": h}).info.run_id
            for h in (config_hash(tiny_container()), BEFORE[1])}
    for run_id in done.values():
        c.set_terminated(run_id, "FINISHED")
    xdg = tmp_path / "xdg"
    data_cache = cache_path(DATA_CACHE)  # the tests' decoded CIFAR-10, shared through a link
    data_cache.mkdir(parents=True, exist_ok=True)
    (xdg / "rankexp").mkdir(parents=True)
    (xdg / "rankexp" / DATA_CACHE).symlink_to(data_cache)
    (tmp_path / "moved").symlink_to(REPO.parent / "shared" / "data")
    before = checkout_files()
    res = rankexp(*TINY, "data.root=moved/", "depth=2,3,4", "-m", cwd=tmp_path,
                  env=clean_env(XDG_CACHE_HOME=str(xdg)), timeout=600).check()
    assert checkout_files() == before
    assert "1 finished, 2 skipped (already FINISHED)" in res.output, res.output[-3000:]
    for run_id in done.values():
        assert f"already FINISHED as run {run_id}" in res.output, res.output[-3000:]
    tags = c.get_run(done[BEFORE[1]]).data.tags
    assert tags["config_hash"] == config_hash(tiny_container(*BEFORE[0]))
    assert tags["rankexp.legacy_hash"] == BEFORE[1]
    (trained,) = [r for r in sweep_runs(uri)[1] if r.info.run_id not in done.values()]
    assert trained.info.status == "FINISHED" and trained.data.params["depth"] == "4"
    assert (xdg / "rankexp" / "checkpoints" / f"{trained.data.tags['config_hash']}.pt").is_file()
    assert not (tmp_path / "mlruns").exists()
