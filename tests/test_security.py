"""Secure by default (issue 8, row 9 and item 5): ``launchers/mlflow-server.sh`` binds loopback
unless told otherwise; any other address needs ``--auth`` (MLflow's basic-auth app, a
generated password in a mode-600 file, never on a command line) or ``--insecure``.  Secrets
never leave the environment (issue 28, row 1): a store's password and a ``${oc.env:…}`` note are
in no file, run, log line or submission script a sweep writes."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
from services import MlflowServer, clean_env, rankexp, sweep_runs


def create_experiment(url: str, name: str, auth: tuple[str, str] | None = None) -> int:
    """HTTP status of a REST ``experiments/create`` (anonymous unless ``auth``)."""
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/create", method="POST",
                                 data=json.dumps({"name": name}).encode(),
                                 headers={"Content-Type": "application/json"})
    if auth:
        req.add_header("Authorization", "Basic " + b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_other_hosts_are_refused_without_auth_or_insecure():
    server = MlflowServer("sqlite", workers=1)
    try:
        p = server._run("start", "--host", "0.0.0.0", "--port", str(server.port), timeout=60)
        assert p.returncode != 0 and p.stdout == ""
        assert "--auth" in p.stderr and "--insecure" in p.stderr, p.stderr
        assert not (server.dir / "server.pid").exists()
        listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
        assert f":{server.port} " not in listening
    finally:
        server.stop()


def test_auth_server_refuses_anonymous_writes_and_takes_the_generated_password(tmp_path):
    server = MlflowServer("sqlite", workers=1)
    try:
        p = server._run("start", "--auth", "--port", str(server.port), timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        lines = p.stdout.strip().splitlines()
        assert lines[:2] == [f"export MLFLOW_TRACKING_URI={server.uri}",
                             "export MLFLOW_TRACKING_USERNAME=admin"], lines
        secret = server.dir / "auth" / "admin-password"
        assert lines[2] == f"export MLFLOW_TRACKING_PASSWORD=\"$(cat '{secret}')\""
        password = secret.read_text().strip()
        assert len(password) >= 24 and password not in p.stdout + p.stderr
        for f in ("admin-password", "secret-key", "basic_auth.ini"):
            assert stat.S_IMODE((server.dir / "auth" / f).stat().st_mode) == 0o600, f
        assert stat.S_IMODE((server.dir / "auth").stat().st_mode) == 0o700

        assert create_experiment(server.uri, "anonymous") == 401
        assert create_experiment(server.uri, "admin", ("admin", "wrong")) == 401
        assert create_experiment(server.uri, "admin", ("admin", password)) == 200
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):  # no secret in anyone's argv
            try:
                text = cmdline.read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert password not in text and "secret-key" not in text, cmdline

        # rankexp logs through it with the credentials the eval'ed lines export
        env = clean_env(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=password)
        rankexp("depth=2", "width=8", "seeds=1", f"tracking.uri={server.uri}", cwd=tmp_path,
                env=env, timeout=300).check()
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = "admin", password
        try:
            (run,) = sweep_runs(server.uri)[1]
        finally:
            del os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
        assert run.info.status == "FINISHED"
        assert not re.search(password, server.server_log())
    finally:
        server.stop()


def leaks(secret: str, root: Path, server: MlflowServer | None = None) -> list[str]:
    """Where ``secret`` is written: files under ``root`` and rows of ``server``'s database."""
    found = [str(f.relative_to(root)) for f in sorted(root.rglob("*"))
             if f.is_file() and secret.encode() in f.read_bytes()]
    tables = server.sql("SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = 'public'") if server else []
    for (table,) in tables:
        rows = server.sql(f'SELECT t::text FROM "{table}" t')
        found += [f"{table}: {row[:200]}" for (row,) in rows if secret in row]
    return found


def secret_sweep(server: MlflowServer, *args: str, cwd: Path, env: dict[str, str]):
    """A one-job sweep into ``server``'s database by a URI with its password on the command
    line and a note from the environment; ``(password, note, the store's runs, output)``."""
    import mlflow

    password = (server.dir / "pgpass").read_text().strip().rsplit(":", 1)[1]
    uri = f"postgresql://mlflow:{password}@127.0.0.1:{server.pg_port}/mlflow"
    note, experiment = f"note-{secrets.token_hex(8)}", f"secrets-{secrets.token_hex(4)}"
    p = rankexp("depth=2", "width=8", "seeds=1", f"tracking.uri={uri}", *args,
                f"tracking.experiment={experiment}", "tracking.note=${oc.env:SECRET_NOTE}", "-m",
                cwd=cwd, env={**env, "SECRET_NOTE": note}, timeout=300).check()
    client = mlflow.MlflowClient(uri)
    return password, note, client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id]), p.output


def assert_kept_secret(password: str, note: str, runs, output: str, root: Path,
                       server: MlflowServer) -> None:
    """The sweep worked, and neither secret is in ``root``, the database or the console."""
    found = {s: leaks(s, root, server) + (["console"] if s in output else [])
             for s in (password, note)}
    assert found == {password: [], note: []}
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 2  # the job and its sweep
    notes = {r.data.tags["mlflow.note.content"].split("\n")[0] for r in runs}
    assert notes == {"${oc.env:SECRET_NOTE}"}  # as typed: the secret stays in the environment


def test_a_store_password_and_a_secret_note_are_written_nowhere(tmp_path, pg_mlflow_server):
    """Issue 28 row 1: a local sweep writes neither secret in its output tree (``multirun.yaml``,
    ``run.json``, ``status.json``, ``mlflow_parent.json``, logs), its artifacts (``config.yaml``,
    in ``./mlruns`` for a database URI), any table of the store, or the console."""
    *kept, output = secret_sweep(pg_mlflow_server, cwd=tmp_path, env=clean_env())
    assert_kept_secret(*kept, output, tmp_path, pg_mlflow_server)
    assert "postgresql://mlflow:***@127.0.0.1" in output


@pytest.mark.slow  # a Slurm sweep: ~1 min
def test_a_slurm_sweep_keeps_the_secrets_in_the_environment(tmp_path, pg_mlflow_server,
                                                            slurm_cluster):
    """The same through Slurm: the job reads the password from its environment, never from a
    written file — no submission script, submitit pickle or job log holds either secret."""
    *kept, output = secret_sweep(pg_mlflow_server, "hydra/launcher=slurm",
                                 "hydra.launcher.mem_gb=2", cwd=tmp_path, env=slurm_cluster.env())
    assert_kept_secret(*kept, output, tmp_path, pg_mlflow_server)
    assert list(tmp_path.glob("multirun/*/*/.submitit/*/*_submission.sh"))
