"""Training checkpoints: written atomically; resumed, refused (another run's) or moved to
``<name>.corrupt`` (unreadable or an older format)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT = 2
_REQUIRED = ("format", "step", "model", "optimizer", "alive", "diverged_step", "loss",
             "eval_steps", "test_acc", "elapsed_s")


def save(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically: a temporary file, fsync, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path: Path, device: torch.device, identity: dict, steps: int) -> dict | None:
    """The checkpoint at ``path`` (tensors on ``device``) if resumable; ``None`` when absent or
    moved to ``<path>.corrupt``. Raises ValueError: another run's checkpoint (an identity key
    differs) or past ``steps``; OSError: the file cannot be read or moved."""
    if not path.exists():
        return None
    with open(path, "rb") as f:  # a file-system error (permissions) propagates from here
        try:
            ckpt = torch.load(f, map_location=device, weights_only=True)
        except Exception as err:  # noqa: BLE001 — whatever torch.load cannot parse is corrupt
            problem = f"unreadable ({type(err).__name__}: {err})"
        else:
            problem = _malformed(ckpt)
    if problem:
        return unusable(path, problem)
    for key, want in identity.items():
        if ckpt.get(key) != want:
            raise ValueError(
                f"checkpoint {path} was written with {key}={ckpt.get(key)!r}, this run has "
                f"{key}={want!r}; delete it or point checkpoint_path elsewhere to start afresh")
    if ckpt["step"] > steps:
        raise ValueError(f"checkpoint {path} is at step {ckpt['step']} > steps={steps}")
    return ckpt


def _malformed(ckpt: object) -> str | None:
    if not isinstance(ckpt, dict):
        return f"not a training checkpoint (a {type(ckpt).__name__})"
    if ckpt.get("format") != FORMAT:
        return f"format {ckpt.get('format')!r}, this version reads format {FORMAT}"
    missing = [k for k in _REQUIRED if k not in ckpt]
    return f"incomplete (no {', '.join(missing)})" if missing else None


def unusable(path: Path, why: str) -> None:
    """Move an unusable checkpoint aside to ``<path>.corrupt`` (training restarts from step 0)."""
    aside = path.with_name(path.name + ".corrupt")
    os.replace(path, aside)
    log.warning("checkpoint %s is %s; moved it to %s and training from step 0", path, why, aside)
