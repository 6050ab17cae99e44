"""The ``measure`` task: the chosen probes on a freshly initialized network, seeds in chunks
that fit the memory budget, joined number for number as one batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from ..memory import chunking, streams_weights
from ..models import DTYPES, build_model
from ..models.convnet import CifarResNet
from ..models.families import CIFAR10, family_of
from ..models.mlp import ResidualMLP
from ..probes import DEFAULT_PROBES, FOLDS, PROBES, ImageProbeContext, ProbeContext, needs_of
from ..result import Measurement
from ..seeding import gaussian_input

if TYPE_CHECKING:
    from ..config import RankexpConfig

log = logging.getLogger(__name__)

#: scalars about the job itself, not the science: they differ between devices and runs by design
RUN_FACTS = ("measure_seconds", "build_seconds", "measure_cpu_seconds", "build_cpu_seconds",
             "peak_memory_gb", "seed_chunk")

#: ``context(network) -> ctx``: the context its probes get (default: a :class:`ProbeContext`)
ContextFactory = Callable[[nn.Module], Any]


def probe_chunk(model: ResidualMLP, probes: Sequence[str] = DEFAULT_PROBES, *,
                h0: Tensor | None = None, options: dict | None = None,
                context: ContextFactory | None = None) -> tuple[Measurement, Any]:
    """The probes' ``fn`` on one batch of seeds, unpooled: ``(Measurement, context)``; each
    probe's start and time logged at DEBUG, the probes' shared forward sweep first."""
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise KeyError(f"unknown probe(s) {unknown}; known: {sorted(PROBES)}")
    if context is not None:
        ctx = context(model)
    else:
        if h0 is None:
            p = next(model.parameters())
            h0 = gaussian_input(model.seeds, model.width, dtype=p.dtype, device=p.device)
        ctx = ProbeContext(model, h0, options, needs=needs_of(PROBES[n] for n in probes), folds=FOLDS)
    out = Measurement()
    if getattr(ctx, "needs", None):  # computed on first use: timed apart, not as a probe's
        with _timed(f"forward sweep for {', '.join(sorted(ctx.needs))}"):
            ctx.sweep  # noqa: B018
    for name in probes:
        with _timed(f"probe {name}"):
            out.update(PROBES[name].fn(ctx))
    return out, ctx


@contextlib.contextmanager
def _timed(what: str) -> Iterator[None]:
    """``what …`` at DEBUG, then ``what: 1.23 s`` when it is done."""
    log.debug("%s …", what)
    t = time.perf_counter()
    yield
    log.debug("%s: %.2f s", what, time.perf_counter() - t)


def _reduce(m: Measurement, probes: Sequence[str], ctx: Any) -> Measurement:
    for name in probes:
        if PROBES[name].reduce is not None:
            PROBES[name].reduce(m, ctx)
    for k, v in m.scalars.items():
        if not math.isfinite(v):
            log.warning("probe result %s = %s is not finite", k, v)
    return m


def run_probes(model: ResidualMLP, probes: Sequence[str] = DEFAULT_PROBES, *,
               h0: Tensor | None = None, options: dict | None = None,
               context: ContextFactory | None = None) -> Measurement:
    """Run ``probes`` on ``model`` (members = seeds) as one batch; ``h0`` ``(E, 1, d)`` defaults to each seed's Gaussian.
    Raises KeyError: an unknown probe name."""
    m, ctx = probe_chunk(model, probes, h0=h0, options=options, context=context)
    return _reduce(m, probes, ctx)


def join_seeds(parts: Sequence[Measurement]) -> Measurement:
    """Join the results of disjoint seed chunks (in seed order).
    Raises ValueError: a value that is not per-seed differs between chunks (no ``reduce``)."""
    if len(parts) == 1:
        return parts[0]
    first, out = parts[0], Measurement()
    for name in first.seed_arrays:
        v = np.concatenate([p.arrays[name] for p in parts], axis=0)
        out.seed_arrays.add(name)
        out.arrays[name] = v
        if name in first.scalars:
            out.scalars[name] = float(v.mean())
            out.scalars[f"{name}_std"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
        elif name in first.series:
            steps = first.series[name][0]
            out.series[name] = (steps, v.mean(0))
            if v.shape[0] > 1:
                out.series[f"{name}_std"] = (steps, v.std(0, ddof=1))
    derived = {f"{n}_std" for n in first.seed_arrays}
    for kind in ("scalars", "series", "arrays"):
        for key, value in getattr(first, kind).items():
            if key in first.seed_arrays or key in derived:
                continue
            if not all(_same(value, getattr(p, kind)[key]) for p in parts[1:]):
                raise ValueError(f"{kind[:-1]} {key!r} differs between seed chunks: it is pooled over "
                                 "seeds, so its probe needs a reduce (rankexp.probes.catalog.Probe)")
            getattr(out, kind)[key] = value
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal scalars, series ``(steps, values)`` or arrays, NaN equal to NaN."""
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def measure_seeds(build: Callable[[range], nn.Module], seeds: range, probes: Sequence[str],
                  chunk: int, options: dict | None = None,
                  context: ContextFactory | None = None) -> Measurement:
    """``probes`` on ``seeds`` in chunks of ``chunk``, networks from ``build(seed_range)``: the
    :class:`Measurement` one batch of all seeds gives."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} seeds: need at least 1")
    parts, ctx = [], None
    for start in range(0, len(seeds), chunk):
        part = seeds[start : start + chunk]
        if len(seeds) > chunk:
            log.debug("seeds %d…%d of %d", part[0], part[-1], len(seeds))
        ctx = None  # the previous chunk's network and intermediates go before the next is built
        model = build(part)
        m, ctx = probe_chunk(model, probes, options=options, context=context)
        parts.append(m)
        del model
    return _reduce(join_seeds(parts), probes, ctx)


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process on ``device`` in GB (CUDA: allocated tensors; CPU: peak RSS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def task_measure(s: RankexpConfig, device: torch.device, job_dir: Path, run: Any, chash: str) -> Measurement:
    """``task=measure``: ``task.probes`` on all seeds, plus :data:`RUN_FACTS`."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    context = None
    if family_of(s).inputs == CIFAR10:  # measured on CIFAR-10 itself, on the device before chunking
        from .data import dataset_for

        data = dataset_for(s, device, DTYPES[s.dtype.value])

        def context(net: CifarResNet) -> ImageProbeContext:
            return ImageProbeContext(net, data, s.task.options)

    chunk, line = chunking(s, str(device))
    seeds = range(s.seed, s.seed + s.seeds)
    (log.warning if "more than the budget" in line else log.debug)("%s", line)
    built = [0.0, 0.0]  # wall, CPU of the constructions
    draws: list[list[float]] = []  # each network's own drawing clock (a streamed one draws in its walks)
    streamed = streams_weights(s)

    def build(part: range) -> nn.Module:
        t, c = time.perf_counter(), time.process_time()
        model = build_model(s, device, seeds=part, streamed=streamed)
        built[0] += time.perf_counter() - t
        built[1] += time.process_time() - c
        if streamed:
            draws.append(model.draw_seconds)
        return model

    t0, c0 = time.perf_counter(), time.process_time()
    result = measure_seeds(build, seeds, s.task.probes, chunk, options=s.task.options,
                           context=context)
    for wall, cpu in draws:  # drawn inside the sweep: drawing, not measurement
        built[0] += wall
        built[1] += cpu
    result.scalars.update(
        measure_seconds=time.perf_counter() - t0 - built[0], build_seconds=built[0],
        measure_cpu_seconds=time.process_time() - c0 - built[1], build_cpu_seconds=built[1],
        peak_memory_gb=peak_memory_gb(device), seed_chunk=float(chunk))
    return result
