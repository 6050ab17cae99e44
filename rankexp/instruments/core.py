"""``rankexp.analyze``: the study's instruments on any PyTorch network, one row per block:
branch (Eq. 3/4), prefix ``∂h_l/∂h_0`` (Eq. 2/10) and representation (Figure 7/11), exact while a
dense stage fits, else matrix-free. Nothing is left on the model; the global RNG is untouched.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.func import jvp, vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from ..memory import free_memory_bytes
from ..probes.jacobian import BRANCH_NORMS, PARTIAL_SPECTRA, forward_sweep
from ..probes.representation import stack_spectrum
from .blocks import (
    BRANCH_MLP,
    BlockError,
    UnitBlock,
    eval_mode,
    hooked_units,
    is_hf,
    map_tensors,
    resolve,
)
from .families import FAMILIES, ensemble_inputs, family_units
from .matfree import DENSE, MatrixFree, Spectrum, dense_spectrum, slq_spectrum

log = logging.getLogger(__name__)

PROBES = ("branch", "prefix", "representation")
PROBE_ALIASES = {"branch_ratio": "branch", "branch_jacobian": "branch", "io_jacobian": "prefix",
                 "profile": "prefix", "stream": "representation"}
CLOSED_FORM = "closed_form"
FORWARD = "forward"
METHODS = ("auto", CLOSED_FORM, DENSE, "matrix_free")
#: dense working set per stage, in float64 numbers per D²
DENSE_WORDS = 5


class SizeError(ValueError):
    """A Jacobian (dense) or a Lanczos basis (matrix-free) that does not fit the memory bounds."""


@dataclass(frozen=True)
class BlockRecord:
    """One row of :func:`analyze`; ``prefix``: ``∂h_l/∂h_0`` at unit norm (scale ``log_gain``)."""

    index: int
    name: str
    member: int
    stage: int
    dim: int
    method: str
    label: str
    branch: Spectrum | None = None
    prefix: Spectrum | None = None
    log_gain: float = math.nan
    log_gain_err: float = math.nan
    representation: float | None = None
    rms: float | None = None
    rows: int = 0

    def row(self) -> dict:
        out = {"block": self.index, "name": self.name, "member": self.member, "stage": self.stage,
               "dim": self.dim, "method": self.method, "branch_kind": self.label}
        d = self.dim
        for key, s in (("branch", self.branch), ("prefix", self.prefix)):
            if s is None:
                continue
            out[f"{key}_erank"], out[f"{key}_erank_err"] = s.erank / d, s.erank_err / d
            out[f"{key}_stable_rank"], out[f"{key}_stable_rank_err"] = s.stable_rank, s.stable_rank_err
        if self.branch is not None:
            out["branch_ratio"], out["branch_ratio_err"] = self.branch.ratio, self.branch.ratio_err
        if self.prefix is not None:
            out["prefix_log_gain"], out["prefix_log_gain_err"] = self.log_gain, self.log_gain_err
        if self.representation is not None:
            out["representation_erank"], out["rms"], out["rows"] = self.representation, self.rms, self.rows
        return out


def resolve_probes(probes: Iterable[str] | str | None) -> frozenset[str]:
    """``probes`` as a set of :data:`PROBES` (aliases of :data:`PROBE_ALIASES` mapped).
    Raises ValueError: an unknown name, or none."""
    if probes is None:
        return frozenset(PROBES)
    names = [probes] if isinstance(probes, str) else list(probes)
    unknown = [p for p in names if p not in PROBES and p not in PROBE_ALIASES]
    if unknown:
        raise ValueError(f"probes: unknown {unknown}; allowed {list(PROBES)} "
                         f"(or the study's names {sorted(PROBE_ALIASES)})")
    if not names:
        raise ValueError(f"probes=[]: ask for at least one of {list(PROBES)}")
    return frozenset(PROBE_ALIASES.get(p, p) for p in names)


def working_bytes(fn: Callable[[Tensor], Tensor], x: Tensor, exclude: set[int]) -> int:
    """Bytes one evaluation of ``fn`` at ``x`` saves for backward (storages in ``exclude`` not counted) plus its output."""
    seen: set[int] = set()
    total = 0

    def pack(t):
        nonlocal total
        st = t.untyped_storage()
        if st.data_ptr() not in exclude and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x.detach().requires_grad_())
    return total + y.numel() * y.element_size()


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def dense_jacobian(fn: Callable[[Tensor], Tensor], x: Tensor, chunk: int | None = None) -> Tensor:
    """``∂fn/∂x`` at ``x`` ``(D,)`` → ``(D_out, D)``: ``vmap`` of ``jvp``, ``chunk`` basis vectors
    at a time."""
    eye = torch.eye(x.numel(), dtype=x.dtype, device=x.device)
    cols = vmap(lambda v: jvp(fn, (x,), (v,))[1], chunk_size=chunk)(eye)
    return cols.T


def linear_maps(fn: Callable[[Tensor], Tensor], x: Tensor, *, keep: bool = True
                ) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """``(v ↦ J v, u ↦ Jᵀ u)`` for ``J = ∂fn/∂x`` at ``x``; ``keep``: the pullback is kept (and
    ``J v`` is its double backward where supported), else recomputed."""
    if keep:
        y, pull = vjp(fn, x)
        try:
            _, push = vjp(lambda u: pull(u)[0], torch.zeros_like(y))
            push(y)  # fails here for an op without a double backward
            return (lambda v: push(v)[0]), (lambda u: pull(u)[0])
        except (RuntimeError, NotImplementedError) as e:  # pragma: no cover — op-dependent
            log.debug("no double backward (%s): J v by jvp", e)
            return (lambda v: jvp(fn, (x,), (v,))[1]), (lambda u: pull(u)[0])
    return (lambda v: jvp(fn, (x,), (v,))[1]), (lambda u: vjp(fn, x)[1](u)[0])


def gram_operator(fn: Callable[[Tensor], Tensor], x: Tensor, *, minus_identity: bool = False,
                  chunk: int | None = None, keep: bool = True) -> Callable[[Tensor], Tensor]:
    """``V ↦ Jᵀ J V`` row-wise for ``J = ∂fn/∂x`` (minus I when ``minus_identity``), ``chunk``
    vectors at a time; ``keep`` as :func:`linear_maps`."""
    j, jt = linear_maps(fn, x, keep=keep)

    def gram(v: Tensor) -> Tensor:
        jv = vmap(j, chunk_size=chunk)(v)
        if minus_identity:
            jv = jv - v
        out = vmap(jt, chunk_size=chunk)(jv)
        return out - jv if minus_identity else out
    return gram


def _compose(steps: Sequence[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    return lambda v: functools.reduce(lambda a, f: f(a), steps, v)


def _unit_scale(s: Spectrum) -> Spectrum:
    f = s.frobenius_sq
    return replace(s, frobenius_sq=1.0, frobenius_sq_err=s.frobenius_sq_err / f,
                   top_sq=s.top_sq / f, top_sq_err=s.top_sq_err / f)


@dataclass(frozen=True)
class _Plan:
    probes: frozenset[str]
    method: str
    settings: MatrixFree
    max_dense_bytes: float
    budget: float
    exclude: frozenset[int]


def _chains(units: Sequence[UnitBlock]) -> list[list[UnitBlock]]:
    out: list[list[UnitBlock]] = []
    for u in units:
        if out and (out[-1][-1].member, out[-1][-1].stage) == (u.member, u.stage):
            out[-1].append(u)
        else:
            out.append([u])
    return out


def _method(plan: _Plan, chain: Sequence[UnitBlock]) -> str:
    """``dense`` or ``matrix_free`` for a chain. Raises SizeError: the asked method does not fit."""
    u, d = chain[0], chain[0].dim
    dense = DENSE_WORDS * d * d * 8
    fits = dense <= min(plan.max_dense_bytes, plan.budget)
    if plan.method in (DENSE, CLOSED_FORM) or (plan.method == "auto" and fits):
        if not fits:
            raise SizeError(f"block {u.name!r}: dense D×D Jacobians with D = {d:,} need ≈ {_gib(dense)}, "
                            f"above the bound {_gib(min(plan.max_dense_bytes, plan.budget))} "
                            "(max_dense_bytes, max_bytes); use method='matrix_free' (estimates with "
                            "errors) or raise max_dense_bytes")
        return DENSE
    basis = plan.settings.basis_bytes(d, u.x.element_size())
    if basis > plan.budget:
        raise SizeError(f"block {u.name!r}: the Lanczos basis for D = {d:,} needs {_gib(basis)} "
                        f"(MatrixFree.vectors × steps × D), above max_bytes = {_gib(plan.budget)}; "
                        "lower MatrixFree(vectors=…, steps=…) or raise max_bytes")
    return "matrix_free"


def _chunk(plan: _Plan, reserved: float, per_vector: float, most: int) -> int:
    return int(max(1, min(most, (plan.budget - reserved) // max(per_vector, 1.0))))


def _record(u: UnitBlock, method: str, **kw) -> BlockRecord:
    rep = {"representation": u.representation, "rms": u.rms, "rows": u.rows}
    return BlockRecord(index=u.index, name=u.name, member=u.member, stage=u.stage, dim=u.dim,
                       method=method, label=u.label, **kw, **rep)


def _branch_fn(u: UnitBlock) -> tuple[Callable[[Tensor], Tensor], Tensor, bool]:
    if u.branch is not None:
        return u.branch, u.branch_x, False
    return u.step, u.x, u.residual


def _dense_chain(chain: Sequence[UnitBlock], plan: _Plan, bar) -> list[BlockRecord]:
    d = chain[0].dim
    x0 = chain[0].x
    per = 2 * max(working_bytes(u.step, u.x, plan.exclude) for u in chain) + 2 * d * x0.element_size()
    chunk = _chunk(plan, DENSE_WORDS * d * d * 8, per, d)
    eye = torch.eye(d, dtype=x0.dtype, device=x0.device)
    unit, gain, out = eye / math.sqrt(d), 0.5 * math.log(d), []
    for u in chain:
        kw = {}
        need_step = "prefix" in plan.probes or ("branch" in plan.probes and u.branch is None)
        j = dense_jacobian(u.step, u.x, chunk) if need_step else None
        if "branch" in plan.probes:
            fn, at, minus = _branch_fn(u)
            jf = (j - eye if minus else j) if u.branch is None else dense_jacobian(fn, at, chunk)
            kw["branch"] = dense_spectrum(jf)
        if "prefix" in plan.probes:
            unit = j @ unit
            norm = torch.linalg.matrix_norm(unit)
            unit = unit / norm
            gain += math.log(float(norm))
            kw.update(prefix=dense_spectrum(unit), log_gain=gain, log_gain_err=0.0)
        out.append(_record(u, DENSE, **kw))
        bar.update()
    return out


def _matfree_chain(chain: Sequence[UnitBlock], plan: _Plan, bar) -> list[BlockRecord]:
    """Matrix-free records of one chain; an operator keeps its graph when 3× it fits."""
    d, x0, s = chain[0].dim, chain[0].x, plan.settings
    itemsize = x0.element_size()
    basis = s.basis_bytes(d, itemsize)
    work = [working_bytes(u.step, u.x, plan.exclude) for u in chain]
    kw_slq = {"dim": d, "settings": s, "dtype": x0.dtype, "device": x0.device}

    def gram(fn, at, w, minus=False):
        keep = 3 * w <= plan.budget - basis
        chunk = _chunk(plan, basis + (3 * w if keep else 0), 2 * w + 4 * d * itemsize, s.vectors)
        return gram_operator(fn, at, minus_identity=minus, chunk=chunk, keep=keep)

    out = []
    for i, u in enumerate(chain):
        kw = {}
        seed = 2 * (u.member * 100_003 + u.index)
        if "branch" in plan.probes:
            fn, at, minus = _branch_fn(u)
            kw["branch"] = slq_spectrum(gram(fn, at, working_bytes(fn, at, plan.exclude), minus),
                                        seed_offset=seed, **kw_slq)
        if "prefix" in plan.probes:
            spec = slq_spectrum(gram(_compose([w.step for w in chain[: i + 1]]), x0, sum(work[: i + 1])),
                                seed_offset=seed + 1, **kw_slq)
            kw.update(prefix=_unit_scale(spec), log_gain=0.5 * math.log(spec.frobenius_sq),
                      log_gain_err=spec.frobenius_sq_err / (2 * spec.frobenius_sq))
        out.append(_record(u, "matrix_free", **kw))
        bar.update()
    return out


def _closed_form_fits(model: nn.Module, plan: _Plan) -> bool:
    d, itemsize = model.width, next(model.parameters()).element_size()
    engine = (max(model.skip_every, 1) + 6 + DENSE_WORDS) * d * d * max(itemsize, 8) * model.members
    return DENSE_WORDS * d * d * 8 <= plan.max_dense_bytes and engine <= plan.budget


def _closed_form_records(model: nn.Module, inputs, plan: _Plan, point: int, bar) -> list[BlockRecord]:
    h, h0 = ensemble_inputs(model, inputs, point)
    members, depth, d = model.members, model.depth, model.width
    branch: list[list[Spectrum | None]] = [[None] * depth for _ in range(members)]

    def on_layer(lj) -> None:
        jb = lj.branch
        for e in range(members):
            branch[e][lj.layer - 1] = dense_spectrum(jb[e])
        bar.update(members)

    take_branch = "branch" in plan.probes
    needs = ({PARTIAL_SPECTRA} if "prefix" in plan.probes else set()) | (
        {BRANCH_NORMS} if take_branch else set())
    sw = forward_sweep(model, h0, needs=needs, on_layer=on_layer if take_branch else None
                       ) if needs else None
    rep = {}
    if "representation" in plan.probes:
        for l, hl in model.states(h):
            rep[l] = (stack_spectrum(hl)[0], hl.square().mean((-2, -1)).sqrt())
    out = []
    for e in range(members):
        for l, block in enumerate(model.blocks, start=1):
            kw = {}
            if take_branch:
                kw["branch"] = branch[e][l - 1]
            if "prefix" in plan.probes:
                er, sr = float(sw.erank[e, l - 1]), float(sw.stable_rank[e, l - 1])
                kw.update(prefix=Spectrum(dim=d, frobenius_sq=1.0, top_sq=1.0 / sr, erank=er,
                                          stable_rank=sr, method=CLOSED_FORM),
                          log_gain=float(sw.log_gain[e, l - 1]), log_gain_err=0.0)
            if rep:
                kw.update(representation=float(rep[l][0][e]), rms=float(rep[l][1][e]), rows=h.shape[1])
            label = BRANCH_MLP if block.has_skip else "block(h)"
            out.append(BlockRecord(index=l, name=f"blocks.{l - 1}", member=e, stage=1, dim=d,
                                   method=CLOSED_FORM if sw is not None else FORWARD, label=label, **kw))
    return out


def _units(model: nn.Module, inputs, blocks, point: int, position: int | None,
           representation: bool) -> list[UnitBlock]:
    if isinstance(model, FAMILIES):
        if blocks is not None:
            raise BlockError(f"blocks=: a {type(model).__name__} (rankexp's family) chooses its own "
                             "blocks; blocks= is for other networks")
        return family_units(model, inputs, point=point, position=position,
                            representation=representation)
    specs = resolve(model, blocks)
    if position is None and is_hf(model):
        position = -1
    p = next(model.parameters(), None)
    if p is not None:
        inputs = map_tensors(inputs, lambda t: t.to(
            device=p.device, dtype=p.dtype if t.is_floating_point() else None))
    return hooked_units(model, inputs, specs, point=point, position=position,
                        representation=representation)


def block_records(model: nn.Module, inputs, blocks=None, *, probes: Iterable[str] | str | None = None,
                  method: str = "auto", point: int = 0, position: int | None = None,
                  matrix_free: MatrixFree | None = None, max_dense_bytes: float = 2**30,
                  max_bytes: float | None = None, progress: bool | None = None) -> list[BlockRecord]:
    """The instruments as :class:`BlockRecord` s (what :func:`analyze` tabulates); arguments as :func:`analyze`."""
    wanted = resolve_probes(probes)
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd module: its original
    if method not in METHODS:
        raise ValueError(f"method={method!r}: allowed {', '.join(METHODS)}")
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    plan = _Plan(wanted, method, matrix_free or MatrixFree(), float(max_dense_bytes),
                 float(max_bytes) if max_bytes is not None else 0.5 * free_memory_bytes(str(device)),
                 frozenset(t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())))
    from ..models.mlp import ResidualMLP

    bar_kw = {"desc": "analyze", "unit": "block", "leave": False,
              "disable": None if progress is None else not progress}
    # the math SDPA kernel: the fused ones have no forward-mode derivative
    with torch.no_grad(), eval_mode(model), sdpa_kernel([SDPBackend.MATH]):
        if isinstance(model, ResidualMLP) and method in ("auto", CLOSED_FORM) and (
                method == CLOSED_FORM or _closed_form_fits(model, plan)):
            with tqdm(total=model.depth * model.members, **bar_kw) as bar:
                return _closed_form_records(model, inputs, plan, point, bar)
        if method == CLOSED_FORM:
            raise ValueError(f"method='closed_form' is the engine's, for rankexp's ResidualMLP; a "
                             f"{type(model).__name__} takes 'auto', 'dense' or 'matrix_free'")
        units = _units(model, inputs, blocks, point, position, "representation" in wanted)
        if not wanted & {"branch", "prefix"}:
            return [_record(u, FORWARD) for u in units]
        records = []
        with tqdm(total=len(units), **bar_kw) as bar:
            for chain in _chains(units):
                m = _method(plan, chain)
                log.info("analyze: %d block(s) of D = %d, %s", len(chain), chain[0].dim, m)
                records += (_dense_chain if m == DENSE else _matfree_chain)(chain, plan, bar)
    return records


def analyze(model: nn.Module, inputs=None, blocks=None, *, probes: Iterable[str] | str | None = None,
            method: str = "auto", point: int = 0, position: int | None = None,
            matrix_free: MatrixFree | None = None, max_dense_bytes: float = 2**30,
            max_bytes: float | None = None, progress: bool | None = None):
    """The study's instruments on any network: a pandas DataFrame, one row per block (and member).

    Args:
        inputs: a tensor, a tuple of positional or a mapping of keyword arguments (HF LM: token
            ids ``(B, T)``; rankexp's MLP: ``(E, n, d)``, ``(n, d)`` or an int n; a ``CausalLM``:
            ``None`` for its prompt); floats cast to the model's dtype and device.
        blocks: ``None`` (found), or module names, modules or ``BlockSpec`` s.
        probes: any of ``branch``, ``prefix``, ``representation`` (default all) or study names.
        method: ``auto``, ``closed_form`` (ResidualMLP only), ``dense`` or ``matrix_free``.
        point: the input (batch index) the Jacobians are taken at.
        position: the token of a token model (HF LMs: default −1, the last).
        max_dense_bytes: a stage is dense when 5·D² float64 numbers fit (default 1 GiB).
        max_bytes: memory budget of any path (default half the device's free memory).
        progress: tqdm bar over blocks (``None``: only on a terminal).

    Returns:
        columns ``block`` (1-based), ``name``, ``member``, ``stage``, ``dim`` (D), ``method``,
        ``branch_kind``; ``branch_erank`` (Eq. 3), ``branch_stable_rank``, ``branch_ratio``
        (Eq. 4); ``prefix_erank`` (Eq. 2/10), ``prefix_stable_rank``, ``prefix_log_gain``; each
        with ``*_err`` (one standard error, 0 where exact); ``representation_erank``, ``rms``,
        ``rows``. ``frame.attrs`` records point, position, probes and matrix-free settings.

    Raises:
        BlockError: no blocks found, or a block not shape-preserving or not called once.
        SizeError: the working set does not fit the bounds (says which knob to turn).
        ValueError: unknown probes or method, inputs of the wrong shape.
    """
    import pandas as pd

    settings = matrix_free or MatrixFree()
    records = block_records(model, inputs, blocks, probes=probes, method=method, point=point,
                            position=position, matrix_free=settings, max_dense_bytes=max_dense_bytes,
                            max_bytes=max_bytes, progress=progress)
    frame = pd.DataFrame([r.row() for r in records])
    frame.attrs.update(model=type(model).__name__, point=point, position=position,
                       probes=sorted(resolve_probes(probes)), vectors=settings.vectors,
                       max_steps=settings.steps, seed=settings.seed)
    return frame
