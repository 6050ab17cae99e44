"""CIFAR-10 for the ``train`` task: decode once, cache, keep the whole set on the device.

Sources: ``torchvision`` (``cifar-10-batches-py``), ``imagefolder`` (``cifar10-jpeg/{train,test}/<class>/``)
and ``archive`` (``cifar10-jpeg.tar.gz``). Decoded tensors are cached with their SHA-256, checked on
every load (a mismatching cache is decoded again).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..knobs import CIFAR10_COUNTS
from ..locations import (
    ARCHIVE_NAME as ARCHIVE_NAME,  # CIFAR-10's sources: torch-free, for the checks
)
from ..locations import (
    DATA_CACHE,
    FOLDER_NAME,
    HOW_TO_GET,
    REPO_ROOT,
    TORCHVISION_FOLDER,
    DataError,
    cache_path,
    resolve_path,
)
from ..locations import MissingDataError as MissingDataError
from ..locations import locate_cifar10 as _locate
from ..seeding import STREAM_DATA

log = logging.getLogger(__name__)

#: CIFAR-10 label order (class folders sorted = torchvision's order).
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")
IMAGE_SHAPE = (3, 32, 32)
IN_FEATURES = 3 * 32 * 32
SOURCES = ("auto", "torchvision", "imagefolder", "archive")

DEFAULT_ROOT = REPO_ROOT.parent / "shared" / "data"
DEFAULT_CACHE_DIR = cache_path(DATA_CACHE)
_CACHE_FORMAT = 1


class CorruptDataError(DataError, ValueError):
    """A CIFAR-10 source exists but is unreadable or not CIFAR-10."""


@dataclass(frozen=True)
class DataSource:
    """Where a loaded CIFAR-10 came from (an MLflow dataset input); ``sha256``: hex."""

    kind: str
    path: Path
    cache_file: Path
    sha256: str
    train_rows: int
    test_rows: int


def load_cifar10(root: str | Path = DEFAULT_ROOT, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                 source: str = "auto", download: bool = False, *,
                 expect_counts: tuple[int, int] | None = CIFAR10_COUNTS, progress: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10 as uint8 tensors: :func:`load_cifar10_source` without the :class:`DataSource`."""
    return load_cifar10_source(root, cache_dir, source, download, expect_counts=expect_counts,
                               progress=progress)[0]


def load_cifar10_source(root: str | Path = DEFAULT_ROOT, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                        source: str = "auto", download: bool = False, *,
                        expect_counts: tuple[int, int] | None = CIFAR10_COUNTS,
                        progress: bool = True
) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], DataSource]:
    """``((x_train, y_train, x_test, y_test), source)``: uint8 ``(N, 3, 32, 32)`` RGB images and
    int64 ``(N,)`` labels in :data:`CLASSES` order, decoded once and cached.
    Raises MissingDataError: no source at ``root``; CorruptDataError: unreadable or not
    CIFAR-10; ValueError: unknown ``source``."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is not one of {', '.join(SOURCES)}")
    root, cache_dir = Path(root).expanduser(), Path(cache_dir).expanduser()
    kind, path = _locate(root, source, download)
    key = _content_key(kind, path)
    cache_file = cache_dir / f"cifar10-{_digest(key)}.pt"
    cached = _read_cache(cache_file, key)
    if cached is not None:
        tensors, sha = cached
        _check(tensors, expect_counts, cache_file)
        return tensors, _source(kind, path, cache_file, sha, tensors)
    log.info("decoding CIFAR-10 from %s %s (once; cached in %s)", kind, path, cache_file)
    if kind == "torchvision":
        tensors = _decode_torchvision(path, download)
    elif kind == "imagefolder":
        tensors = _decode_imagefolder(path, progress)
    else:
        tensors = _decode_archive(path, cache_dir, key, progress)
    _check(tensors, expect_counts, path)
    if kind == "torchvision" and download:  # the files may only exist now
        key = _content_key(kind, path)
        cache_file = cache_dir / f"cifar10-{_digest(key)}.pt"
    sha = _write_cache(cache_file, key, tensors)
    return tensors, _source(kind, path, cache_file, sha, tensors)


def _source(kind: str, path: Path, cache_file: Path, sha: str, tensors: tuple[Tensor, ...]
            ) -> DataSource:
    return DataSource(kind, path, cache_file, sha, int(tensors[1].shape[0]), int(tensors[3].shape[0]))


def _content_key(kind: str, path: Path) -> dict:
    """What identifies the decoded content: source kind, path, and size/mtime of its files."""

    def stat(p: Path) -> list:
        s = p.stat()
        return [str(p.relative_to(path)) if p != path else ".", s.st_size, s.st_mtime_ns]

    if kind == "archive":
        entries = [stat(path)]
    elif kind == "imagefolder":
        entries = [stat(path / split) for split in ("train", "test")]
        entries += [stat(d) for split in ("train", "test") for d in sorted((path / split).iterdir())]
    else:
        folder = path / TORCHVISION_FOLDER
        entries = [stat(f) for f in sorted(folder.iterdir())] if folder.is_dir() else []
    return {"format": _CACHE_FORMAT, "kind": kind, "path": str(path.resolve()), "files": entries}


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


_SPLITS = ("x_train", "y_train", "x_test", "y_test")


def tensors_sha256(tensors: tuple[Tensor, ...]) -> str:
    """SHA-256 (hex) of CPU tensors' dtypes, shapes and bytes, in order, read in place."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()


def _read_cache(cache_file: Path, key: dict) -> tuple[tuple[Tensor, ...], str] | None:
    if not cache_file.is_file():
        return None
    try:
        blob = torch.load(cache_file, mmap=True, weights_only=True)
        if blob.get("key") != key:
            raise ValueError("content key differs")
        tensors = tuple(blob[name] for name in _SPLITS)
        if "sha256" not in blob:
            raise ValueError("no checksum (written by an older version)")
        if tensors_sha256(tensors) != blob["sha256"]:
            raise ValueError("contents do not match their SHA-256: the file is damaged")
        return tensors, blob["sha256"]
    except Exception as err:  # any unreadable cache is rebuilt, never trusted
        log.warning("ignoring CIFAR-10 cache %s (%s); decoding again", cache_file, err)
        return None


def _write_cache(cache_file: Path, key: dict, tensors: tuple[Tensor, ...]) -> str:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    sha = tensors_sha256(tensors)
    blob = dict(zip(_SPLITS, tensors, strict=True), key=key, sha256=sha)
    tmp = cache_file.with_name(f"{cache_file.name}.tmp{os.getpid()}")
    torch.save(blob, tmp)
    os.replace(tmp, cache_file)
    log.info("cached decoded CIFAR-10 in %s", cache_file)
    return sha


def _check(tensors: tuple[Tensor, ...], expect_counts: tuple[int, int] | None, where: Path) -> None:
    x_train, y_train, x_test, y_test = tensors
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.dtype != torch.uint8 or tuple(x.shape[1:]) != IMAGE_SHAPE or x.shape[0] != y.shape[0]:
            raise CorruptDataError(
                f"{where}: {split} images have shape {tuple(x.shape)} {x.dtype} with "
                f"{y.shape[0]} labels; expected (N, 3, 32, 32) uint8. {HOW_TO_GET}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= len(CLASSES)):
            raise CorruptDataError(f"{where}: {split} labels outside 0..9. {HOW_TO_GET}")
    if expect_counts is not None and (x_train.shape[0], x_test.shape[0]) != tuple(expect_counts):
        raise CorruptDataError(
            f"{where}: found {x_train.shape[0]} train / {x_test.shape[0]} test images, "
            f"expected {expect_counts[0]} / {expect_counts[1]} (incomplete copy?). {HOW_TO_GET}")


def _decode_torchvision(root: Path, download: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from torchvision.datasets import CIFAR10

    out = []
    for train in (True, False):
        try:
            ds = CIFAR10(str(root), train=train, download=download)
        except RuntimeError as err:  # torchvision: "Dataset not found or corrupted"
            raise CorruptDataError(f"{root / TORCHVISION_FOLDER}: {err}. {HOW_TO_GET}") from err
        if list(ds.classes) != list(CLASSES):
            raise CorruptDataError(f"{root}: classes {ds.classes} are not CIFAR-10's {CLASSES}")
        x = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()
        out += [x, torch.as_tensor(ds.targets, dtype=torch.int64)]
    return tuple(out)


def _decode_imagefolder(tree: Path, progress: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Decode ``tree/{train,test}/<class>/*`` with libjpeg (torchvision.io)."""
    from torchvision.datasets import ImageFolder
    from torchvision.io import ImageReadMode, decode_image

    out = []
    for split in ("train", "test"):
        try:
            folder = ImageFolder(str(tree / split))
        except (FileNotFoundError, OSError) as err:
            raise CorruptDataError(f"{tree / split}: {err}. {HOW_TO_GET}") from err
        if list(folder.classes) != list(CLASSES):
            raise CorruptDataError(
                f"{tree / split}: class folders {folder.classes} are not CIFAR-10's "
                f"{list(CLASSES)} (labels would be wrong). {HOW_TO_GET}")
        images = torch.empty(len(folder.samples), *IMAGE_SHAPE, dtype=torch.uint8)
        started = time.perf_counter()
        with warnings.catch_warnings():  # torchvision ≥ 0.29 deprecates its codecs
            warnings.filterwarnings("ignore", ".*TorchVision are deprecated", DeprecationWarning)
            for i, (p, _) in enumerate(tqdm(folder.samples, desc=f"decode {split}", unit="img",
                                            disable=None if progress else True)):
                try:
                    img = decode_image(p, ImageReadMode.RGB)
                except RuntimeError as err:
                    raise CorruptDataError(
                        f"{p}: cannot decode image ({err}). {HOW_TO_GET}") from err
                if tuple(img.shape) != IMAGE_SHAPE:
                    raise CorruptDataError(f"{p}: image is {tuple(img.shape)}, CIFAR-10 images "
                                           f"are 3×32×32. {HOW_TO_GET}")
                images[i] = img
        log.info("decoded %d %s images in %.1f s", len(images), split,
                 time.perf_counter() - started)
        out += [images, torch.as_tensor(folder.targets, dtype=torch.int64)]
    return tuple(out)


def _decode_archive(archive: Path, cache_dir: Path, key: dict, progress: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Extract ``archive`` once into ``cache_dir`` (atomically), then decode it."""
    dest = cache_dir / f"{FOLDER_NAME}-{_digest(key)}"
    if not dest.is_dir():
        tmp = cache_dir / f"{dest.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log.info("extracting %s into %s", archive, dest)
        try:
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):  # refuse links/paths leaving dest
                    tar.extractall(tmp, filter="data")
                else:  # pragma: no cover - Python without PEP 706
                    tar.extractall(tmp)
        except (tarfile.TarError, EOFError, OSError, ValueError) as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorruptDataError(f"{archive}: cannot extract ({type(err).__name__}: {err}); "
                                   f"the archive is damaged. {HOW_TO_GET}") from err
        if not (tmp / FOLDER_NAME / "train").is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorruptDataError(
                f"{archive}: holds no {FOLDER_NAME}/train folder; not the CIFAR-10 image-folder "
                f"archive. {HOW_TO_GET}")
        try:  # atomic: ``dest`` only ever holds a complete tree
            os.replace(tmp, dest)
        except OSError:  # another process got there first; use its tree
            shutil.rmtree(tmp, ignore_errors=True)
    return _decode_imagefolder(dest / FOLDER_NAME, progress)


def channel_stats(images: Tensor) -> tuple[Tensor, Tensor]:
    """Exact per-channel mean and population std (float64 ``(3,)`` each, 0–1 scale) of uint8
    ``(N, 3, H, W)``."""
    levels = torch.arange(256, dtype=torch.float64) / 255.0
    means, stds = [], []
    for c in range(images.shape[1]):
        hist = torch.bincount(images[:, c].reshape(-1).cpu(), minlength=256).to(torch.float64)
        p = hist / hist.sum()
        mean = (p * levels).sum()
        means.append(mean)
        stds.append(((p * (levels - mean) ** 2).sum()).sqrt())
    return torch.stack(means), torch.stack(stds)


@dataclass
class DeviceDataset:
    """The data set on the device: ``x_*`` ``(N, 3072)`` standardized by the train split's
    ``mean``/``std`` (float64 ``(3,)``), ``y_*`` int64 ``(N,)``."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    mean: Tensor
    std: Tensor
    source: DataSource | None = None

    @classmethod
    def from_uint8(cls, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, *,
                   device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> DeviceDataset:
        """Move uint8 images ``(N, 3, H, W)`` to ``device`` once, then convert there.
        Raises ValueError: images not uint8 ``(N, 3, H, W)`` or label count mismatch."""
        for x, y in ((x_train, y_train), (x_test, y_test)):
            if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"expected uint8 images (N, 3, H, W) with N labels, got {tuple(x.shape)} "
                    f"{x.dtype} and {tuple(y.shape)} labels")
        mean, std = channel_stats(x_train)

        def convert(x: Tensor) -> Tensor:
            x = x.to(device=device).to(dtype)
            shape = (1, -1, 1, 1)
            x.sub_((255.0 * mean).to(x).view(shape)).div_((255.0 * std).to(x).view(shape))
            return x.reshape(x.shape[0], -1)

        return cls(x_train=convert(x_train), y_train=y_train.to(device=device, dtype=torch.int64),
                   x_test=convert(x_test), y_test=y_test.to(device=device, dtype=torch.int64),
                   mean=mean, std=std)

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    @property
    def in_features(self) -> int:
        return self.x_train.shape[1]


def load_device_dataset(root: str | Path = DEFAULT_ROOT, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                        *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        source: str = "auto", download: bool = False, progress: bool = True
) -> DeviceDataset:
    """:func:`load_cifar10_source` then :meth:`DeviceDataset.from_uint8`, with its :class:`DataSource`."""
    tensors, where = load_cifar10_source(root, cache_dir, source=source, download=download,
                                         progress=progress)
    return dataclasses.replace(DeviceDataset.from_uint8(*tensors, device=device, dtype=dtype),
                               source=where)


def dataset_for(s, device: str | torch.device, dtype: torch.dtype) -> DeviceDataset:
    """The data set a validated config names (``data.*``), on ``device``."""
    return load_device_dataset(resolve_path(s.data.root), cache_path(s.data.cache_dir),
                               device=device, dtype=dtype, source=s.data.source,
                               download=s.data.download)


class BatchSampler:
    """Shuffled index batches on the device, a pure function of ``(seed, step)`` (epoch k seeded
    from ``(seed, STREAM_DATA, k)``, partial batch dropped)."""

    def __init__(self, n: int, batch_size: int, seed: int, device: str | torch.device = "cpu"):
        if not 1 <= batch_size <= n:
            raise ValueError(f"batch_size={batch_size} must be in 1..{n} (the data set size)")
        self.n, self.batch_size, self.seed = int(n), int(batch_size), int(seed)
        self.device = torch.device(device)
        self.batches_per_epoch = self.n // self.batch_size
        self._epoch, self._perm = -1, None

    def indices(self, step: int) -> Tensor:
        """Index batch of (0-based) ``step``: int64 ``(batch_size,)`` on the device."""
        epoch, k = divmod(int(step), self.batches_per_epoch)
        if epoch != self._epoch:
            seq = np.random.SeedSequence([self.seed, STREAM_DATA, epoch])
            seed = int(seq.generate_state(1, np.uint64)[0]) & 0x7FFF_FFFF_FFFF_FFFF
            g = torch.Generator(device=self.device).manual_seed(seed)
            self._perm = torch.randperm(self.n, generator=g, device=self.device)
            self._epoch = epoch
        return self._perm[k * self.batch_size : (k + 1) * self.batch_size]

    def state_dict(self) -> dict:
        """What a checkpoint checks to know a resumed run samples the same way."""
        return {"n": self.n, "batch_size": self.batch_size, "seed": self.seed}
