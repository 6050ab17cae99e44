"""Where a run came from: the git commit (and whether the tree was dirty), the command line,
MLflow's own source/user tags and the Slurm job."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .schema import TAG_DIRTY

_GIT: dict[str, str] = {}


def _git_state(repo: Path | None = None) -> dict[str, str]:
    """``{"sha": HEAD or "", "dirty": "true"/"false"/""}`` of the repository holding rankexp
    (asked once per process: two ``git`` calls)."""
    if not _GIT:
        repo = repo or Path(__file__).resolve().parents[2]
        _GIT.update(sha="", dirty="")
        try:
            sha = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            if sha:
                _GIT.update(sha=sha, dirty="true" if dirty else "false")
        except (OSError, subprocess.SubprocessError):
            pass
    return _GIT


def git_commit(repo: Path | None = None) -> str:
    """``HEAD`` of the repository holding rankexp (``+dirty`` if modified), or ``unknown``."""
    g = _git_state(repo)
    return (g["sha"] + ("+dirty" if g["dirty"] == "true" else "")) if g["sha"] else "unknown"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as the user typed it: ``rankexp …`` (the console script) or
    ``python -m rankexp …``."""
    argv = list(sys.argv if argv is None else argv)
    prog = "rankexp" if Path(argv[0]).name == "rankexp" else "python -m rankexp"
    return " ".join([prog, *(shlex.quote(a) for a in argv[1:])])


def system_tags() -> dict[str, str]:
    """MLflow's own tags, which its UI shows as Source, Created by and the commit
    (``mlflow.source.name``, ``mlflow.source.type``, ``mlflow.user``,
    ``mlflow.source.git.commit``), plus ``rankexp.git_dirty`` (``true`` when the working
    tree differed from that commit).  A Slurm job is ``JOB``, anything else ``LOCAL``."""
    import getpass

    g = _git_state()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    tags = {"mlflow.source.name": "rankexp",
            "mlflow.source.type": "JOB" if slurm_job_id() else "LOCAL", "mlflow.user": user}
    if g["sha"]:
        tags.update({"mlflow.source.git.commit": g["sha"], TAG_DIRTY: g["dirty"]})
    return tags


def slurm_job_id() -> str | None:
    """This process's Slurm job as ``sacct`` names it (``A_T`` for an array task), or None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")
