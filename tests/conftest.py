"""Shared fixtures: run the real CLI in a scratch directory with its own MLflow store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

from services import pg_mlflow_server, slurm_cluster  # noqa: E402, F401 — one of each per session
from smoke_stores import smoke_store  # noqa: E402, F401 — the session's smoke stores (a fixture)


@pytest.fixture
def cli(tmp_path):
    """``cli(*args, module="rankexp")`` runs ``python -m <module> args`` in ``tmp_path``.

    MLFLOW_TRACKING_URI is unset so the default store ``tmp_path/mlflow.db`` is used.
    Returns the CompletedProcess (stdout+stderr merged into ``.stdout``).
    """

    def run(*args: str, module: str = "rankexp", check: bool = True, env: dict | None = None, timeout=600):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKEXP_STAMP"))}
        e["PYTHONPATH"] = str(REPO)
        e.update(env or {})
        if "-m" in args:  # Hydra's parser wants the flag after the overrides, as users type it
            args = tuple(a for a in args if a != "-m") + ("-m",)
        p = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"`{module} {' '.join(args)}` exited {p.returncode}:\n{p.stdout[-4000:]}")
        return p

    run.cwd = tmp_path
    run.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return run


def member_history(uri: str, run_id: str, lr: float, key: str) -> list:
    """The points of ``key`` (a plain name: ``train_loss``) of training run ``run_id``'s member
    run at learning rate ``lr``, sorted by step (``[]`` when it has no such member)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_run(run_id).info.experiment_id
    found = client.search_runs([exp], filter_string=(
        f"tags.mlflow.parentRunId = '{run_id}' and tags.`rankexp.lr` = '{lr:g}'"))
    if not found:
        return []
    return sorted(client.get_metric_history(found[0].info.run_id, key), key=lambda m: m.step)


def runs_in(uri: str, experiment: str = "rankexp", members: bool = False, run_view_type: int = 1):
    """All live runs (any status; ``run_view_type=3``: deleted ones too) of ``experiment`` in
    the store at ``uri``, sweep parents included; learning-rate member runs only with ``members``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = [] if exp is None else client.search_runs([exp.experiment_id], max_results=10_000,
                                                     run_view_type=run_view_type)
    return [r for r in runs if members or r.data.tags.get("rankexp.role") != "member"]
