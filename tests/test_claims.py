"""One config, one run, with many writers (issue 22, row 1).

Two real processes started together on one store — two sweeps of the same four configs, a
sweep beside ``python -m rankexp.sync`` of a directory holding those configs' results, two
syncs of one directory — on SQLite and on the PostgreSQL-backed ``mlflow server``.  Before the
claim, each of them computed or logged every config (8 FINISHED runs for 4 configs); now each
config claims its hash in the store (:func:`rankexp.tracking.claim`) and every trial ends with
each config FINISHED exactly once, nothing RUNNING, and the stood-down claimants closed,
tagged and hidden.  The default run has 1 trial of two sweeps on each store; ``-m slow`` has
the issue's 10 of each race, two syncs and a sweep beside a sync too.  The claim itself (issue
28, row 4) also races bare: two processes per config that claim, then finish or stand down and
exit at once — 1,000 races on each store (``-m slow``; by default, the interleaving behind the
one config they lost, forced).
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from services import clean_env, client, finish, rankexp, start_rankexp

from rankexp import tracking

#: the configs each race writes: six, cheap; for a sweep beside a sync, jobs of about a
#: second of real compute (so that the sync arrives among the sweep's jobs, with or without
#: the idle time below)
GRIDS = {"light": ("width=8", "seeds=1", "depth=2,3,4", "alpha=1,2", "task.probes=[io_jacobian]"),
         "heavy": ("width=64", "seeds=1", "depth=300,400,500", "alpha=1,2",
                   "task.probes=[io_jacobian,profile]")}
GRID_OF = {"sweep+sweep": "light", "sweep+sync": "heavy", "sync+sync": "light"}
CONFIGS = 6
DEFAULT_TRIALS, SLOW_TRIALS = 1, 10
KINDS = ("sweep+sweep", "sweep+sync", "sync+sync")
DEFAULT_KINDS = ("sweep+sweep",)  # two syncs, a sweep beside a sync: -m slow


def start_sync(*args: str, cwd: Path) -> subprocess.Popen:
    out = open(cwd / f"sync-{time.monotonic_ns()}.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "rankexp.sync", *args], cwd=cwd, env=clean_env(),
                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    proc.log_file, proc.t0, proc.argv = out, time.perf_counter(), ["rankexp.sync", *args]
    return proc


def all_runs(uri: str, experiment: str):
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = [] if exp is None else c.search_runs([exp.experiment_id], run_view_type=ViewType.ALL,
                                                max_results=10_000)
    return [r for r in runs if r.data.tags.get("rankexp.role") != "member"]  # job runs only


def check_one_run_per_config(uri: str, experiment: str, label: str) -> Counter:
    """Every config FINISHED exactly once among the live runs, no run RUNNING (deleted ones
    included), every hidden run a stood-down or superseded one; returns the end reasons."""
    runs = [r for r in all_runs(uri, experiment) if r.data.tags.get("rankexp.role") != "sweep"]
    live = [r for r in runs if r.info.lifecycle_stage == "active"]
    finished = Counter(r.data.tags["config_hash"] for r in live if r.info.status == "FINISHED")
    assert len(finished) == CONFIGS and set(finished.values()) == {1}, (label, finished)
    assert not [r for r in runs if r.info.status == "RUNNING"], label
    hidden = [r for r in runs if r.info.lifecycle_stage == "deleted"]
    for r in hidden:
        assert r.info.status == "KILLED", (label, r.info.status)
        assert r.data.tags[tracking.TAG_REASON] in ("stood_down", "superseded"), r.data.tags
    parents = [r for r in all_runs(uri, experiment) if r.data.tags.get("rankexp.role") == "sweep"]
    assert all(p.info.status == "FINISHED" for p in parents), (label, [p.info.status for p in parents])
    return Counter(r.data.tags.get("rankexp.end_reason") for r in hidden)


@pytest.fixture(scope="module")
def offline_results(tmp_path_factory):
    """``offline_results(grid)``: a multirun directory holding the grid's results with no store
    (tracking=off), made once: what ``rankexp.sync --uri`` logs."""
    made: dict[str, Path] = {}

    def get(grid: str) -> Path:
        if grid not in made:
            cwd = tmp_path_factory.mktemp(f"offline-{grid}")
            rankexp(*GRIDS[grid], "tracking=off", "-m", cwd=cwd, env=clean_env(), timeout=300).check()
            (made[grid],) = [p for p in cwd.glob("multirun/*/*") if p.is_dir()]
            assert len(list(made[grid].glob("*/result/result.json"))) == CONFIGS
        return made[grid]

    return get


def results_for(source: Path, dest: Path, experiment: str) -> Path:
    """A copy of ``source`` whose jobs log to ``experiment`` (their run.json says so)."""
    shutil.copytree(source, dest)
    for record in dest.glob("*/run.json"):
        doc = json.loads(record.read_text())
        doc["experiment"] = experiment
        record.write_text(json.dumps(doc))
    return dest


class Race:
    """The two processes of ``kind`` on one store, started together.  Each sweep job idles
    0.5 s while it computes (``RANKEXP_FAULT_SLEEP``), so the two writers' jobs overlap more
    without costing CPU; a sync (its interpreter starts in 3 s, a sweep's in 8) is started once
    the sweep's parent run exists, so that it arrives among the sweep's jobs."""

    def __init__(self, kind: str, uri: str, experiment: str, cwd: Path, offline) -> None:
        self.kind, self.uri, self.experiment, self.cwd = kind, uri, experiment, cwd
        sweep = (*GRIDS[GRID_OF[kind]], f"tracking.uri={uri}", f"tracking.experiment={experiment}",
                 "-m")
        env = clean_env(RANKEXP_FAULT_SLEEP="0.5")
        self.sync_args = None
        if kind != "sweep+sweep":
            source = results_for(offline(GRID_OF[kind]), cwd / f"results-{experiment}", experiment)
            self.sync_args = (str(source), "--uri", uri)
        if kind == "sweep+sweep":
            self.procs = [start_rankexp(*sweep, cwd=cwd, env=env) for _ in range(2)]
        elif kind == "sweep+sync":
            self.procs = [start_rankexp(*sweep, cwd=cwd, env=env)]
        else:
            self.procs = [start_sync(*self.sync_args, cwd=cwd) for _ in range(2)]

    def step(self) -> bool:
        """Start the deferred sync when its time has come; True while something is pending."""
        if len(self.procs) == 2:
            return False
        parent = f"multirun/*/*-{self.procs[0].pid}/{tracking.PARENT_FILE}"  # the stamp ends in the pid
        if list(self.cwd.glob(parent)) or self.procs[0].poll() is not None:
            self.procs.append(start_sync(*self.sync_args, cwd=self.cwd))
        return len(self.procs) < 2

    def check(self, label: str) -> Counter:
        for res in [finish(p, timeout=300) for p in self.procs]:
            assert res.returncode == 0, res.output[-3000:]
        return check_one_run_per_config(self.uri, self.experiment, label)


def run_trials(kind: str, stores: dict[str, str], trials: int, tmp_path: Path, offline) -> None:
    """``trials`` races of ``kind``, each on every store of ``stores`` at once (two writers per
    store, all started together: the stores' races also load each other)."""
    reasons = {tag: Counter() for tag in stores}
    for trial in range(trials):
        races = {tag: Race(kind, uri, f"race-{kind.replace('+', '-')}-{trial}-{time.monotonic_ns()}",
                           tmp_path, offline) for tag, uri in stores.items()}
        deadline = time.monotonic() + 120
        while any([r.step() for r in races.values()]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for tag, r in races.items():
            reasons[tag] += r.check(f"{kind} on {tag}, trial {trial}")
    for tag in stores:
        print(f"{kind} on {tag}: {trials} trials, 0 duplicates; hidden claimants {dict(reasons[tag])}")


@pytest.mark.parametrize("kind", DEFAULT_KINDS)
def test_two_writers_log_each_config_once_on_sqlite_and_a_postgres_server(
        kind, tmp_path, offline_results, pg_mlflow_server):
    stores = {"sqlite": f"sqlite:///{tmp_path / 'mlflow.db'}", "postgres": pg_mlflow_server.uri}
    run_trials(kind, stores, DEFAULT_TRIALS, tmp_path, offline_results)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_ten_races_on_sqlite_and_a_postgres_server(kind, tmp_path, offline_results, pg_mlflow_server):
    stores = {"sqlite": f"sqlite:///{tmp_path / 'mlflow.db'}", "postgres": pg_mlflow_server.uri}
    run_trials(kind, stores, SLOW_TRIALS, tmp_path, offline_results)


@pytest.mark.slow  # ~30 s of jobs long enough to be arrived among; the claim: the race above
def test_a_second_sweep_started_after_one_job_skips_what_the_first_holds(tmp_path):
    """The issue's second case: the same sweep started again once the first has one run
    FINISHED.  The second skips what is FINISHED and what the first's live jobs hold, saying
    who holds it, and nothing is computed twice (before: 6 FINISHED runs for 4 configs)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = ("width=64", "seeds=1", "depth=500,1000,1500", "alpha=1,2", "task.probes=[io_jacobian,profile]",
             "tracking.experiment=later", "-m")  # jobs of 1–5 s: the second arrives mid-sweep
    first = start_rankexp(*sweep, cwd=tmp_path, env=clean_env())
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        if list(tmp_path.glob("multirun/*/*/mlflow_parent.json")):
            if sum(r.info.status == "FINISHED" for r in all_runs(uri, "later")) >= 1:
                break
        time.sleep(0.1)
    second = rankexp(*sweep, cwd=tmp_path, env=clean_env(), timeout=300)
    first = finish(first, timeout=300)
    assert first.returncode == 0 and second.returncode == 0, first.output[-2000:] + second.output[-2000:]
    runs = [r for r in all_runs(uri, "later") if r.data.tags.get("rankexp.role") != "sweep"]
    finished = Counter(r.data.tags["config_hash"] for r in runs
                       if r.info.status == "FINISHED" and r.info.lifecycle_stage == "active")
    assert len(finished) == 6 and set(finished.values()) == {1}, finished
    assert not [r for r in runs if r.info.status == "RUNNING"]
    assert "skipped (already FINISHED)" in second.output, second.output[-3000:]
    for line in second.output.splitlines():
        if "being computed by run" in line:  # named: the run, its sweep, its owner
            assert f"of {tmp_path}/multirun/" in line and "owner " in line, line


@pytest.mark.parametrize("rival_first", [True, False])
def test_a_claimant_waits_for_a_rival_that_has_not_stamped_yet(tmp_path, rival_first):
    """The interleaving behind two FINISHED runs of one config (seen under load): a writer's
    claim stamp, taken before its run is visible, arrived after another writer had already
    won.  Now a claim is stamped only once its run exists (:func:`rankexp.tracking.claim`), and a
    rival that exists without a stamp is waited for: whichever stamp is earlier wins, both ways."""
    import threading

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = tracking.prepare_experiment(uri, "pending")
    c = client(uri)
    own = {**tracking.owner_tags(), "config_hash": "h"}
    now_ms = time.time_ns() // 1_000_000
    me = c.create_run(exp, tags=own).info.run_id
    # created, not stamped yet; its start time says the opposite of its stamp to come, so a
    # claimant that did not wait (and ordered the rival by its start time) gets it wrong
    rival = c.create_run(exp, tags=own, start_time=now_ms + (1 if rival_first else -1) * 120_000).info.run_id

    def stamp_late():  # the rival's write lands 0.5 s later, with a stamp before or after mine
        time.sleep(0.5)
        c.set_tag(rival, tracking.TAG_CLAIM, str(now_ms - 60_000 if rival_first else now_ms + 60_000))

    writer = threading.Thread(target=stamp_late)
    writer.start()
    verdict = tracking.claim(uri, exp, "h", me, stale_after_s=600)
    writer.join()
    assert verdict.won == (not rival_first), verdict
    if rival_first:
        assert (verdict.holder, verdict.status) == (rival, "RUNNING")
    assert c.get_run(me).data.tags[tracking.TAG_CLAIM].isdigit()  # stamped by the claim


def test_the_claim_order_and_a_claim_whose_owner_is_gone(tmp_path):
    """:func:`rankexp.tracking.claim` on a real store: the earliest live claim wins whoever
    asks; a FINISHED run holds the config (unless forced); a RUNNING run whose owner is gone
    (a pid that no longer exists on this host) holds nothing — it is closed, its claim taken."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = tracking.prepare_experiment(uri, "claims")
    c = client(uri)
    own = {**tracking.owner_tags(), "config_hash": "h"}

    def run(claim_ms: int, **tags: str) -> str:
        return c.create_run(exp, tags={**own, tracking.TAG_CLAIM: str(claim_ms), **tags}).info.run_id

    a, b = run(2000), run(1000)
    for me in (a, b):
        verdict = tracking.claim(uri, exp, "h", me, stale_after_s=600)
        assert verdict.won == (me == b) and (verdict.won or verdict.holder == b), (me, verdict)
    ghost = run(10, **{tracking.TAG_PID: "999999", tracking.TAG_PID_START: "1"})
    assert tracking.claim(uri, exp, "h", b, stale_after_s=600).won  # the dead owner's claim goes
    g = c.get_run(ghost)
    assert g.info.status == "KILLED" and g.data.tags[tracking.TAG_REASON] == "owner_gone"
    tie1, tie2 = sorted([run(500), run(500)])  # same millisecond: the smaller run id wins
    assert tracking.claim(uri, exp, "h", tie2, 600).holder == tie1
    assert tracking.claim(uri, exp, "h", tie1, 600).won
    c.set_terminated(tie1, "FINISHED")
    late = run(99_999_999_999_999)
    held = tracking.claim(uri, exp, "h", late, 600)
    assert (held.won, held.holder, held.status) == (False, tie1, "FINISHED")
    assert not tracking.claim(uri, exp, "h", late, 600, finished_counts=False).won  # tie2 is live
    tracking.stand_down(uri, late, held)
    gone = c.get_run(late)
    assert (gone.info.status, gone.info.lifecycle_stage) == ("KILLED", "deleted")
    assert gone.data.tags["rankexp.stood_down_for"] == tie1


def test_a_rival_that_stands_down_while_the_winner_checks_it_loses_no_config(tmp_path, monkeypatch):
    """Issue 28 row 4, the interleaving forced: the winner's query still lists the rival
    RUNNING; the rival then stands down (closed and hidden) and its process ends, so the winner
    finds its owner gone and closes it — a request the store refuses for a hidden run.  Before,
    the refusal failed the winner and the config ended with no run (1 in 180 races on the
    server); now a rival hidden meanwhile is simply no rival, the winner holds the config."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = tracking.prepare_experiment(uri, "stood-down")
    c = client(uri)
    own = {**tracking.owner_tags(), "config_hash": "h"}
    me = c.create_run(exp, tags={**own, tracking.TAG_CLAIM: "1000"}).info.run_id
    rival = c.create_run(exp, tags={**own, tracking.TAG_CLAIM: "2000"}).info.run_id
    expired = tracking.core.expired

    def stands_down_then_ends(run, stale_after_s):
        if run.info.run_id == rival:  # between the winner's query and its check of the rival
            tracking.stand_down(uri, rival, tracking.Claim(False, me, "RUNNING"))
            run.data.tags[tracking.TAG_PID] = "999999"  # the rival's process has exited
        return expired(run, stale_after_s)

    monkeypatch.setattr(tracking.core, "expired", stands_down_then_ends)
    assert tracking.claim(uri, exp, "h", me, stale_after_s=600).won
    c.set_terminated(me, "FINISHED")
    gone = c.get_run(rival)
    assert (gone.info.status, gone.info.lifecycle_stage) == ("KILLED", "deleted")
    assert gone.data.tags[tracking.TAG_REASON] == "stood_down"  # not overwritten by the winner
    assert [r.info.run_id for r in c.search_runs([exp])] == [me]


def claimant(uri: str, exp: str, config_hash: str, go) -> None:
    """One process of a bare race: its run, its claim, then FINISHED or stood down — and the
    process ends at once, as a job's does (so its rival may find the owner gone)."""
    go.wait()
    c = tracking._client(uri)
    run = c.create_run(exp, tags={**tracking.owner_tags(), "config_hash": config_hash}).info.run_id
    held = tracking.claim(uri, exp, config_hash, run, stale_after_s=600)
    if held.won:
        c.set_terminated(run, "FINISHED")
    else:
        tracking.stand_down(uri, run, held)


def bare_races(uri: str, races: int, at_once: int = 4) -> None:
    """``races`` configs, each claimed by two fresh processes started together (``at_once``
    configs at a time); every config ends FINISHED exactly once, no process fails."""
    mp = multiprocessing.get_context("forkserver")  # children forked from a clean interpreter
    mp.set_forkserver_preload([__name__])  # with mlflow imported: a child starts in ms
    exp = tracking.prepare_experiment(uri, f"bare-{time.monotonic_ns()}")
    failed = []
    for first in range(0, races, at_once):
        go = mp.Event()
        procs = [mp.Process(target=claimant, args=(uri, exp, f"h{i}", go))
                 for i in range(first, min(races, first + at_once)) for _ in range(2)]
        for p in procs:
            p.start()
        go.set()
        for p in procs:
            p.join(120)
        failed += [p.exitcode for p in procs if p.exitcode != 0]
    runs = client(uri).search_runs([exp], run_view_type=ViewType.ALL, max_results=10_000)
    finished = Counter(r.data.tags["config_hash"] for r in runs
                       if r.info.status == "FINISHED" and r.info.lifecycle_stage == "active")
    lost, twice = races - len(finished), sum(n > 1 for n in finished.values())
    print(f"{races} bare races on {uri.split(':')[0]}: {lost} lost, {twice} duplicated, "
          f"{len(failed)} claimants failed")
    assert (lost, twice, failed) == (0, 0, []), (lost, twice, failed)
    assert not [r for r in runs if r.info.status == "RUNNING"]


@pytest.mark.slow  # the 1,000 races on each store: 2,000 processes, ~1 CPU-s each
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_thousand_bare_claim_races(store, tmp_path, request):
    uri = (request.getfixturevalue("pg_mlflow_server").uri if store == "postgres"
           else f"sqlite:///{tmp_path / 'mlflow.db'}")
    bare_races(uri, 1000)
