"""Every run ends, whatever the store says (issue 22, rows 2, 3, 7, 8).

A store that answers with a refusal is not an outage: a read-only artifact root (a read-only
tmpfs mounted over it), a full disk (a small tmpfs filled to the last byte), a name MLflow
refuses.  Each job keeps its result in its job directory and ends its run FAILED with
``rankexp.end_reason=store_error`` and the real reason; the parent closes after its
children; nothing is left RUNNING or half-written, and ``rankexp.sync`` logs the results once
the store accepts them.  A PostgreSQL store on a closed port is refused in seconds (its
password masked), and the parent of a ``kill -9``'ed sweep counts every job of its plan.

The tmpfs tests need to mount (root): elsewhere they skip, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import member_history
from mlflow.entities import ViewType
from services import (
    clean_env,
    client,
    finish,
    free_ports,
    rankexp,
    start_rankexp,
    sweep_runs,
)

from rankexp import tracking
from rankexp.tasks.data import ARCHIVE_NAME, DEFAULT_CACHE_DIR, DEFAULT_ROOT

SMALL = ("width=8", "seeds=1", "task.probes=[io_jacobian]")


#: the full- and read-only-disk tests mount a tmpfs: root only (``make test`` runs as root)
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str):
    """A tmpfs of ``size`` mounted at ``path`` (created) while inside (the tests using it are
    marked :data:`NEEDS_ROOT`; as root, a mount that fails is this test's failure)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True,
                       text=True)
    assert p.returncode == 0, f"cannot mount a tmpfs at {path}: {p.stderr.strip() or p.returncode}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk: Path) -> None:
    """Write a ballast file until the disk holding ``disk`` is full."""
    with open(disk / "ballast", "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()


def all_runs(uri: str, experiment: str = "rankexp"):
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = [] if exp is None else c.search_runs([exp.experiment_id], run_view_type=ViewType.ALL,
                                                max_results=10_000)
    return [r for r in runs if r.data.tags.get("rankexp.role") != "member"]  # job runs only


def sync(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankexp.sync", *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=300)


def half_written(root: Path) -> list[Path]:
    """Temporary job files a failed write left behind (``.status.json.<pid>`` …)."""
    return [p for p in root.rglob(".*") if p.is_file() and p.name.split(".")[-1].isdigit()]


def assert_refused_then_synced(tmp_path: Path, res, why: str) -> Path:
    """The sweep after a refusal, then ``rankexp.sync`` once the store accepts writes again."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert res.returncode == 1, res.output[-3000:]
    assert "--- Logging error ---" not in res.output and "Traceback" not in res.output, res.output[-3000:]
    assert "stopped answering" not in res.output, res.output[-3000:]
    (parent,), jobs = sweep_runs(uri)
    assert jobs and all(r.info.status == "FAILED" for r in jobs), [r.info.status for r in jobs]
    for r in jobs:
        assert r.data.tags[tracking.TAG_REASON] == "store_error", r.data.tags
        assert why in r.data.tags["error"], r.data.tags["error"]
        assert r.data.params["depth"] in ("2", "3")  # every ended run carries its config
    assert parent.info.status == "FAILED" and parent.info.end_time >= max(r.info.end_time for r in jobs)
    (sweep,) = [p for p in tmp_path.glob("multirun/*/*") if p.is_dir()]
    for d in sorted(sweep.glob("[0-9]*")):
        status = json.loads((d / "status.json").read_text())
        assert (status["status"], status["reason"]) == ("FAILED", "store_error"), status
        assert json.loads((d / "result" / "result.json").read_text())["scalars"]["erank_io"] > 0
    assert not half_written(sweep)
    return sweep


@NEEDS_ROOT
def test_a_read_only_artifact_root_fails_each_run_with_the_reason(tmp_path):
    """Before: the runs stayed RUNNING under a parent closed FAILED, the message said the store
    "stopped answering".  Now each run is FAILED store_error naming the read-only file system,
    and the sync after the remount logs every config once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_experiment(uri, "rankexp")  # the artifact root exists: mount over it
    root = tmp_path / "mlartifacts" / "rankexp"
    with tmpfs(root, "1m", "ro"):
        res = rankexp(*SMALL, "depth=2,3", "-m", cwd=tmp_path, env=clean_env(), timeout=300)
        sweep = assert_refused_then_synced(tmp_path, res, "Read-only file system")
    out = sync(str(sweep), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = all_runs(uri)
    finished = [r for r in runs if r.info.status == "FINISHED" and r.info.lifecycle_stage == "active"
                and r.data.tags.get("rankexp.role") != "sweep"]
    assert len(finished) == 2 and len({r.data.tags["config_hash"] for r in finished}) == 2
    assert not [r for r in runs if r.info.status == "RUNNING"]


@NEEDS_ROOT
def test_a_job_directory_on_a_full_disk_fails_cleanly(tmp_path):
    """Before: "--- Logging error ---" tracebacks and 0-byte ``.status.json.<pid>`` files.  Now a
    job that cannot write its directory fails in one line and leaves no half-written file; its
    run, if it had one, is closed."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with tmpfs(tmp_path / "jobs", "2m") as disk:
        proc = start_rankexp(*SMALL, "depth=2,3,4", f"tracking.uri={uri}", f"hydra.sweep.dir={disk}/sweep",
                             "-m", cwd=tmp_path, env=clean_env(RANKEXP_FAULT_SLEEP="1"))
        deadline = time.monotonic() + 120
        while not (disk / "sweep" / tracking.PARENT_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        fill(disk)
        res = finish(proc, timeout=300)
        assert res.returncode == 1, res.output[-3000:]
        assert "--- Logging error ---" not in res.output, res.output[-3000:]
        assert "No space left on device" in res.output, res.output[-3000:]
        assert not half_written(disk), half_written(disk)
    runs = all_runs(uri)
    assert runs and not [r for r in runs if r.info.status == "RUNNING"], [r.info.status for r in runs]


@pytest.mark.skipif(not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}")
def test_a_learning_rate_whose_name_mlflow_refuses_is_logged_under_the_sanitised_key(tmp_path):
    """Row 3: ``lr=1e6`` made the key ``train_loss_lr1e+06``, which MLflow refuses: the job
    failed, its run stayed RUNNING without params, and sync crashed.  Keys are now sanitised
    in one place (:func:`rankexp.tracking.metric_key`), the same for the live run, the journal
    and sync."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = rankexp("task=train", "lr=1e6", "width=8", "depth=2", "task.steps=4", "task.eval_every=2",
                  "task.log_every=2", f"task.checkpoint_dir={tmp_path / 'ckpt'}",
                  f"data.cache_dir={DEFAULT_CACHE_DIR}", cwd=tmp_path, env=clean_env(), timeout=600)
    assert res.returncode == 0, res.output[-3000:]
    (run,) = all_runs(uri)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "1000000.0"
    key = tracking.metric_key("final_train_loss_lr1e+06")
    assert key == "final_train_loss_lr1e06" and key in run.data.metrics, sorted(run.data.metrics)
    # the series is the member run's (plain name); the analysis finds it under the sane key
    hist = member_history(uri, run.info.run_id, 1e6, "train_loss")
    assert [m.step for m in hist] == [2, 4]
    from analysis.core.runs import cached_series

    steps, _ = cached_series(uri, run.info.run_id, tracking.metric_key("train_loss_lr1e+06"))
    assert steps.tolist() == [2, 4]
    (job,) = [p.parent for p in tmp_path.glob("outputs/**/run.json")]
    out = sync(str(job), cwd=tmp_path)
    assert out.returncode == 0 and "1 already in the store" in out.stderr + out.stdout


def test_sync_of_a_job_the_store_refuses_says_so_in_a_line_and_closes_its_run(tmp_path):
    """A job directory whose run the store refuses (a param name MLflow rejects): sync logs the
    others, says why in one line (no traceback), ends the run it began FAILED store_error, and
    exits 1."""
    res = rankexp(*SMALL, "depth=2,3", "tracking=off", "-m", cwd=tmp_path, env=clean_env(), timeout=300)
    assert res.returncode == 0, res.output[-2000:]
    (sweep,) = [p for p in tmp_path.glob("multirun/*/*") if p.is_dir()]
    record = sweep / "0" / "run.json"
    doc = json.loads(record.read_text())
    doc["params"]["bad name+"] = 1
    record.write_text(json.dumps(doc))
    uri = f"sqlite:///{tmp_path / 'synced.db'}"
    out = sync(str(sweep), "--uri", uri, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert "failed a request: " in text and "bad name+" in text, text[-3000:]
    runs = all_runs(uri)
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"], [r.info.status for r in runs]
    (bad,) = [r for r in runs if r.info.status == "FAILED"]
    assert bad.data.tags[tracking.TAG_REASON] == "store_error"


def test_an_unreachable_postgres_uri_is_refused_in_seconds(tmp_path):
    """Before: the message came after 110 s of MLflow's engine retries (ten attempts, doubling
    sleeps).  Now the attempts are bounded like HTTP's, the password is not printed."""
    port = free_ports(1)
    uri = f"postgresql://mlflow:s3cret@127.0.0.1:{port}/mlflow"
    res = rankexp(*SMALL, "depth=2", f"tracking.uri={uri}", cwd=tmp_path, env=clean_env(), timeout=300)
    assert res.returncode == 2, res.output[-3000:]
    assert "does not answer" in res.output and "s3cret" not in res.output, res.output[-3000:]
    assert res.seconds < 40, res.seconds
    assert not list(tmp_path.glob("outputs/**/run.json"))


@pytest.mark.slow  # ~30 s; a SIGKILLed sweep reconciled by the next command: test_resume
def test_a_kill_9_sweep_is_counted_over_its_whole_plan(tmp_path):
    """Row 8: a sweep of 8 jobs SIGKILLed (whole process group) after two finished; the rerun
    closes its parent with counts over all 8 jobs of its plan (before: jobs_total=3,
    jobs_not_run=0 — jobs without a status.json were not counted)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = (*SMALL, "depth=2,3,4,5", "alpha=1,2", "-m")
    proc = start_rankexp(*sweep, cwd=tmp_path, env=clean_env(RANKEXP_FAULT_SLEEP="1"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if list(tmp_path.glob(f"multirun/*/*/{tracking.PARENT_FILE}")):
            if sum(r.info.status == "FINISHED" for r in sweep_runs(uri)[1]) >= 2:
                break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    killed = finish(proc, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    (old,), _ = sweep_runs(uri)
    rankexp(*sweep, cwd=tmp_path, env=clean_env(), timeout=300).check()
    parents, _ = sweep_runs(uri)
    old = next(p for p in parents if p.info.run_id == old.info.run_id)
    m = old.data.metrics
    assert old.info.status == "KILLED" and m["jobs_total"] == 8, m
    assert m["jobs_finished"] >= 2 and m["jobs_not_run"] >= 4, m
    assert sum(m[f"jobs_{k}"] for k in tracking.JOB_STATES) == 8, m


def test_a_server_answering_503_is_named_unavailable_with_its_cause(monkeypatch):
    """Issue 28 row 9: a PostgreSQL-backed server whose database is down answers 503 to every
    request.  Before, the message was urllib3's six layers — ``… failed with exception
    HTTPConnectionPool(…): Max retries exceeded with url: … (Caused by ResponseError('too many
    503 error responses'))`` — the cause last, where a 300-character cut loses it — and sync
    called it "refused a request".  Now: the server is unavailable, HTTP 503, its database down, once."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Unavailable(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's name
            self.send_error(503)
        do_POST = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT",
                "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "PGCONNECT_TIMEOUT"):
        monkeypatch.setenv(key, "")
    tracking.configure_http(1, 5, 0)
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(tracking.TrackingError) as refused:
            tracking.check_store(uri)
        with pytest.raises(Exception) as lost:
            client(uri).set_tag("0" * 32, "key", "value")
    finally:
        server.shutdown()
    gist = tracking._first_line(lost.value)
    assert gist == ("server unavailable: HTTP 503 Service Unavailable on every try; its database "
                    "does not answer"), gist
    message = str(refused.value)
    assert gist in message and "\n" not in message, message
    assert not any(w in message for w in ("Caused by", "Max retries", "HTTPConnectionPool")), message


def test_every_failed_run_says_why(tmp_path):
    """Issue 28 row 9: FAILED runs without ``rankexp.end_reason`` — a job run whose closing
    request carried a param the store refuses (its end tags were dropped with it), and a
    sweep's parent that ``rankexp.sync`` closed FAILED.  Now each says why."""
    from rankexp.sync import Syncer
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = tracking.prepare_experiment(uri, "why")
    job_run = tracking.RunLogger(uri, exp, "job", {"bad name+": 1}, {"config_hash": "h"})
    job_run.start()
    assert job_run.end("FAILED", "exception", "ValueError: boom")
    gone = {**tracking.owner_tags(), tracking.TAG_PID: "999999", "rankexp.role": "sweep"}
    parent = client(uri).create_run(exp, tags=gone).info.run_id
    sweep, job = tmp_path / "sweep", tmp_path / "sweep" / "0"
    job.mkdir(parents=True)
    tracking.write_json(sweep / tracking.PARENT_FILE, {"uri": uri, "experiment": "why", "run_id": parent,
                                                       "experiment_id": exp, "sweep_id": str(sweep)})
    tracking.write_json(sweep / tracking.NAMES_FILE, {"names": ["job"], "job_dirs": [str(job)]})
    tracking.write_status(job, "FAILED", run_id=job_run.run_id, config_hash="h")
    assert Syncer().close_parent(sweep) == "FAILED"
    for run_id, why in ((job_run.run_id, "exception"), (parent, "jobs_failed")):
        run = client(uri).get_run(run_id)
        assert (run.info.status, run.data.tags.get(tracking.TAG_REASON)) == ("FAILED", why), run.data.tags
    assert client(uri).get_run(parent).data.tags["error"].startswith("0 finished, 0 skipped")
