"""Where inputs and caches live, wherever a job was launched from."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = str(REPO_ROOT / "conf")  # the Hydra config tree: conf/config.yaml and its groups


def resolve_path(path: str) -> Path:
    """An input path: relative ones from the launch directory if they exist there, else
    from the repository root (so ``../shared/data`` works from anywhere in a checkout)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    repo = REPO_ROOT / p
    return repo if repo.exists() else p


def cache_path(path: str) -> Path:
    """A cache path: relative ones live under the repository root, wherever the job was
    launched, so every job of a checkout shares one decoded data set and one checkpoint
    folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p
