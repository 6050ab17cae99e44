"""Secure by default (issue 8, row 9 and item 5): ``launchers/mlflow-server.sh`` binds loopback
unless told otherwise; any other address gets ``--auth`` (MLflow's basic-auth app, a generated
password in a mode-600 file, never on a command line) unless ``--insecure``. Secrets never
leave the environment (issue 28, row 1): a store's password and a ``${oc.env:…}`` note are in
no file, run, log line or submission script a sweep writes. A store only its owner can read
(issue 28 row 2): the server's state, a local sweep's store and output tree are 0700/0600,
tried as a second, unprivileged user."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
from services import (
    MlflowServer,
    as_nobody,
    clean_env,
    not_private,
    rankexp,
    service_dir,
    sweep_runs,
)


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


def test_other_hosts_are_refused_without_auth_or_insecure(tmp_path):
    """Off loopback --auth is the default; where it cannot be had, the server is refused."""
    server = MlflowServer("sqlite", workers=1)
    (tmp_path / "python").symlink_to("/usr/bin/python3")  # an mlflow without Flask-WTF
    (tmp_path / "mlflow").write_text("#!/bin/sh\n")
    (tmp_path / "mlflow").chmod(0o755)
    server.script_env["MLFLOW"] = str(tmp_path / "mlflow")
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
    """Served to the network (--host 0.0.0.0, no --auth given): password-protected, and its
    state — database, artifacts, log, secrets — out of other local users' reach."""
    server = MlflowServer("sqlite", workers=1)
    try:
        p = server._run("start", "--host", "0.0.0.0", "--port", str(server.port), timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        lines = p.stdout.strip().splitlines()
        assert re.fullmatch(rf"export MLFLOW_TRACKING_URI=http://\S+:{server.port}", lines[0])
        assert lines[1] == "export MLFLOW_TRACKING_USERNAME=admin", lines
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

        # another user of this machine: no way in, not even to the names; nothing group/other
        db, artifacts = server.dir / "sqlite" / "mlflow.db", server.dir / "artifacts"
        assert (server.dir / "auth" / "basic_auth.db").is_file() and any(artifacts.rglob("*.npz"))
        assert stat.S_IMODE(server.dir.stat().st_mode) == 0o700
        assert not_private(server.dir) == {}
        assert as_nobody("ls", str(artifacts)).returncode != 0
        assert as_nobody("sqlite3", f"file:{db}?immutable=1", "SELECT value FROM metrics"
                         ).returncode != 0
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


def test_a_local_sweep_leaves_nothing_another_user_can_read():
    """Issue 28 row 2: the default SQLite store, its artifacts and the sweep's job directories
    are 0600/0700 in a folder other users can enter (the launch dir), whatever the umask."""
    launch = service_dir("perms")  # 0755 under /tmp, unlike pytest's 0700 tmp_path
    try:
        rankexp("depth=2", "width=8", "seeds=1", "-m", cwd=launch, env=clean_env(),
                timeout=300).check()
        made = {p.name for p in launch.rglob("*")}
        assert {"mlflow.db", "run.json", "result.json", "config.yaml", "arrays.npz"} <= made, made
        log = launch.glob("rankexp-*.log")  # the test's own record of the command's output
        seen = as_nobody("find", str(launch), "-mindepth", "1", "-readable").stdout.split()
        assert set(seen) == set(not_private(launch)) == {str(p) for p in log}
        db = launch / "mlflow.db"
        assert as_nobody("sqlite3", f"file:{db}?immutable=1", "SELECT value FROM metrics"
                         ).returncode != 0
    finally:
        shutil.rmtree(launch)
