"""CIFAR-10 loading: the three sources, the decode cache, errors, device data and sampling."""

from __future__ import annotations

import io
import logging
import pickle
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import encode_jpeg

import rankexp.tasks.data as data_mod
from rankexp.locations import cache_path, user_cache_dir
from rankexp.tasks.data import (
    ARCHIVE_NAME,
    CLASSES,
    DEFAULT_CACHE_DIR,
    DEFAULT_ROOT,
    BatchSampler,
    CorruptDataError,
    DataError,
    DeviceDataset,
    MissingDataError,
    channel_stats,
    load_cifar10,
)

PER_CLASS = {"train": 3, "test": 1}
# encode_jpeg (fixtures only) is deprecated in torchvision 0.29 in favour of TorchCodec
pytestmark = pytest.mark.filterwarnings("ignore:.*TorchVision are deprecated:DeprecationWarning")


def make_tree(root: Path, seed: int = 0) -> Path:
    """A tiny CIFAR-10 image-folder tree ``root/cifar10-jpeg/{train,test}/<class>/NNNN.jpg``."""
    g = torch.Generator().manual_seed(seed)
    tree = root / "cifar10-jpeg"
    for split, n in PER_CLASS.items():
        for cls in CLASSES:
            folder = tree / split / cls
            folder.mkdir(parents=True)
            for i in range(n):
                img = torch.randint(0, 256, (3, 32, 32), generator=g, dtype=torch.uint8)
                (folder / f"{i:04d}.jpg").write_bytes(
                    encode_jpeg(img, quality=90).numpy().tobytes()
                )
    return tree


def pil_reference(tree: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent decode: PIL, class index = position in the standard CIFAR-10 list."""
    images, labels = [], []
    for label, cls in enumerate(CLASSES):
        for f in sorted((tree / split / cls).iterdir()):
            arr = np.asarray(Image.open(f).convert("RGB"))
            images.append(torch.from_numpy(arr.copy()).permute(2, 0, 1))
            labels.append(label)
    return torch.stack(images), torch.tensor(labels)


@pytest.fixture
def tree(tmp_path) -> Path:
    return make_tree(tmp_path / "data")


def load(root, cache, **kw):
    return load_cifar10(root, cache, expect_counts=None, progress=False, **kw)


# --------------------------------------------------------------------------- the console
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_decode_draws_a_bar_on_a_terminal_only(tree, tmp_path, monkeypatch, caplog, terminal):
    """Issue 19 row 8: redirected output got the decode bar's \r frames.  Redirected (stderr a
    file or a pipe), the decode writes no bar, and a log line per split says what it decoded;
    on a terminal the bar is there (the \r frames are what a bar is made of)."""
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with caplog.at_level(logging.INFO, logger="rankexp"):
        load_cifar10(tree.parent, tmp_path / "cache", expect_counts=None)
    assert ("\r" in err.getvalue()) is terminal and ("decode train" in err.getvalue()) is terminal
    decoded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decoded ")]
    assert [m.split(" in ")[0] for m in decoded] == [f"decoded {10 * PER_CLASS['train']} train images",
                                                     f"decoded {10 * PER_CLASS['test']} test images"]


# --------------------------------------------------------------------------- sources and cache
def test_imagefolder_decodes_like_pil_in_cifar_label_order(tree, tmp_path):
    x_train, y_train, x_test, y_test = load(tree.parent, tmp_path / "cache")
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        ref_x, ref_y = pil_reference(tree, split)
        assert x.dtype == torch.uint8 and x.shape == (10 * PER_CLASS[split], 3, 32, 32)
        assert y.dtype == torch.int64 and torch.equal(y, ref_y)
        assert torch.equal(x, ref_x)


def test_redirected_decode_writes_no_bar_frames(tree, tmp_path, capsys):
    """Issue 19 item 6: with ``progress=True`` but stderr not a terminal (Slurm, a pipe), the
    decode writes no tqdm frame (``\r``) — the bar is drawn only on a terminal."""
    load_cifar10(tree.parent, tmp_path / "cache", expect_counts=None, progress=True)
    out = capsys.readouterr()
    assert "\r" not in out.err + out.out and "decode" not in out.err


def test_cached_load_skips_decoding_and_round_trips(tree, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = load(tree.parent, cache)
    assert len(list(cache.glob("cifar10-*.pt"))) == 1

    def no_decode(*a, **k):
        raise AssertionError("decoded again although the cache is valid")

    monkeypatch.setattr(data_mod, "_decode_imagefolder", no_decode)
    t0 = time.perf_counter()
    second = load(tree.parent, cache)
    assert time.perf_counter() - t0 < 2.0
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b) and a.dtype == b.dtype


def test_changed_source_is_decoded_again(tree, tmp_path):
    cache = tmp_path / "cache"
    x_train = load(tree.parent, cache)[0]
    victim = tree / "train" / "cat" / "0000.jpg"
    victim.unlink()  # a removed image changes the class folder's mtime → new key
    x_train2 = load(tree.parent, cache)[0]
    assert x_train2.shape[0] == x_train.shape[0] - 1
    assert len(list(cache.glob("cifar10-*.pt"))) == 2


def test_corrupt_cache_file_is_rebuilt(tree, tmp_path, caplog):
    cache = tmp_path / "cache"
    first = load(tree.parent, cache)
    (cache_file,) = cache.glob("cifar10-*.pt")
    cache_file.write_bytes(b"not a torch file")
    with caplog.at_level(logging.WARNING, logger="rankexp.tasks.data"):
        again = load(tree.parent, cache)
    assert f"ignoring CIFAR-10 cache {cache_file}" in caplog.text
    assert torch.equal(first[0], again[0])


def test_bit_flipped_cache_fails_its_checksum_and_is_decoded_again(tree, tmp_path, caplog,
                                                                   monkeypatch):
    """Issue 8 row 12: one flipped bit in the cached pixels must not load silently."""
    cache = tmp_path / "cache"
    first = load(tree.parent, cache)
    (cache_file,) = cache.glob("cifar10-*.pt")
    raw = bytearray(cache_file.read_bytes())
    at = raw.find(first[0].numpy().tobytes()[:256])  # the stored train pixels
    assert at > 0
    raw[at + 1000] ^= 0x10
    cache_file.write_bytes(bytes(raw))
    # the damaged file still loads as tensors: only the checksum can tell
    damaged = torch.load(cache_file, mmap=True, weights_only=True)["x_train"]
    assert not torch.equal(damaged, first[0])
    decodes = []
    real_decode = data_mod._decode_imagefolder
    monkeypatch.setattr(data_mod, "_decode_imagefolder",
                        lambda *a, **k: decodes.append(1) or real_decode(*a, **k))
    with caplog.at_level(logging.WARNING, logger="rankexp.tasks.data"):
        again = load(tree.parent, cache)
    assert "do not match their SHA-256" in caplog.text and str(cache_file) in caplog.text
    assert decodes == [1]
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    caplog.clear()
    load(tree.parent, cache)  # rewritten: the next load is a clean cached one
    assert decodes == [1] and "ignoring" not in caplog.text


def test_cache_without_checksum_is_decoded_again(tree, tmp_path, caplog):
    cache = tmp_path / "cache"
    first = load(tree.parent, cache)
    (cache_file,) = cache.glob("cifar10-*.pt")
    blob = torch.load(cache_file, weights_only=True)
    del blob["sha256"]  # as the previous version wrote it
    torch.save(blob, cache_file)
    with caplog.at_level(logging.WARNING, logger="rankexp.tasks.data"):
        again = load(tree.parent, cache)
    assert "no checksum" in caplog.text
    assert torch.equal(first[0], again[0])
    assert "sha256" in torch.load(cache_file, weights_only=True)


def test_archive_is_extracted_once_and_matches_the_tree(tree, tmp_path):
    archive_dir = tmp_path / "shared"
    archive_dir.mkdir()
    with tarfile.open(archive_dir / ARCHIVE_NAME, "w:gz") as tar:
        tar.add(tree, arcname="cifar10-jpeg")
    cache = tmp_path / "cache"
    from_tree = load(tree.parent, tmp_path / "cache_tree")
    from_archive = load(archive_dir, cache)  # auto → archive
    also_file = load(archive_dir / ARCHIVE_NAME, cache, source="archive")
    for a, b, c in zip(from_tree, from_archive, also_file, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert len(list(cache.glob("cifar10-jpeg-*"))) == 1  # one extracted tree


def test_torchvision_original_batches(tmp_path, monkeypatch):
    """The torchvision source: pickled (N, 3072) channel-major rows → (N, 3, 32, 32)."""
    folder = tmp_path / "tv" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows, labels = {}, {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        rows[name] = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
        labels[name] = rng.integers(0, 10, 4).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": rows[name], "labels": labels[name]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": list(CLASSES)}, f)
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)
    x_train, y_train, x_test, y_test = load(tmp_path / "tv", tmp_path / "cache")
    expected = np.concatenate([rows[n] for n in names[:5]]).reshape(-1, 3, 32, 32)
    assert torch.equal(x_train, torch.from_numpy(expected))
    assert torch.equal(x_test, torch.from_numpy(rows["test_batch"].reshape(-1, 3, 32, 32)))
    assert y_train.tolist() == sum((labels[n] for n in names[:5]), [])
    assert y_test.tolist() == labels["test_batch"]


# --------------------------------------------------------------------------- errors
def test_missing_data_says_where_and_how_to_get_it(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(MissingDataError) as info:
        load_cifar10(missing, tmp_path / "cache")
    msg = str(info.value)
    assert str(missing) in msg and ARCHIVE_NAME in msg and "download=True" in msg
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingDataError, match="holds no"):
        load_cifar10(tmp_path / "empty", tmp_path / "cache", source="imagefolder")
    with pytest.raises(ValueError, match="source='jpeg' is not one of"):
        load_cifar10(tmp_path, tmp_path / "cache", source="jpeg")


def test_truncated_archive_is_reported_as_corrupt(tree, tmp_path):
    archive = tmp_path / "shared" / ARCHIVE_NAME
    archive.parent.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tree, arcname="cifar10-jpeg")
    archive.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(CorruptDataError, match="damaged") as info:
        load(archive.parent, tmp_path / "cache")
    assert str(archive) in str(info.value) and isinstance(info.value, ValueError)
    assert not list((tmp_path / "cache").glob("*.tmp*"))  # no half-extracted tree left


def test_wrong_class_folders_are_refused(tree, tmp_path):
    (tree / "train" / "cat").rename(tree / "train" / "kitten")
    with pytest.raises(CorruptDataError, match="class folders"):
        load(tree.parent, tmp_path / "cache")


def test_undecodable_image_is_named(tree, tmp_path):
    bad = tree / "test" / "ship" / "0000.jpg"
    bad.write_bytes(b"\xff\xd8 this is not a jpeg")
    with pytest.raises(CorruptDataError, match="cannot decode") as info:
        load(tree.parent, tmp_path / "cache")
    assert str(bad) in str(info.value)


def test_incomplete_data_set_is_refused_by_default(tree, tmp_path):
    with pytest.raises(CorruptDataError, match="expected 50000 / 10000"):
        load_cifar10(tree.parent, tmp_path / "cache", progress=False)


# --------------------------------------------------------------------------- device data, sampler
def test_device_dataset_standardizes_per_channel_with_train_statistics():
    g = torch.Generator().manual_seed(0)
    x_train = torch.randint(0, 256, (50, 3, 32, 32), generator=g, dtype=torch.uint8)
    x_test = torch.randint(0, 256, (20, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.zeros(50, dtype=torch.int64)
    ds = DeviceDataset.from_uint8(x_train, y, x_test, y[:20])
    ref = x_train.double().div(255).transpose(0, 1).reshape(3, -1)
    np.testing.assert_allclose(ds.mean, ref.mean(1), rtol=1e-12)
    np.testing.assert_allclose(ds.std, ref.std(1, unbiased=False), rtol=1e-12)
    assert ds.x_train.shape == (50, 3072) and ds.x_train.dtype == torch.float32
    expected = (x_test.double() / 255 - ds.mean.view(1, 3, 1, 1)) / ds.std.view(1, 3, 1, 1)
    torch.testing.assert_close(ds.x_test.double(), expected.reshape(20, -1), rtol=1e-6, atol=1e-6)
    per_channel = ds.x_train.view(50, 3, -1).transpose(0, 1).reshape(3, -1).double()
    torch.testing.assert_close(
        per_channel.mean(1), torch.zeros(3, dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        per_channel.std(1, unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-6, rtol=0
    )
    with pytest.raises(ValueError, match="uint8"):
        DeviceDataset.from_uint8(x_train.float(), y, x_test, y[:20])


def test_batch_sampler_epochs_are_permutations_and_depend_only_on_seed_and_step():
    n, b = 103, 10
    s = BatchSampler(n, b, seed=4)
    epoch0 = torch.cat([s.indices(t) for t in range(10)])
    epoch1 = torch.cat([s.indices(t) for t in range(10, 20)])
    for epoch in (epoch0, epoch1):
        assert epoch.unique().numel() == 100 and epoch.min() >= 0 and epoch.max() < n
    assert not torch.equal(epoch0, epoch1)
    # stateless: a fresh sampler asked for step 13 directly (a resumed run) agrees
    assert torch.equal(BatchSampler(n, b, seed=4).indices(13), s.indices(13))
    assert not torch.equal(BatchSampler(n, b, seed=5).indices(0), s.indices(0))
    with pytest.raises(ValueError, match="batch_size=200"):
        BatchSampler(n, 200, seed=0)


# --------------------------------------------------------------------------- the real data set
@pytest.mark.skipif(
    not (DEFAULT_ROOT / ARCHIVE_NAME).is_file(), reason=f"no {DEFAULT_ROOT / ARCHIVE_NAME}"
)
def test_real_cifar10_counts_classes_statistics_and_cached_load_time():
    load_cifar10(progress=False)  # decodes once if the user's cache lacks it
    t0 = time.perf_counter()
    x_train, y_train, x_test, y_test = load_cifar10(DEFAULT_ROOT, DEFAULT_CACHE_DIR, progress=False)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"cached load took {elapsed:.2f}s"
    assert x_train.shape == (50_000, 3, 32, 32) and x_test.shape == (10_000, 3, 32, 32)
    assert torch.bincount(y_train).tolist() == [5000] * 10
    assert torch.bincount(y_test).tolist() == [1000] * 10
    # per-channel test statistics stated in ../shared/data/README.md
    mean, std = channel_stats(x_test)
    np.testing.assert_allclose(mean, [0.494, 0.485, 0.450], atol=1e-3)
    np.testing.assert_allclose(std, [0.245, 0.242, 0.261], atol=1e-3)


def test_default_paths_point_at_shared_and_the_users_cache(monkeypatch, tmp_path):
    repo = Path(data_mod.__file__).resolve().parents[2]  # rankexp/tasks/data.py → the checkout
    assert DEFAULT_ROOT == repo.parent / "shared" / "data"
    assert DEFAULT_CACHE_DIR == user_cache_dir() / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_path("data") == tmp_path / "rankexp" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_path("checkpoints") == Path.home() / ".cache" / "rankexp" / "checkpoints"
