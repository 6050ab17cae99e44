"""Where inputs and caches live, wherever a job was launched from."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = str(REPO_ROOT / "conf")  # the Hydra config tree: conf/config.yaml and its groups


def private_files() -> None:
    """Files and folders this process creates are its user's alone (0600/0700), whatever the
    login's umask: the store, job directories, artifacts and caches hold results that other
    users of a shared node must not read."""
    os.umask(os.umask(0o077) | 0o077)


def resolve_path(path: str) -> Path:
    """An input path: relative ones from the launch directory if they exist there, else
    from the repository root (so ``../shared/data`` works from anywhere in a checkout)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    repo = REPO_ROOT / p
    return repo if repo.exists() else p


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rankexp``, else ``~/.cache/rankexp``: this user's decoded data,
    checkpoints and analysis caches — never the checkout, which may be read-only or shared."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rankexp"


def cache_path(path: str) -> Path:
    """A cache path: relative ones live under :func:`user_cache_dir`, wherever the job was
    launched, so every job of a user shares one decoded data set and one checkpoint folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else user_cache_dir() / p


#: ``data.cache_dir``'s default: the decoded CIFAR-10, under :func:`user_cache_dir`
DATA_CACHE = "data"


ARCHIVE_NAME = "cifar10-jpeg.tar.gz"
FOLDER_NAME = "cifar10-jpeg"
TORCHVISION_FOLDER = "cifar-10-batches-py"

HOW_TO_GET = (
    f"Get CIFAR-10 one of these ways: point `root` at the folder holding {ARCHIVE_NAME} "
    "(data.root's default; or set $RANKEXP_DATA), "
    f"at an extracted image-folder tree ({FOLDER_NAME}/train/<class>/*.jpg), "
    f"or at a folder holding torchvision's {TORCHVISION_FOLDER}; "
    "with internet access, download=True fetches the original via torchvision."
)


class DataError(Exception):
    """CIFAR-10 could not be loaded; the message names the path and how to get the data."""


class MissingDataError(DataError, FileNotFoundError):
    """No CIFAR-10 source at the given path."""


def locate_cifar10(root: Path, source: str, download: bool) -> tuple[str, Path]:
    """Which CIFAR-10 source ``root`` holds, as ``(kind, path)``: ``kind`` one of
    ``torchvision``, ``imagefolder``, ``archive`` (``source="auto"`` takes them in that order).

    Raises:
        MissingDataError: ``root`` is a file that is no archive, or holds no source.
    """
    found: dict[str, Path] = {}
    if root.is_file():
        if source not in ("auto", "archive") or not root.name.endswith((".tar.gz", ".tgz", ".tar")):
            raise MissingDataError(
                f"{root} is a file, not a CIFAR-10 source for source={source!r}. {HOW_TO_GET}")
        return "archive", root
    if (root / TORCHVISION_FOLDER).is_dir():
        found["torchvision"] = root
    for tree in (root / FOLDER_NAME, root):
        if (tree / "train").is_dir() and (tree / "test").is_dir():
            found.setdefault("imagefolder", tree)
    if (root / ARCHIVE_NAME).is_file():
        found["archive"] = root / ARCHIVE_NAME
    for kind in ("torchvision", "imagefolder", "archive") if source == "auto" else (source,):
        if kind in found:
            return kind, found[kind]
    if download and source in ("auto", "torchvision"):
        return "torchvision", root
    wanted = {"auto": f"{TORCHVISION_FOLDER}/, {FOLDER_NAME}/train|test/ or {ARCHIVE_NAME}",
              "torchvision": f"{TORCHVISION_FOLDER}/",
              "imagefolder": f"{FOLDER_NAME}/train|test/ (or train|test/)",
              "archive": ARCHIVE_NAME}[source]
    state = "does not exist" if not root.exists() else f"holds no {wanted}"
    raise MissingDataError(f"CIFAR-10 not found: {root} {state} (source={source!r}). {HOW_TO_GET}")
