"""Experiments swept as a user types them — ``rankexp experiment=<id> size=smoke -m`` — once per
test session, each into its own SQLite store with the experiments its analyses read (fig6 for
fig6_train).  The sweeps run in this process (Hydra's multirun called as the CLI is: one
interpreter for all of them; start-up is most of a smoke sweep's time).

``smoke_store`` (a session fixture, made available to every test by conftest.py) is a function
``smoke_store(experiment) -> Path``: the folder holding ``mlflow.db`` after the sweep(s).  Under
pytest-xdist the workers share one folder per experiment: the first to ask sweeps it under a
file lock, the others wait and read it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from analysis.core.registry import default
from rankexp.tasks.data import DEFAULT_CACHE_DIR, DEFAULT_ROOT


def uri_of(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


def sweep(name: str, size: str, folder: Path, *extra: str) -> None:
    """``rankexp experiment=<name> size=<size> <extra> -m`` in this process into ``folder``.

    Raises:
        AssertionError: the sweep exited with a status other than 0.
    """
    from rankexp.cli import cli

    argv = ["rankexp", f"experiment={name}", f"size={size}", *extra,
            f"tracking.uri={uri_of(folder)}",
            f"hydra.sweep.dir={folder / 'multirun' / name / str(time.monotonic_ns())}",
            f"data.root={DEFAULT_ROOT}", f"data.cache_dir={DEFAULT_CACHE_DIR}"]
    if default()[name].needs.train:
        argv.append(f"task.checkpoint_dir={folder / 'ckpt'}")
    with pytest.MonkeyPatch.context() as mp:
        for k in ("MLFLOW_TRACKING_URI", "RANKEXP_STAMP"):
            mp.delenv(k, raising=False)
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setattr(sys, "argv", [*argv, "-m"])
        umask = os.umask(0o077)  # the CLI's own (files private); this session's comes back after
        try:
            cli()
        except SystemExit as e:  # the rankexp sweeper exits with the sweep's status
            assert e.code in (0, None), f"{name} size={size}: exit {e.code}"
        finally:
            os.umask(umask)


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory):
    """``smoke_store(experiment)``: the folder of a store holding ``experiment`` (and what its
    analyses read) swept at size=smoke, made once per session."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the folder every worker of this run sees
        root = tmp_path_factory.getbasetemp().parent / "smoke"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("smoke")

    def get(name: str) -> Path:
        folder = root / name
        with FileLock(root / f"{name}.lock"):
            if not (folder / "done").exists():
                folder.mkdir(exist_ok=True)
                for exp in [*default()[name].reads, name]:
                    sweep(exp, "smoke", folder)
                (folder / "done").touch()
        return folder

    return get
