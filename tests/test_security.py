"""Secure by default (issue 8, row 9 and item 5): ``launchers/mlflow-server.sh`` binds loopback
unless told otherwise; any other address needs ``--auth`` (MLflow's basic-auth app, a
generated password in a mode-600 file, never on a command line) or ``--insecure``."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

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
