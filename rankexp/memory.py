"""How much memory a measurement needs, and how much the device has — without torch.

The per-seed estimate (:func:`seed_bytes`: weights plus the largest working set of the chosen
probes) decides the seed chunks of ``task=measure`` (:func:`chunking`); before any run,
:func:`rankexp.config.checks.check_fits` refuses a seed (or a training run's probes,
:func:`probe_bytes`) that cannot fit the device.  tests/test_memory.py measures it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .models.families import family_of
from .probes import PROBES
from .probes.catalog import ConvShape, ModelShape

RankexpConfig = Any  # a typed config (rankexp.config.RankexpConfig)

#: bytes per number of the config's ``dtype``
ITEMSIZE = {"float32": 4, "float64": 8}


def cuda_possible() -> bool:
    """Whether this machine may have a CUDA device, known without importing torch: the NVIDIA
    driver's ``/proc`` entry or a ``/dev/nvidia<N>`` node."""
    return Path("/proc/driver/nvidia/version").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def device_type(device: str) -> str:
    """``cpu`` or ``cuda`` for a config's ``device`` (``auto``: CUDA when present)."""
    if device == "auto":
        if not cuda_possible():
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else device


def model_shape(s: RankexpConfig, device: str | None = None) -> ModelShape | ConvShape:
    """One seed's network as the probes' memory estimates see it (the family's declared
    ``memory_shape``: a ConvNet's own shape, the MLP's widths); ``device`` (default: the
    config's) decides whether the sweep defers its spectra (CUDA)."""
    return family_of(s).memory_shape(s, ITEMSIZE[s.dtype.value],
                                     device_type(device or s.device) == "cuda")


def streams_weights(s: RankexpConfig) -> bool:
    """Whether ``task=measure`` draws this config's weights block by block as the forward sweep
    reaches them: on the CPU (on a GPU a draw per block would wait for the device), when its
    family and every probe stream (``Family.streams``, ``Probe.streams``)."""
    return (s.task.name == "measure" and device_type(s.device) == "cpu" and family_of(s).streams
            and all(PROBES[p].streams for p in s.task.probes))


def weight_bytes(s: RankexpConfig, shape: ModelShape | ConvShape | None = None,
                 streamed: bool = False) -> float:
    """Bytes of one seed's weights in memory at once: all of them, or one block's when
    ``streamed``."""
    shape = shape or model_shape(s)
    if isinstance(shape, ConvShape):
        return float(shape.weight_bytes())
    per_block = shape.hidden * shape.width * (1 if s.matrices == 1 else 2 + (s.activation.value == "swiglu"))
    return float((1 if streamed else shape.depth) * per_block * shape.itemsize)


def seed_bytes(s: RankexpConfig, device: str | None = None) -> float:
    """Memory one seed needs: its weights (one block's where :func:`streams_weights`) plus the
    largest working set of the chosen probes."""
    shape = model_shape(s, device)
    return (weight_bytes(s, shape, streams_weights(s))
            + max(PROBES[p].memory(shape, s.task.options) for p in s.task.probes))


def _meminfo(key: str) -> float:
    """``/proc/meminfo``'s ``key`` (``MemTotal``, ``MemAvailable``) in bytes."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return float(info[key].split()[0]) * 1024


def total_memory_bytes(device: str) -> tuple[float, str]:
    """``(bytes, what)``: all the memory ``device`` has — the host's RAM, or the CUDA device's."""
    if device_type(device) == "cuda":
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return float(props.total_memory), f"cuda:{index} ({props.name})"
    return _meminfo("MemTotal"), "this machine's RAM"


def free_memory_bytes(device: str) -> float:
    """Free memory of ``device``: CUDA's free bytes, or the host's available RAM."""
    if device_type(device) == "cuda":
        import torch

        return float(torch.cuda.mem_get_info(device if device != "auto" else None)[0])
    return _meminfo("MemAvailable")


#: what a job may plan to use of the free memory it finds when no cap is set (and at most, with one)
FREE_FRACTION = 0.8


def memory_budget(s: RankexpConfig, device: str) -> tuple[float, str]:
    """``(bytes, what)``: the memory the seeds of one chunk may use on ``device`` —
    ``task.max_memory_gb``, never more than :data:`FREE_FRACTION` of the free memory (``null``:
    that fraction); ``what`` says which bound decided, for the job's log."""
    free = FREE_FRACTION * free_memory_bytes(device)
    cap = s.task.max_memory_gb
    if cap is None:
        return free, f"{FREE_FRACTION:.0%} of free memory, {gigabytes(free)}"
    if cap * 1e9 > free:
        return free, f"{FREE_FRACTION:.0%} of free memory, {gigabytes(free)} (< task.max_memory_gb={cap:g})"
    return cap * 1e9, f"task.max_memory_gb={cap:g}"


def chunking(s: RankexpConfig, device: str) -> tuple[int, str]:
    """``(seeds per chunk, log line)``: as many seeds as fit :func:`memory_budget`, ≥ 1 — all
    of them when a probe cannot split its seeds (:attr:`rankexp.probes.catalog.Probe.splits_seeds`)
    — and the line that says how many chunks that makes and why."""
    per_seed, (budget, what) = seed_bytes(s, device), memory_budget(s, device)
    if not all(PROBES[p].splits_seeds for p in s.task.probes):
        return s.seeds, (f"{s.seeds} seeds in 1 chunk (a probe pools over every seed at once; "
                         f"≈ {gigabytes(per_seed)} per seed, budget {what})")
    chunk = max(1, min(s.seeds, int(budget // per_seed)))
    n = -(-s.seeds // chunk)
    line = (f"{s.seeds} seed{'s' * (s.seeds > 1)} in {n} chunk{'s' * (n > 1)} of {chunk} "
            f"(≈ {gigabytes(per_seed)} per seed, budget {what})")
    if per_seed > budget:
        line += (f"; one seed needs more than the budget (estimate): the seeds run one at a time "
                 f"and the job's peak exceeds the budget by ≈ {gigabytes(per_seed - budget)}")
    return chunk, line


def probe_bytes(s: RankexpConfig, members: int, device: str | None = None) -> float:
    """Memory the probes of a training run need at one probed step: ``members`` learning rates
    probed at once, each a seed of :func:`seed_bytes` (the copy's weights and the largest
    working set of ``task.probes``); 0 without probes."""
    return members * seed_bytes(s, device) if s.task.probes else 0.0


def probe_memory_line(s: RankexpConfig, members: int, device: str) -> str:
    """The log's statement of a training run's probe memory against the device's free memory."""
    need, free = probe_bytes(s, members, device), FREE_FRACTION * free_memory_bytes(device)
    line = (f"≈ {gigabytes(need)} per probed step ({members} × {gigabytes(need / max(members, 1))}), "
            f"{FREE_FRACTION:.0%} of free memory {gigabytes(free)}")
    return line + ("; MORE than free: the probes may run out of memory" if need > free else "")


def gigabytes(n: float) -> str:
    """``12.3 GB``, ``640,000 GB``: bytes for a message."""
    gb = n / 1e9
    return f"{gb:,.0f} GB" if gb >= 100 else f"{gb:.3g} GB"
