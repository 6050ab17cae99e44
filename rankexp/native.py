"""The ziggurat compiled once per machine (``rankexp/_ziggurat.c``), loaded with ctypes.

The weights of a fresh job are tens of millions of Gaussian draws; in torch's elementwise ops
each costs ≈ 11 ns (twenty passes over int64 temporaries) and the ≈ 1.5 % that take the slow
path ≈ 130 ns, in one compiled pass ≈ 2 ns all told (measured, 1 thread).  The C source gives
the same numbers as :func:`rankexp.seeding.normal_many_`'s torch path bit for bit, slow path
included (tested), so whether it is used changes the time, never a weight.

The library is built on first use with the system C compiler (``$CC``, else ``cc``) into
``$XDG_CACHE_HOME/rankexp/native/`` (default ``~/.cache``), keyed by the source's hash, and
renamed into place atomically, so concurrent first jobs each succeed.  ``make setup`` builds it.
Without a compiler, or with ``RANKEXP_NATIVE=0``, :func:`ziggurat` returns None and the torch
path runs (the same numbers, slower).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from functools import cache
from pathlib import Path

from .locations import atomic_path, user_cache

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("_ziggurat.c")
#: flags of the build: IEEE arithmetic as torch's (no -ffast-math, no FMA contraction)
CFLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off", "-std=c99")


def cache_dir() -> Path:
    """Where the compiled library lives: ``$XDG_CACHE_HOME/rankexp/native`` (``~/.cache``)."""
    return user_cache("native")


def library_path() -> Path:
    """The library's path for this source, compiler flags and machine (it may not exist yet)."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()
                         + platform.machine().encode()).hexdigest()[:16]
    return cache_dir() / f"ziggurat-{key}.so"


def build(path: Path | None = None) -> Path:
    """Compile :data:`SOURCE` to ``path`` (default :func:`library_path`), atomically.

    Raises:
        RuntimeError: no C compiler, or it failed (its message attached).
    """
    path = path or library_path()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("no C compiler (cc, gcc or $CC) for the ziggurat's fast path")
    with atomic_path(path) as tmp:  # another process may win the race: same bytes, either is fine
        try:
            done = subprocess.run([compiler, *CFLAGS, "-o", tmp, str(SOURCE), "-lm"],
                                  capture_output=True, text=True)
        except OSError as err:
            raise RuntimeError(f"cannot run the C compiler {compiler}: {err}") from err
        if done.returncode:
            raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {done.stderr.strip()}")
    return path


class Ziggurat:
    """The two kernels of the library, float64 and float32 (``rankexp_ziggurat_f64/_f32``)."""

    def __init__(self, lib: ctypes.CDLL):
        from .seeding import EXP_COEFFS, EXP_DOMAIN, LOG_COEFFS, slow_path_constants

        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self.kernels = {}
        for name in ("f64", "f32"):
            fn = getattr(lib, f"rankexp_ziggurat_{name}")
            fn.restype = i64
            fn.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ptr, ptr, ctypes.c_double, ptr]
            self.kernels[name] = fn
        self.columns_kernels = {}
        for name in ("f64", "f32"):
            fn = getattr(lib, f"rankexp_ziggurat_cols_{name}")
            fn.restype = i64
            fn.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, ptr, ptr, ptr, ctypes.c_double, ptr,
                           ptr, ptr]
            self.columns_kernels[name] = fn
        lib.rankexp_ziggurat_layout.restype = i64
        lib.rankexp_ziggurat_layout.argtypes = [i64]
        layout = tuple(int(lib.rankexp_ziggurat_layout(i)) for i in range(3))
        if layout != (len(EXP_COEFFS), len(LOG_COEFFS), EXP_DOMAIN):
            raise RuntimeError(f"{SOURCE.name} reads {layout} constants, rankexp.seeding has "
                               f"{(len(EXP_COEFFS), len(LOG_COEFFS), EXP_DOMAIN)}")
        values = slow_path_constants()
        #: the slow path's constants as the kernels read them (:func:`rankexp.seeding.slow_path_constants`)
        self.constants = (ctypes.c_double * len(values))(*values)

    def normal(self, flat, keys, offset: int, w, k, w64, f64, scale: float) -> int:
        """Fill ``flat`` ``(E, n)`` (contiguous float64/float32 CPU tensor) with the draws of
        counters ``offset …`` of each member's stream ``keys`` ``(E,)`` int64 — the fast path
        with the layer table ``w`` ``(256,)`` in ``flat``'s dtype (scaled) and thresholds ``k``
        ``(256,)`` int64, the slow path with the unscaled float64 tables ``w64``, ``f64`` and
        ``scale`` — the same numbers as the torch path; returns how many took the slow path."""
        import torch

        e, n = flat.shape
        kernel = self.kernels["f64" if flat.dtype == torch.float64 else "f32"]
        held, args = self._tables(offset, keys, w, k, w64, f64, scale)
        return int(kernel(flat.data_ptr(), e, n, *args))

    def _tables(self, offset, keys, w, k, w64, f64, scale) -> tuple[list, tuple]:
        """The arguments both kernels share, from ``keys`` on, and the contiguous tensors their
        pointers point into (the caller holds them until the kernel returns)."""
        held = [v.contiguous() for v in (keys.reshape(-1), w, k, w64, f64)]
        keys, w, k, w64, f64 = (v.data_ptr() for v in held)
        return held, (keys, offset, w, k, w64, f64, float(scale), ctypes.addressof(self.constants))

    def columns(self, out, keys, offset: int, w, k, w64, f64, scale: float, idx, starts) -> int:
        """Draw only the columns ``idx[starts[e]:starts[e+1]]`` (int64, CPU) of every row of
        member e's matrix ``out[e]`` ``(rows, cols)`` (contiguous float64/float32): element
        (i, a) is counter ``offset + i·cols + a``, the number a whole draw puts there; the other
        columns are left as they are.  Tables as :meth:`normal`; returns the slow-path count."""
        import torch

        e, rows, cols = out.shape
        kernel = self.columns_kernels["f64" if out.dtype == torch.float64 else "f32"]
        idx, starts = idx.contiguous(), starts.contiguous()
        held, args = self._tables(offset, keys, w, k, w64, f64, scale)
        return int(kernel(out.data_ptr(), e, rows, cols, *args, idx.data_ptr(), starts.data_ptr()))


@cache
def ziggurat() -> Ziggurat | None:
    """The compiled fast path, built on first use; None where it cannot be (no compiler, a
    failed build, ``RANKEXP_NATIVE=0``), then the torch path runs."""
    if os.environ.get("RANKEXP_NATIVE", "1") == "0":
        return None
    path = library_path()
    try:
        if not path.exists():
            build(path)
        return Ziggurat(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError) as err:
        log.debug("the ziggurat's compiled fast path is unavailable (%s); torch's ops draw", err)
        return None


if __name__ == "__main__":  # `python -m rankexp.native`: build it now (make setup)
    z = ziggurat()
    print(f"compiled ziggurat: {library_path() if z else 'unavailable (torch path)'}")
