"""Real services for the end-to-end tests (issue 5): a Slurm cluster, an `mlflow server`
on PostgreSQL, the MLflow UI and a headless Chromium, each started by the tests themselves
through the project's own scripts (``launchers/``) and stopped at the end.

Fixtures are session-scoped and import-on-use: a test module that needs one writes
``from services import slurm_cluster`` (each service is used by one module only, so each
starts once per session).  State dirs are fresh ``/tmp/rankexp-test-*`` directories (mode
0755: munge, mysql and postgres must be able to enter them, which pytest's 0700
``tmp_path`` does not allow); they are purged at teardown unless ``RANKEXP_TEST_KEEP=1``.
``.ci/run`` also purges any that a killed test run left behind.

Nothing here skips: a service that cannot start fails the test with its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAUNCHERS = REPO / "launchers"
VENV_BIN = Path(sys.executable).parent
KEEP = os.environ.get("RANKEXP_TEST_KEEP") == "1"
SERVICE_PREFIX = "rankexp-test-"  # .ci/run purges /tmp/rankexp-test-{slurm,mlflow}-* on exit


# --------------------------------------------------------------------------- helpers
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1) -> int:
    """First of ``count`` consecutive free TCP ports, below the kernel's ephemeral range."""
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20000, 32000 - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def service_dir(kind: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=f"{SERVICE_PREFIX}{kind}-", dir="/tmp"))
    d.chmod(0o755)
    return d


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a rankexp command: no inherited tracking URI, Slurm job, fault
    injection or launch stamp; the repository on PYTHONPATH; one BLAS/torch thread per job."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "RANKEXP_", "SLURM_", "SBATCH_", "SUBMITIT_"))
    }
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra)
    return env


def tail(path: Path, n: int = 3000) -> str:
    try:
        return f"--- {path} ---\n{path.read_text(errors='replace')[-n:]}"
    except OSError as e:
        return f"--- {path}: {e}"


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float
    args: list[str] = field(default_factory=list)

    def check(self) -> Result:
        assert self.returncode == 0, (
            f"`{' '.join(self.args)}` exited {self.returncode} after {self.seconds:.0f} s:\n"
            f"{self.output[-5000:]}"
        )
        return self


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def start_rankexp(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """``python -m rankexp ARGS`` in its own process group (so a test can interrupt it whole)."""
    if "-m" in args:  # Hydra's parser wants the flag after the overrides
        args = tuple(a for a in args if a != "-m") + ("-m",)
    out = open(Path(cwd) / f"rankexp-{time.monotonic_ns()}.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankexp", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    proc.log_file = out  # type: ignore[attr-defined]
    proc.t0 = time.perf_counter()  # type: ignore[attr-defined]
    proc.argv = ["rankexp", *args]  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen, timeout: float) -> Result:
    """Wait for a :func:`start_rankexp` process; past ``timeout`` kill its group and fail."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        proc.log_file.seek(0)
        pytest.fail(
            f"`{' '.join(proc.argv)}` hung: still running after {timeout:.0f} s, killed.\n"
            f"{proc.log_file.read()[-5000:]}"
        )
    finally:
        _kill_group(proc)  # nothing of it may outlive the test (loky workers, srun, ...)
    seconds = time.perf_counter() - proc.t0
    proc.log_file.seek(0)
    output = proc.log_file.read()
    proc.log_file.close()
    return Result(proc.returncode, output, seconds, proc.argv)


def rankexp(*args: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> Result:
    return finish(start_rankexp(*args, cwd=cwd, env=env), timeout)


def _script(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


def http_ok(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` run as another, unprivileged user of this machine (``nobody``)."""
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd],
                          cwd="/", capture_output=True, text=True, timeout=60)


def not_private(root: Path) -> dict[str, str]:
    """``{path: mode}`` of what under ``root`` its group or other users may use."""
    return {str(p): oct(p.lstat().st_mode & 0o777) for p in root.rglob("*")
            if p.lstat().st_mode & 0o077 and not p.is_symlink() and not p.is_socket()}


# --------------------------------------------------------------------------- MLflow reading
def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def sweep_runs(uri: str, experiment: str = "rankexp"):
    """``(parents, jobs)``: the runs of ``experiment``, sweep parents apart from job runs."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = [] if exp is None else c.search_runs([exp.experiment_id], max_results=10_000)
    parents = [r for r in runs if r.data.tags.get("rankexp.role") == "sweep"]
    jobs = [r for r in runs if r.data.tags.get("rankexp.role") not in ("sweep", "member")]
    return parents, jobs


def job_result(run) -> dict:
    """The ``result.json`` the job wrote into its Hydra job dir before logging to MLflow."""
    return json.loads((Path(run.data.tags["job_dir"]) / "result" / "result.json").read_text())


# --------------------------------------------------------------------------- Slurm
class SlurmCluster:
    """launchers/slurm-cluster.sh on a private state dir and private ports."""

    def __init__(self) -> None:
        self.dir = service_dir("slurm")
        self.port = free_ports(4)
        self.script_env = {
            **os.environ,
            "RANKEXP_SLURM_DIR": str(self.dir),
            "RANKEXP_SLURM_PORT": str(self.port),
        }
        self.conf = self.dir / "etc" / "slurm.conf"
        self.start_seconds = float("nan")

    def _run(self, verb: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return _script([str(LAUNCHERS / "slurm-cluster.sh"), verb], self.script_env, timeout)

    def logs(self) -> str:
        return "\n".join(tail(p, 1500) for p in sorted((self.dir / "log").glob("*.log")))

    def start(self) -> None:
        t0 = time.perf_counter()
        p = self._run("start")  # installs the Debian packages when missing (root), then waits
        self.start_seconds = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(
                f"launchers/slurm-cluster.sh start failed ({p.returncode}):\n{p.stderr[-3000:]}\n"
                f"{self.logs()}{tail(self.dir / 'apt.log')}"
            )

    def stop(self) -> None:
        self._run("stop" if KEEP else "purge", timeout=120)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a sweep on this cluster (SLURM_CONF for submitit's sbatch/sacct)."""
        return clean_env(SLURM_CONF=str(self.conf), **extra)

    def sacct(self, job: str) -> dict[str, str]:
        """``{JobID: State}`` of the allocations of ``job`` (an array: ``A_0``, ``A_1``…)."""
        p = subprocess.run(
            ["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert p.returncode == 0, p.stderr
        return dict(line.split("|", 1) for line in p.stdout.splitlines() if line.strip())

    def wait_sacct(self, job: str, done: set[str], timeout: float = 60) -> dict[str, str]:
        """sacct's view of ``job`` once every allocation reached a state in ``done``
        (slurmdbd learns of a job's end a few seconds after the job wrote its result)."""
        end = time.monotonic() + timeout
        while True:
            states = self.sacct(job)
            if states and all(s.split()[0] in done for s in states.values()):
                return states
            if time.monotonic() > end:
                return states
            time.sleep(1)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running single-node Slurm cluster with accounting (slurmdbd + MariaDB)."""
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# --------------------------------------------------------------------------- MLflow server
class MlflowServer:
    """launchers/mlflow-server.sh (PostgreSQL or SQLite backend) on private ports/state."""

    def __init__(self, backend: str = "postgres", workers: int = 4) -> None:
        self.backend, self.workers = backend, workers
        self.dir = service_dir("mlflow")
        self.port = free_ports(1)
        self.pg_port = free_ports(1)
        while self.pg_port == self.port:
            self.pg_port = free_ports(1)
        self.script_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
            "RANKEXP_MLFLOW_DIR": str(self.dir),
            "RANKEXP_PG_PORT": str(self.pg_port),
            "MLFLOW": str(VENV_BIN / "mlflow"),
        }
        self.uri = f"http://127.0.0.1:{self.port}"
        self.start_seconds = float("nan")

    def _run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return _script([str(LAUNCHERS / "mlflow-server.sh"), *args], self.script_env, timeout)

    def start(self) -> None:
        t0 = time.perf_counter()
        p = self._run(
            "start", "--backend", self.backend, "--port", str(self.port),
            "--workers", str(self.workers),
        )  # fmt: skip
        self.start_seconds = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(
                f"launchers/mlflow-server.sh start failed ({p.returncode}):\n{p.stderr[-3000:]}\n"
                f"{tail(self.dir / 'server.log')}\n{tail(self.dir / 'postgres' / 'postgres.log')}"
            )
        assert p.stdout.strip() == f"export MLFLOW_TRACKING_URI={self.uri}", p.stdout

    def stop(self, keep: bool = KEEP) -> None:
        """Stop the server (and PostgreSQL); its state is deleted unless ``keep``."""
        p = self._run("stop" if keep else "purge", timeout=120)
        assert p.returncode == 0, p.stderr

    def server_log(self) -> str:
        return (self.dir / "server.log").read_text(errors="replace")

    def sql(self, query: str, *params) -> list[tuple]:
        """Run ``query`` on the PostgreSQL backend directly (as the server's role)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.pg_port, user="mlflow", dbname="mlflow",
            passfile=str(self.dir / "pgpass"), connect_timeout=10,
        ) as conn:  # fmt: skip
            return conn.execute(query, params).fetchall()


@pytest.fixture(scope="session")
def pg_mlflow_server():
    """`mlflow server` on loopback, backed by a private PostgreSQL 15 cluster."""
    server = MlflowServer("postgres")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def mlflow_ui(store_uri: str, log: Path, timeout: float = 180):
    """``mlflow ui --backend-store-uri STORE`` (the README's `make ui`) on a free loopback
    port; yields its base URL once /health answers; SIGTERM to its group at the end."""
    port = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "mlflow"), "ui", "--backend-store-uri", store_uri,
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + timeout
        while not http_ok(url + "/health"):
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow ui exited {proc.returncode}\n{tail(log)}")
            if time.monotonic() > end:
                raise RuntimeError(f"mlflow ui: no /health after {timeout} s\n{tail(log)}")
            time.sleep(0.3)
        yield url
    finally:
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------- browser
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
]


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium driven by Selenium through Debian's chromedriver."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(f"{missing} missing: apt-get install chromium chromium-driver (.ci/run does)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed in this venv: pip install selenium (.ci/run does)")
    profile = Path(tempfile.mkdtemp(prefix=f"{SERVICE_PREFIX}chromium-"))
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
