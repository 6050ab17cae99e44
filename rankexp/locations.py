"""Where inputs and caches live, wherever a job was launched from."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


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


def user_cache(*parts: str) -> Path:
    """A path in the user's cache folder, ``$XDG_CACHE_HOME/rankexp/…`` (default
    ``~/.cache/rankexp/…``), for what depends on the installed libraries rather than on a
    checkout (the empty MLflow store of :func:`rankexp.tracking.store.store_template`, the
    compiled ziggurat of :mod:`rankexp.native`)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "rankexp" / Path(*parts)


@contextmanager
def atomic_path(path: Path) -> Iterator[str]:
    """A temporary file name beside ``path`` to write; renamed to ``path`` when the block ends
    without an error (a reader sees the whole file or none, and of two processes writing the
    same content at once either's file is fine), removed when it raises.  The folder is made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
