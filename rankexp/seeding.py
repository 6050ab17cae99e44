"""Independent random streams per seed, shared by every model family and task.

Member ``e`` of an ensemble with seed ``s`` draws from the same streams a one-member model with
seed ``s`` draws from, so batching seeds never changes a number.

**Weights** (:func:`normal_`, :func:`uniform_`) come from a counter-based generator, so they are
drawn where they live — in the network's dtype, on its device, all seeds and all matrices of a
shape at once — and number ``n`` of a seed's stream is the same whichever chunk, batch or device
draws it:

* *bits*: number ``n`` of stream ``(seed, stream)`` is the ``(n+1)``-th output of SplitMix64
  (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators") seeded with the
  64-bit key :func:`stream_key` (NumPy's ``SeedSequence`` of ``[seed, stream]``):
  ``z = mix64(key + (n+1)·γ)``, γ = 0x9E3779B97F4A7C15 — integer arithmetic, the same bits on
  every device (:func:`splitmix64`, tested against a pure-Python reference);
* *Gaussian*: Marsaglia & Tsang's ziggurat (2000, "The ziggurat method for generating random
  variables") with 256 layers: layer ``i = z & 255`` and the signed 53-bit ``j = z >> 11`` are
  independent bits of ``z`` (Doornik 2005's fix of the original's correlation); ``x = j·w_i`` is
  accepted when ``|j| < k_i`` (98.5 % of draws: one multiply), the rest go through the exact
  wedge and tail tests (``nfix``) with fresh uniforms from counters ``n + t·2⁴⁸`` (t = 1, 2, …)
  of the same stream, their exp and log :func:`exact_exp` and :func:`exact_log` (IEEE-exact
  steps: a draw is one function of its counter, whatever batch, chunk or kernel takes it; with
  torch's own exp/log the last bit of a tail draw depended on its place in the batch).  A scale
  σ (the init's α/√fan_in) enters the table, ``x = j·(σ w_i)``; float32 weights are
  ``float32(j)·float32(σ w_i)`` (three roundings: within 3·2⁻²⁴ of the float64 weight).

On the CPU the whole draw, slow path included, runs compiled (:mod:`rankexp.native`, one pass
at ≈ 1.7–2 ns a draw against ≈ 11 ns in torch's ops) where a C compiler is present; it gives the
same numbers bit for bit (tested), and the torch path runs without one.  :class:`MatrixDraws`
draws a network's blocks one at a time (a streamed network) and, compiled, only some columns
of a matrix.  Since issue 18 the tail draws use :func:`exact_log` instead of torch's log: of the
50.3 M weights of a d = 256, L = 96 network, 115 changed, each by 1 ulp.

Inputs and the other small draws use :func:`seeded_generator` (torch's CPU generator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache, lru_cache

import numpy as np
import torch
from torch import Tensor

from . import native

#: Independent random streams derived from one seed (see :func:`seeded_generator`).
STREAM_WEIGHTS, STREAM_INPUT, STREAM_HEAD, STREAM_DATA = 0, 1, 2, 3


def seeded_generator(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for one independent random stream of one seed.

    Streams (:data:`STREAM_WEIGHTS`, :data:`STREAM_INPUT`, …) are derived with
    NumPy's ``SeedSequence`` so the weights of seed 1 never share bits with the
    input of seed 0.
    """
    return torch.Generator().manual_seed(stream_key(seed, stream) & 0x7FFF_FFFF_FFFF_FFFF)


def gaussian_input(
    seeds: Sequence[int], width: int, batch: int = 1, *, dtype=torch.float64, device="cpu"
) -> Tensor:
    """Standard Gaussian inputs ``h_0``, shape ``(E, batch, width)``, one draw per seed.

    ``E[h_0²] = 1`` per coordinate, so ``rms(h_0) ≈ 1`` as the study assumes.
    """
    rows = [
        torch.randn(batch, width, generator=seeded_generator(s, STREAM_INPUT), dtype=torch.float64)
        for s in seeds
    ]
    return torch.stack(rows).to(device=device, dtype=dtype)


def subset_indices(total: int, n: int, seed: int = 0) -> Tensor | None:
    """A fixed random subset of ``n`` of ``range(total)`` (int64 ``(n,)``, CPU), drawn from
    ``seeded_generator(seed, STREAM_INPUT)``; None when ``n ≥ total`` (take them all, in order).
    Data sets stored sorted by class need this rather than their first ``n`` items."""
    if n >= total:
        return None
    return torch.randperm(int(total), generator=seeded_generator(seed, STREAM_INPUT))[: int(n)]


# --------------------------------------------------------------------------- counter-based bits
_MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (the golden ratio · 2⁶⁴)
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
#: numbers per stream and seed; the fallback's fresh uniforms sit at ``n + t·2⁴⁸``
COUNTER_SPAN = 1 << 48


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 torch stores."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


@lru_cache(maxsize=1 << 14)
def stream_key(seed: int, stream: int) -> int:
    """The 64-bit key (unsigned) of stream ``stream`` of seed ``seed``: NumPy's
    ``SeedSequence([seed, stream])``, so no two (seed, stream) pairs share a key (cached: a
    streamed network asks once per block)."""
    return int(np.random.SeedSequence([int(seed), int(stream)]).generate_state(1, np.uint64)[0])


def splitmix64_reference(key: int, n: int) -> int:
    """Number ``n`` of the stream with ``key`` in plain Python integers (the specification
    :func:`splitmix64` is tested against)."""
    z = (key + (n + 1) * GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _mix_(z: Tensor, tmp: Tensor) -> Tensor:
    """SplitMix64's finalizer in place on int64 (wrapping multiplies; ``>>`` is arithmetic in
    torch, so each shift is masked to the logical one)."""
    for shift, mult in ((30, _MIX1), (27, _MIX2)):
        torch.bitwise_right_shift(z, shift, out=tmp).bitwise_and_((1 << (64 - shift)) - 1)
        z.bitwise_xor_(tmp).mul_(_signed(mult))
    torch.bitwise_right_shift(z, 31, out=tmp).bitwise_and_((1 << 33) - 1)
    return z.bitwise_xor_(tmp)


def splitmix64(keys: Tensor, counters: Tensor) -> Tensor:
    """Numbers ``counters`` of the streams ``keys`` as int64 bit patterns (broadcast).

    Args:
        keys: int64 keys (the bits of :func:`stream_key`).
        counters: int64 positions ``n ≥ 0`` in the streams.
    """
    z = torch.add(keys, (counters + 1).mul_(_signed(GAMMA)))
    return _mix_(z, torch.empty_like(z))


# --------------------------------------------------------------------------- ziggurat
ZIGGURAT_LAYERS = 256
#: right edge of the base layer (Marsaglia & Tsang 2000, 256 layers)
ZIGGURAT_R = 3.6541528853610088
_M1 = float(1 << 52)  # |j| < 2⁵²


@cache
def _ziggurat_tables() -> tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]]:
    """``(w, f, k)``: x = j·w_i, f_i = exp(−x_i²/2) at the layers' edges, and the integer
    thresholds of the fast accept (Marsaglia & Tsang's ``wn``, ``fn``, ``kn`` for |j| < 2⁵²).
    The layers have equal area v = r f(r) + ∫_r^∞ f; the top layer closes to 1e-13."""
    n, r = ZIGGURAT_LAYERS, ZIGGURAT_R
    f = [0.0] * n
    w = [0.0] * n
    k = [0] * n
    v = r * math.exp(-0.5 * r * r) + math.sqrt(math.pi / 2) * math.erfc(r / math.sqrt(2))
    dn = tn = r
    q = v / math.exp(-0.5 * dn * dn)
    k[0], k[1] = int(dn / q * _M1), 0
    w[0], w[n - 1] = q / _M1, dn / _M1
    f[0], f[n - 1] = 1.0, math.exp(-0.5 * dn * dn)
    for i in range(n - 2, 0, -1):
        dn = math.sqrt(-2.0 * math.log(v / dn + math.exp(-0.5 * dn * dn)))
        k[i + 1] = int(dn / tn * _M1)
        tn = dn
        f[i] = math.exp(-0.5 * dn * dn)
        w[i] = dn / _M1
    return tuple(w), tuple(f), tuple(k)


@lru_cache(maxsize=32)
def _tables_on(device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    w, f, k = _ziggurat_tables()
    return (torch.tensor(w, dtype=dtype, device=device),
            torch.tensor(w, dtype=torch.float64, device=device),
            torch.tensor(f, dtype=torch.float64, device=device),
            torch.tensor(k, dtype=torch.int64, device=device))


# ------------------------------------------------------------ exp and log of the slow path
# The slow path's exp and log, from IEEE-exact steps only (frexp, a power-of-two scale, +, ×, ÷,
# round-half-even): each operation rounds the same in torch's CPU and CUDA kernels, in C without
# FMA contraction (rankexp/_ziggurat.c reads these constants from :func:`slow_path_constants`)
# and in Python floats, so a draw is one function of its counter wherever it is taken.  torch's
# own exp/log differ in the last bit between its SIMD and scalar loops (and from CUDA's).
#: fdlibm's split of ln 2: ``LN2_HI`` has 21 trailing zero bits, so ``k·LN2_HI`` is exact for |k| < 2¹¹
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
INV_LN2, SQRT_HALF = 1.0 / math.log(2.0), math.sqrt(0.5)
#: exp: Taylor coefficients 1/n!, n = 0 … 13; |r| ≤ ln2/2 leaves < 1e-17
EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(14))
#: log: 1/(2n+1), n = 0 … 11, of atanh's series ln m = 2s Σ s^{2n}/(2n+1), s = (m−1)/(m+1)
LOG_COEFFS = tuple(1.0 / (2 * n + 1) for n in range(12))
#: the exponents k of :func:`exact_exp`'s domain y ∈ [−EXP_DOMAIN·ln 2, 0] (the wedge's is −r²/2 ≈ −6.7)
EXP_DOMAIN = 60


def slow_path_constants() -> tuple[float, ...]:
    """The slow path's constants in the order rankexp/_ziggurat.c reads them: r, √½, ln2 (hi,
    lo), 1/ln2, :data:`EXP_COEFFS`, :data:`LOG_COEFFS`."""
    return (ZIGGURAT_R, SQRT_HALF, LN2_HI, LN2_LO, INV_LN2, *EXP_COEFFS, *LOG_COEFFS)


def horner(x, coeffs: Sequence[float]):
    """``Σ coeffs[n]·xⁿ`` by Horner's rule, highest degree first (``p·x + c``: a multiply then an
    add, each rounded — the order rankexp/_ziggurat.c uses)."""
    p = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        p = p * x + c
    return p


def exact_exp(y: Tensor) -> Tensor:
    """``exp(y)`` for float64 ``y ∈ [−60 ln 2, 0]`` (≤ 1 ulp; tested against NumPy's) from
    IEEE-exact steps, the same bits on every device: ``y = k ln 2 + r`` (Cody–Waite,
    k = round(y/ln 2), half to even), a degree-13 Taylor polynomial of r, times 2^k."""
    k = torch.round(y * INV_LN2)
    r = (y - k * LN2_HI) - k * LN2_LO
    p = horner(r, EXP_COEFFS)
    return p * _powers_of_half(y.device).index_select(0, k.neg().to(torch.int64).clamp_(0, EXP_DOMAIN))


@lru_cache(maxsize=8)
def _powers_of_half(device: torch.device) -> Tensor:
    return torch.tensor([2.0**-i for i in range(EXP_DOMAIN + 1)], dtype=torch.float64, device=device)


def exact_log(u: Tensor) -> Tensor:
    """``ln u`` for normal float64 ``u > 0`` (≤ 3 ulp; tested against NumPy's) from IEEE-exact
    steps, the same bits on every device: ``u = m·2^e`` with m ∈ [√½, √2),
    ``ln m = 2s(1 + s²/3 + … + s²²/23)``, s = (m−1)/(m+1), plus ``e ln 2``."""
    m, e = torch.frexp(u)
    low = m < SQRT_HALF
    m = torch.where(low, m + m, m)
    e = (e - low.to(e.dtype)).to(torch.float64)
    f = m - 1.0
    s = f / (f + 2.0)
    q = horner(s * s, LOG_COEFFS)
    return e * LN2_HI + (e * LN2_LO + (s + s) * q)


def _uniform53(z: Tensor) -> Tensor:
    """Uniform in (0, 1) from the top 53 bits of ``z`` (never 0 or 1), float64."""
    return ((z >> 11) & ((1 << 53) - 1)).to(torch.float64).add_(0.5).mul_(2.0**-53)


def _nfix(keys: Tensor, counters: Tensor, layer: Tensor, j: Tensor) -> Tensor:
    """Marsaglia & Tsang's slow path for the draws the fast test rejected: the tail beyond r
    (layer 0; Marsaglia 1964) and the wedges, with fresh uniforms from counters
    ``n + t·2⁴⁸``; float64 values, one per rejected draw."""
    _, w64, f64, k64 = _tables_on(j.device, torch.float64)
    values = torch.empty(j.shape, dtype=torch.float64, device=j.device)
    pending = torch.arange(j.numel(), device=j.device)
    for t in range(1, COUNTER_SPAN // 2, 2):
        if pending.numel() == 0:
            return values
        u1 = _uniform53(splitmix64(keys, counters + t * COUNTER_SPAN))
        z2 = splitmix64(keys, counters + (t + 1) * COUNTER_SPAN)
        x = j.to(torch.float64) * w64.index_select(0, layer)
        tail = layer == 0
        # the tail beyond r: x = −ln(u1)/r, accepted when −2 ln(u2) > x² (Marsaglia 1964)
        xt = exact_log(u1).neg_().div_(ZIGGURAT_R)
        ok_tail = tail & (exact_log(_uniform53(z2)).mul_(-2.0) > xt * xt)
        # a wedge: accepted when a uniform height between f_i and f_{i−1} is below f(x)
        f_i, f_below = f64.index_select(0, layer), f64.index_select(0, (layer - 1).clamp_(min=0))
        ok_wedge = ~tail & (u1.mul_(f_below - f_i).add_(f_i) < exact_exp(-0.5 * x * x))
        # else a fresh draw (layer2, j2) from z2, accepted by the fast test or tried again
        layer2, j2 = z2 & (ZIGGURAT_LAYERS - 1), z2 >> 11
        ok_new = ~tail & ~ok_wedge & (j2.abs() < k64.index_select(0, layer2))
        value = torch.where(ok_tail, torch.sign(j.to(torch.float64)) * (ZIGGURAT_R + xt),
                            torch.where(ok_wedge, x, j2.to(torch.float64) * w64.index_select(0, layer2)))
        done = ok_tail | ok_wedge | ok_new
        values.index_put_((pending,), torch.where(done, value, values.index_select(0, pending)))
        again = torch.nonzero(~done).squeeze(1)  # a tail stays in the tail; a wedge goes on with z2
        layer = torch.where(tail, layer, layer2).index_select(0, again)
        j = torch.where(tail, j, j2).index_select(0, again)
        keys, counters, pending = (v.index_select(0, again) for v in (keys, counters, pending))
    raise RuntimeError("ziggurat: a draw was rejected 2⁴⁷ times (impossible for a sound generator)")


#: draws per chunk on the CPU: the chunk's int64 temporaries stay in cache
CPU_CHUNK = 1 << 16
#: draws per chunk on an accelerator (few, large kernels)
DEVICE_CHUNK = 1 << 24


def stream_keys(seeds: Sequence[int], stream: int, device: torch.device | str = "cpu") -> Tensor:
    """int64 keys ``(E,)`` of stream ``stream`` for each seed (:func:`stream_key`)."""
    return torch.tensor([_signed(stream_key(s, stream)) for s in seeds], dtype=torch.int64,
                        device=device)


def _flat(out: Tensor, e: int, offset: int, what: str) -> Tensor:
    if out.dim() < 1 or out.shape[0] != e or not out.is_contiguous():
        raise ValueError(f"{what}: out must be contiguous with {e} members first, got {tuple(out.shape)}")
    flat = out.view(e, -1)
    if offset < 0 or offset + flat.shape[1] > COUNTER_SPAN:
        raise ValueError(f"{what}: counters {offset}…{offset + flat.shape[1]} outside [0, 2⁴⁸)")
    return flat


def _fast_path(flat: Tensor, keys: Tensor, offset: int, scale: float) -> Tensor:
    """The ziggurat's fast accept for every element of ``flat`` ``(E, n)`` (chunks that stay in
    cache on the CPU); returns the flat indices of the draws the slow path must redo — none
    where the compiled library draws (it takes the slow path itself)."""
    e, n = flat.shape
    dev, dtype = flat.device, flat.dtype
    w_dt, w64, _, k64 = _tables_on(dev, dtype)
    if scale != 1.0:  # scaled in float64, rounded once
        w_dt = (w64 * scale).to(dtype)
    if dev.type == "cpu" and dtype in (torch.float64, torch.float32):
        compiled = native.ziggurat()
        if compiled is not None:  # the same numbers, slow path included, in one compiled pass
            compiled.normal(flat, keys, offset, w_dt, k64, w64, _tables_on(dev, torch.float64)[2], scale)
            return torch.empty(0, dtype=torch.int64)
    step = max(1, (CPU_CHUNK if dev.type == "cpu" else DEVICE_CHUNK) // e)
    c = min(step, n)
    ar = torch.arange(1, c + 1, dtype=torch.int64, device=dev).mul_(_signed(GAMMA))
    ints = [torch.empty(e * c, dtype=torch.int64, device=dev) for _ in range(4)]
    floats = [torch.empty(e * c, dtype=dtype, device=dev) for _ in range(2)]
    flags = torch.empty(e * c, dtype=torch.bool, device=dev)
    rejected = []
    for s in range(0, n, step):
        c = min(step, n - s)  # the last chunk may be shorter: contiguous (E, c) views of the buffers
        base = ar[:c]
        z, tmp, j, thresholds = (v[:e * c].view(e, c) for v in ints)
        scaled, jf = (v[:e * c].view(e, c) for v in floats)
        slow = flags[:e * c].view(e, c)
        torch.add(base, keys + _signed((offset + s) * GAMMA), out=z)  # numbers offset+s+1… (E, c)
        _mix_(z, tmp)
        layer = torch.bitwise_and(z, ZIGGURAT_LAYERS - 1, out=tmp).view(-1)
        torch.bitwise_right_shift(z, 11, out=j)
        torch.index_select(w_dt, 0, layer, out=scaled.view(-1))
        torch.mul(scaled, jf.copy_(j), out=flat[:, s:s + c])  # float × float: 2× float × int
        torch.index_select(k64, 0, layer, out=thresholds.view(-1))
        torch.ge(j.abs_(), thresholds, out=slow)
        if dev.type == "cpu":  # NumPy's flatnonzero: 5× torch.nonzero on a sparse mask
            hits = torch.from_numpy(np.flatnonzero(slow.numpy()))
        else:
            hits = torch.nonzero(slow.view(-1)).squeeze(1)
        if hits.numel():
            rejected.append(hits // c * n + s + hits % c)
    return torch.cat(rejected) if rejected else torch.empty(0, dtype=torch.int64, device=dev)


def draw_threads(cpu_targets: int) -> int:
    """Threads the CPU fast path runs on: torch's intra-op thread count (``OMP_NUM_THREADS``,
    ``torch.set_num_threads``; a joblib worker's share, :func:`rankexp.app.pin_threads`), at
    most one per matrix."""
    return max(1, min(torch.get_num_threads(), cpu_targets))


@contextmanager
def _one_torch_thread():
    """Torch ops single-threaded while worker threads each draw whole matrices: the fast path's
    ops are small (``CPU_CHUNK`` elements), and splitting each across OpenMP threads costs more
    than it gains — on a loaded machine 10× the CPU time, the threads spinning at every op's
    barrier (measured: 0.8 s CPU at 1 thread, 8–10 s at 2, load 8 on 2 cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _fast_paths(flats: Sequence[tuple[Tensor, int, float]],
                keys_by_device: dict[torch.device, Tensor]) -> list[Tensor]:
    """:func:`_fast_path` of every target (the rejected draws' flat indices, in order).  CPU
    targets are split over :func:`draw_threads` Python threads, matrix by matrix (torch's ops
    release the GIL); every draw is a function of its counter alone, so the numbers are the
    same whatever the threads (tested)."""
    def one(i: int) -> Tensor:
        flat, offset, scale = flats[i]
        return _fast_path(flat, keys_by_device[flat.device], offset, scale)

    cpu = [i for i, (flat, _, _) in enumerate(flats) if flat.device.type == "cpu"]
    threads = draw_threads(len(cpu))
    on_cpu = set(cpu)
    hits: dict[int, Tensor] = {i: one(i) for i in range(len(flats)) if i not in on_cpu}
    if threads == 1:
        hits.update((i, one(i)) for i in cpu)
    else:
        with _one_torch_thread(), ThreadPoolExecutor(threads) as pool:
            hits.update(zip(cpu, pool.map(one, cpu), strict=True))
    return [hits[i] for i in range(len(flats))]


@torch.no_grad()
def normal_many_(targets: Sequence[tuple[Tensor, int, float]], seeds: Sequence[int],
                 stream: int = STREAM_WEIGHTS) -> None:
    """Fill every ``(out, offset, scale)`` of ``targets`` with ``scale · N(0, 1)`` draws (see
    :func:`normal_`), the slow path of all of them in one batch: the way a network draws all its
    matrices at once.

    Raises:
        ValueError: as :func:`normal_`.
    """
    e = len(seeds)
    flats = [(_flat(out, e, offset, "normal_"), offset, scale) for out, offset, scale in targets]
    keys_by_device: dict[torch.device, Tensor] = {}
    for flat, _, _ in flats:
        if flat.device not in keys_by_device:
            keys_by_device[flat.device] = stream_keys(seeds, stream, flat.device)[:, None]
    hits = _fast_paths(flats, keys_by_device)
    slow = [(i, idx) for i, idx in enumerate(hits) if idx.numel()]
    for dev, keys in keys_by_device.items():
        mine = [(i, idx) for i, idx in slow if flats[i][0].device == dev]
        if not mine:
            continue
        member = torch.cat([idx // flats[i][0].shape[1] for i, idx in mine]).to(dev)
        counters = torch.cat([idx % flats[i][0].shape[1] + flats[i][1] for i, idx in mine]).to(dev)
        ks = keys[member, 0]
        values = torch.empty(ks.shape, dtype=torch.float64, device=dev)
        step = CPU_CHUNK if dev.type == "cpu" else DEVICE_CHUNK  # bounded temporaries
        for a in range(0, ks.numel(), step):
            z = splitmix64(ks[a:a + step], counters[a:a + step])
            values[a:a + step] = _nfix(ks[a:a + step], counters[a:a + step],
                                       z & (ZIGGURAT_LAYERS - 1), z >> 11)
        start = 0
        for i, idx in mine:
            flat, _, scale = flats[i]
            part = values[start:start + idx.numel()]
            start += idx.numel()
            flat.view(-1).index_put_((idx.to(dev),), (part * scale).to(flat.dtype))


class MatrixDraws:
    """Repeated draws of ``scale · N(0, 1)`` matrices from stream ``stream`` of ``seeds``, the
    same numbers as :func:`normal_` — the keys and the scaled tables made once, for a network
    that draws its blocks one at a time (:class:`rankexp.models.mlp.ResidualMLP`, ``streamed``).

    Args:
        seeds: one per member (the matrices' leading axis E).
        stream: the stream (default ``STREAM_WEIGHTS``).
        scale: σ of every matrix drawn.
        dtype, device: the matrices'.
    """

    def __init__(self, seeds: Sequence[int], stream: int, scale: float, dtype: torch.dtype,
                 device: torch.device | str):
        device = torch.device(device)
        self.seeds, self.stream, self.scale = [int(s) for s in seeds], int(stream), float(scale)
        self.keys = stream_keys(self.seeds, stream, device)
        w_dt, self.w64, self.f64, self.k64 = _tables_on(device, dtype)
        self.w = (self.w64 * scale).to(dtype) if scale != 1.0 else w_dt
        cpu = device.type == "cpu" and dtype in (torch.float64, torch.float32)
        self.compiled = native.ziggurat() if cpu else None

    @torch.no_grad()
    def full(self, out: Tensor, offset: int) -> None:
        """Fill ``out`` ``(E, …)`` with numbers ``offset …`` (as :func:`normal_`).

        Raises:
            ValueError: as :func:`normal_`.
        """
        flat = _flat(out, len(self.seeds), offset, "MatrixDraws.full")
        if self.compiled is None:
            normal_many_([(out, offset, self.scale)], self.seeds, self.stream)
        else:
            self.compiled.normal(flat, self.keys, offset, self.w, self.k64, self.w64, self.f64, self.scale)

    @torch.no_grad()
    def columns(self, out: Tensor, offset: int, columns: Sequence[Tensor]) -> bool:
        """Fill the columns ``columns[e]`` (int64 indices) of every row of ``out[e]``
        ``(E, rows, cols)`` with the numbers :meth:`full` puts there (element (i, a) is number
        ``offset + i·cols + a``), drawing only those where the compiled library runs; elsewhere
        every column is drawn.  Returns whether only the columns were: the others are then
        left as they were.

        Raises:
            ValueError: as :func:`normal_`; not one index tensor per member.
        """
        e = len(self.seeds)
        if out.dim() != 3 or len(columns) != e:
            raise ValueError(f"MatrixDraws.columns: out (E, rows, cols) and one column list per "
                             f"member, got {tuple(out.shape)} and {len(columns)} lists for {e} seeds")
        _flat(out, e, offset, "MatrixDraws.columns")
        if self.compiled is None:
            self.full(out, offset)
            return False
        idx = columns[0].to(torch.int64) if e == 1 else torch.cat([c.to(torch.int64) for c in columns])
        starts = torch.tensor([0, *np.cumsum([c.numel() for c in columns])], dtype=torch.int64)
        self.compiled.columns(out, self.keys, offset, self.w, self.k64, self.w64, self.f64,
                              self.scale, idx, starts)
        return True


def normal_(out: Tensor, seeds: Sequence[int], stream: int = STREAM_WEIGHTS, offset: int = 0,
            *, scale: float = 1.0) -> Tensor:
    """Fill ``out`` ``(E, ...)`` in place with ``scale · N(0, 1)`` draws: member e's element k
    (row-major) is number ``offset + k`` of stream ``(seeds[e], stream)`` (module docstring), in
    ``out``'s dtype on ``out``'s device.

    A draw is a pure function of (seed, stream, counter): member e equals a one-member draw with
    seed ``seeds[e]``, any split of the counters into calls gives the same numbers, and CPU and
    CUDA agree bit for bit except in the last bits of the ≈ 1.5 % that take the slow path.

    Raises:
        ValueError: ``out`` is not contiguous, has no member axis of ``len(seeds)``, or the
            counters run past :data:`COUNTER_SPAN`.
    """
    normal_many_([(out, offset, scale)], seeds, stream)
    return out


@torch.no_grad()
def uniform_(out: Tensor, seeds: Sequence[int], stream: int = STREAM_WEIGHTS, offset: int = 0,
             *, low: float = 0.0, high: float = 1.0) -> Tensor:
    """Fill ``out`` ``(E, ...)`` with ``U(low, high)`` draws: member e's element k is
    ``low + (high − low)·u`` with u the top 53 bits of number ``offset + k`` of stream
    ``(seeds[e], stream)`` (as :func:`normal_`; u ∈ (0, 1)).

    Raises:
        ValueError: as :func:`normal_`.
    """
    flat = _flat(out, len(seeds), offset, "uniform_")
    n = flat.shape[1]
    keys = stream_keys(seeds, stream, out.device)[:, None]
    counters = torch.arange(offset, offset + n, dtype=torch.int64, device=out.device)
    u = _uniform53(splitmix64(keys, counters))
    flat.copy_(u.mul_(high - low).add_(low))
    return out
