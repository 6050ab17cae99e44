"""Block Jacobians in closed form and the one forward sweep over all ``∂h_l/∂h_0``.

Block l adds ``∂h_l/∂h_0 = J_R · (∂h_{l−k}/∂h_0 + J_b · ∂h_{l−1}/∂h_0)`` (Eq. 2/10/18) with
``J_b = β J_B J_f J_P`` (Eq. 17), ``J_P``, ``J_B``, ``J_R`` Table 2's ``c (I − V Vᵀ)``, and
``J_f = W_down diag(σ′(z)) W_up`` (Eq. 9/25) over the active units of a masked σ; ``torch.func``
is the fallback (SwiGLU) and the test oracle. The running product is a unit-Frobenius matrix
plus its log-norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..models.activations import ACTIVATION_DERIVATIVES, MASKED
from ..models.mlp import Block, ResidualMLP
from ..models.norms import NORM_FNS, NormJacobian, norm_jacobian
from ..spectra import (
    erank_from_sv,
    gram_ranks,
    singular_values,
    spectral_ranks,
    stable_rank_from_sv,
)
from .catalog import BRANCH_NORMS, BRANCH_SUM, IO_JACOBIAN, PARTIAL_SPECTRA, SWEEP_NEEDS


def member_jacobian(fn: Callable[..., Tensor], x: Tensor, params: dict | None = None) -> Tensor:
    """Per-member Jacobian ``(E, d_out, d_in)`` by ``vmap`` of ``jacfwd`` of ``fn(params_e, x_e)``
    at ``x`` ``(E, 1, d_in)``; ``params``: tensors with leading member axis E.

    Raises:
        ValueError: ``x`` holds more than one point per member.
    """
    from torch.func import jacfwd, vmap  # imports torch._dynamo (seconds): only when needed

    if x.shape[1] != 1:
        raise ValueError(f"one input per member expected, got x of shape {tuple(x.shape)}")
    return vmap(jacfwd(fn, argnums=1))(params or {}, x[:, 0])


def branch_jacobian(block: Block, x: Tensor) -> Tensor:
    """``J_b = ∂[β B(f(P(x)))]/∂x`` by ``torch.func`` at ``x`` ``(E, 1, d)`` → ``(E, d, d)`` (Eq. 9/17)."""
    from torch.func import functional_call

    params = dict(block.named_parameters())
    return member_jacobian(
        lambda p, xe: functional_call(block, p, (xe,), {"part": "branch"}), x, params)


@dataclass
class BranchLinearization:
    """``J_b = β J_B · W_down[:, a] diag(g) W_up[a, :] · J_P`` in factored form (Eq. 9/17/25);
    ``down`` is ``None`` for M = 1, ``active`` lists the units with σ′ ≠ 0 of a masked activation.
    """

    scale: float
    pre: NormJacobian | None
    out: NormJacobian | None
    deriv: Tensor
    up: Tensor
    down: Tensor | None
    active: list[Tensor] | None = None

    def _finish_left(self, y: Tensor) -> Tensor:
        if self.out is not None:
            self.out.left_(y)
        return y.mul_(self.scale) if self.scale != 1.0 else y

    def dense(self) -> Tensor:
        """``J_b`` ``(E, d, d)``: one GEMM over the active units, then O(d²) norm corrections."""
        e, d = self.up.shape[0], self.up.shape[-1]
        if self.down is None:  # M = 1: diag(σ′) W costs O(d²) already
            jf = self.deriv[..., None] * self.up
        elif self.active is None:
            jf = torch.bmm(self.down * self.deriv[:, None, :], self.up)
        else:
            jf = self.up.new_empty(e, d, d)
            for i, a in enumerate(self.active):
                torch.mm(_columns(self.down[i], a), self.up[i].index_select(0, a), out=jf[i])
        if self.pre is not None:
            self.pre.right_(jf)
        return self._finish_left(jf)

    def apply(self, u: Tensor) -> Tensor:
        """``J_b u`` for ``u`` ``(E, d, n)`` without forming ``J_b`` (``4|a|dn`` FLOP for M = 2)."""
        t = self.pre.left(u) if self.pre is not None else u
        if self.active is None:
            z = self.deriv[..., None] * (self.up @ t)
            y = z if self.down is None else self.down @ z
        else:
            y = t.new_zeros(t.shape) if self.down is None else t.new_empty(t.shape)
            for i, a in enumerate(self.active):
                z = self.up[i].index_select(0, a) @ t[i]
                if self.down is None:
                    y[i].index_copy_(0, a, z)
                else:
                    torch.mm(_columns(self.down[i], a), z, out=y[i])
        return self._finish_left(y)

    def apply_is_cheaper(self) -> bool:
        """Whether ``apply(u)`` on a d×d ``u`` beats ``dense() @ u`` (M = 2: when |a| < d)."""
        if self.active is None:
            return self.down is not None and self.deriv.shape[-1] < self.up.shape[-1]
        return self.down is None or sum(map(len, self.active)) < len(self.active) * self.up.shape[-1]


def _columns(w: Tensor, index: Tensor) -> Tensor:
    """``w[:, index]`` (``gather`` is ~3× faster than ``index_select`` along dim 1 on CPU)."""
    return torch.gather(w, 1, index.expand(w.shape[0], -1))


#: ``linearize_branch(…, pre_op=OWN_PRE)``: the block's own P
OWN_PRE = "own"


def linearize_branch(block: Block, x: Tensor, *, pre_op: str | None = OWN_PRE,
                     masked: bool = True) -> tuple[Tensor, BranchLinearization | None]:
    """The scaled branch output ``β B(f(P(x)))`` ``(E, 1, d)`` and its closed-form linearization.

    Bit-for-bit the forward of :meth:`ResidualMLP.trajectory`. ``pre_op`` replaces P (``None``:
    identity; :func:`projection_split`). The linearization is ``None`` without a closed form.
    ``masked=False`` keeps inactive units as exact zeros (no data-dependent shapes, no host sync).
    """
    if not hasattr(block, "f_parts"):  # a layer of another family (model=plain): torch.func
        if pre_op != OWN_PRE:
            raise ValueError(f"pre_op={pre_op!r}: a {type(block).__name__} has no P to replace")
        return block(x, part="branch"), None
    if pre_op == OWN_PRE:
        pre_op, xp = block.pre_op, block.pre_norm(x)
    else:
        xp = NORM_FNS[pre_op](x) if pre_op else x
    z, y = block.f_parts(xp)
    branch = block.scale * block.out_norm(y)
    if block.gated or block.activation not in ACTIVATION_DERIVATIVES:  # no closed form
        return branch, None
    deriv = ACTIVATION_DERIVATIVES[block.activation](z[:, 0])
    active = None
    if masked and block.activation in MASKED:
        active = [torch.nonzero(g).squeeze(1) for g in deriv]
    up, down = (block.w, None) if block.matrices == 1 else (block.w_up, block.w_down)
    return branch, BranchLinearization(
        scale=block.scale, pre=norm_jacobian(pre_op, x[:, 0]) if pre_op else None,
        out=norm_jacobian(block.out_op, y[:, 0]) if block.out_op else None, deriv=deriv, up=up,
        down=down, active=active,)


class LayerJacobian:
    """The pieces of block ``layer``'s (1-based) Jacobian at the forward activation: ``h_in``/``h_out``
    ``(E, 1, d)``, ``skip_from`` (``None``: plain layer), ``linear`` (``None``: ``torch.func``), ``residual``
    ``J_R`` (``None``: identity) and ``branch`` ``J_b`` ``(E, d, d)``, formed on first access.
    """

    def __init__(self, layer: int, block: Block, h_in: Tensor, h_out: Tensor, skip_from: int | None,
                 linear: BranchLinearization | None, residual: NormJacobian | None):
        self.layer, self.block, self.h_in, self.h_out = layer, block, h_in, h_out
        self.skip_from, self.linear, self.residual = skip_from, linear, residual
        self._branch: Tensor | None = None

    @property
    def branch(self) -> Tensor:
        if self._branch is None:
            self._branch = (self.linear.dense() if self.linear is not None
                            else branch_jacobian(self.block, self.h_in))
        return self._branch

    @property
    def factor(self) -> Tensor | BranchLinearization:
        """``J_b`` dense, or factored where that is cheaper and the dense form is not yet made."""
        cheap = self._branch is None and self.linear is not None and self.linear.apply_is_cheaper()
        return self.linear if cheap else self.branch


def layer_jacobians(model: ResidualMLP, h0: Tensor, *, masked: bool = True) -> Iterator[LayerJacobian]:
    """Walk the blocks of ``model`` once from ``h0`` ``(E, 1, d)``, yielding each block's :class:`LayerJacobian` (Eq. 17/18)."""
    keep, states = max(model.skip_every, 1), {0: h0}
    with torch.no_grad():
        for l, block in model.walk():  # a streamed model draws block l here
            x = states[l - 1]
            s, linear = linearize_branch(block, x, masked=masked)
            skip_from = model.skip_source(l) if block.has_skip else None
            if skip_from is not None:
                s = states[skip_from] + s
            post_op = getattr(block, "post_op", None)  # (a plain layer has no R)
            residual = norm_jacobian(post_op, s[:, 0]) if post_op else None
            states[l] = block.res_norm(s)
            states.pop(l - keep, None)
            yield LayerJacobian(l, block, x, states[l], skip_from, linear, residual)


@dataclass
class ForwardSweep:
    """Everything one forward sweep measured, per member; ``None`` where not asked for: ``rms``
    ``(E, L+1)``; ``erank``, ``stable_rank``, ``log_gain`` ``(E, L)``; ``branch_ratio`` (Eq. 4) and
    ``accumulated_branch`` (Figure 5b/12) ``(E, L)``; ``io_unit`` ``(E, d, d)`` (unit Frobenius)
    and ``io_singular_values`` ``(E, d)``.
    """

    rms: Tensor
    erank: Tensor | None = None
    stable_rank: Tensor | None = None
    log_gain: Tensor | None = None
    branch_ratio: Tensor | None = None
    accumulated_branch: Tensor | None = None
    io_unit: Tensor | None = None
    io_singular_values: Tensor | None = None
    partials: list[Tensor] = field(default_factory=list)

    @property
    def io_jacobian(self) -> Tensor:
        """``∂h_L/∂h_0`` at true scale, ``(E, d, d)`` (may overflow where the gain does)."""
        return self.io_unit * self.log_gain[:, -1].exp()[:, None, None]


#: how the profile's L spectra are taken (``gram``: 0.55 of an ``svdvals`` at d = 256)
PROFILE_SPECTRA = "gram"


class _Spectra:
    """erank and stable rank of ``∂h_l/∂h_0`` for l = 1…L as the sweep produces them: in the loop
    (``gram`` where exact, else SVDs from then on; or ``svd``), or deferred to one batched call.
    """

    def __init__(self, want: bool, depth: int, deferred: bool, method: str):
        if method not in ("gram", "svd"):
            raise ValueError(f"spectra_method={method!r} is not one of gram, svd")
        self.want, self.depth, self.deferred, self.method = want, depth, deferred, method
        self.er: list[Tensor] = []
        self.sr: list[Tensor] = []
        self.kept: list[Tensor] = []
        self.last: Tensor | None = None
        self.final: Tensor | None = None

    def add(self, layer: int, unit: Tensor) -> None:
        if layer == self.depth or not self.want or self.deferred:
            if layer == self.depth:  # taken in finish: ∂h_L/∂h_0 is not overwritten
                self.last = unit
            elif self.want:
                self.kept.append(unit.clone())  # the next block overwrites this buffer
            self.er.append(torch.full_like(unit[:, 0, 0], float("nan")))
            self.sr.append(self.er[-1])
        else:
            if self.method == "gram":
                er, sr, exact = gram_ranks(unit)
                if not bool(exact.all()):  # CPU only: the choice reads the device
                    self.method = "svd"
            if self.method == "svd":
                er, sr = spectral_ranks(unit, "svd")
            self.er.append(er)
            self.sr.append(sr)

    def finish(self) -> tuple[Tensor, Tensor]:
        """``(erank, stable rank)`` ``(E, L)``, unnormalized, deferred spectra taken here."""
        er, sr = torch.stack(self.er, 1), torch.stack(self.sr, 1)
        if self.kept:  # one batched call
            k_er, k_sr = spectral_ranks(torch.stack(self.kept, 1), self.method)
            er[:, : len(self.kept)], sr[:, : len(self.kept)] = k_er, k_sr
        self.final = singular_values(self.last)
        er[:, -1], sr[:, -1] = erank_from_sv(self.final), stable_rank_from_sv(self.final)
        return er, sr


def state_rms(h: Tensor) -> Tensor:
    """``rms(h)`` over the last two axes ``(E,)``."""
    return h.square().mean((-2, -1)).sqrt()


def forward_sweep(model: ResidualMLP, h0: Tensor, *, needs: Collection[str] | None = None,
                  keep_partials: bool = False,
                  on_layer: Callable[[LayerJacobian], None] | None = None,
                  progress: bool | None = False, sync_free: bool | None = None,
                  spectra_method: str | None = None) -> ForwardSweep:
    """The partial Jacobians ``∂h_l/∂h_0`` a probe set needs, from one forward sweep of ``h0`` ``(E, 1, d)``.

    ``needs``: a subset of :data:`SWEEP_NEEDS` (``None``: all); ``keep_partials``: also
    every ``∂h_l/∂h_0`` (memory ``L·E·d²``); ``on_layer``: gets each :class:`LayerJacobian`;
    ``sync_free``: no host sync in the loop (default on an accelerator; both paths agree to
    1e-12); ``spectra_method``: ``gram`` or ``svd``. Per masked M = 2 block with |a| active units:
    ``2|a|d²`` to form ``J_b`` and ``2d³`` for the product.

    Raises:
        ValueError: unknown needs.
    """
    needs = SWEEP_NEEDS if needs is None else needs
    if set(needs) - SWEEP_NEEDS:
        raise ValueError(f"unknown sweep need(s) {sorted(set(needs) - SWEEP_NEEDS)}; known: "
                         f"{sorted(SWEEP_NEEDS)}")
    e, _, d = h0.shape
    want_partials = keep_partials or IO_JACOBIAN in needs or PARTIAL_SPECTRA in needs
    want_dense = on_layer is not None or BRANCH_NORMS in needs or BRANCH_SUM in needs
    rms = [state_rms(h0)]
    bar = dict(total=model.depth, desc="forward sweep", unit="block", leave=False,
               disable=None if progress is None else not progress)
    if not (want_partials or want_dense):  # forward only
        with torch.no_grad():
            for _, h in tqdm(model.states(h0), **bar):
                rms.append(state_rms(h))
        return ForwardSweep(rms=torch.stack(rms, 1))

    # unit-Frobenius factor and log-norm of ∂h_j/∂h_0; index j = 0…L (anchors only, unless kept)
    u0, log0 = identity_unit(h0)
    units, logs = {0: u0}, {0: log0}
    spare = torch.empty_like(units[0]) if model.skip_every == 1 and not keep_partials else None
    lg, ratio, acc_branch, partials = [], [], [], []
    sync_free = h0.device.type != "cpu" if sync_free is None else sync_free
    spec = _Spectra(PARTIAL_SPECTRA in needs, model.depth, sync_free, spectra_method or PROFILE_SPECTRA)
    branch_sum = h0.new_zeros(e, d, d) if BRANCH_SUM in needs else None
    with torch.no_grad():
        for lj in tqdm(layer_jacobians(model, h0, masked=not sync_free), **bar):
            l = lj.layer
            if want_dense:
                jb = lj.branch
                if BRANCH_NORMS in needs:
                    ratio.append(torch.linalg.matrix_norm(jb) / d**0.5)
                if branch_sum is not None:
                    branch_sum += jb
                    acc_branch.append(torch.linalg.matrix_norm(branch_sum) / d**0.5)
            if want_partials:
                unit, log = advance(units, logs, l, lj.skip_from, lj.factor, lj.residual, spare)
                if spare is not None:
                    spare = units[l - 1]  # ∂h_{l−1}/∂h_0 is read by no later block: reuse its memory
                units[l], logs[l] = unit, log
                # later blocks read only ∂h_j/∂h_0 for j ≥ l + 1 − k (their input or skip source)
                stale = l - max(model.skip_every, 1)
                units.pop(stale, None)
                logs.pop(stale, None)
                spec.add(l, unit)
                lg.append(log)
                if keep_partials:
                    partials.append(unit * log.exp()[:, None, None])
            rms.append(state_rms(lj.h_out))
            if on_layer is not None:
                on_layer(lj)
    out = ForwardSweep(rms=torch.stack(rms, 1), partials=partials)
    if want_partials:
        out.erank, out.stable_rank = spec.finish()
        out.log_gain = torch.stack(lg, 1)
        out.io_unit, out.io_singular_values = units[model.depth], spec.final
    if ratio:
        out.branch_ratio = torch.stack(ratio, 1)
    if acc_branch:
        out.accumulated_branch = torch.stack(acc_branch, 1)
    return out


def identity_unit(h0: Tensor) -> tuple[Tensor, Tensor]:
    """``I`` ``(E, d, d)`` for ``h0`` ``(E, ·, d)``: unit-Frobenius matrix, ln-norm ``(E,)``."""
    e, d = h0.shape[0], h0.shape[-1]
    eye = torch.eye(d, dtype=h0.dtype, device=h0.device).expand(e, d, d)
    return eye / d**0.5, h0.new_full((e,), 0.5 * math.log(d))


def renormalize(acc: Tensor, log: Tensor) -> tuple[Tensor, Tensor]:
    """``e^log · acc`` ``(E, d, d)`` as (unit-Frobenius, ln-norm), dividing ``acc`` in place; a zero
    matrix stays zero (ln-norm −inf: a dead plain ReLU layer makes ∂h_l/∂h_0 exactly 0)."""
    norm = torch.linalg.matrix_norm(acc)
    return acc.div_(norm.clamp(min=torch.finfo(norm.dtype).tiny)[:, None, None]), log + norm.log()


#: relative weights below e^CUTOFF only add subnormals (100× slower on CPU), not accuracy
CUTOFF = -80.0


def weight(log_ratio: Tensor) -> Tensor:
    """``exp(log_ratio)`` for ``log_ratio ≤ 0``, flushed to 0 below ``e^CUTOFF``."""
    return torch.where(log_ratio > CUTOFF, log_ratio.exp(), 0.0)


def log_sum(u1: Tensor, log1: Tensor, u2: Tensor, log2: Tensor) -> tuple[Tensor, Tensor]:
    """``e^log1 u1 + e^log2 u2`` as ``(acc, top)``, the sum ``e^top acc`` (``u1`` overwritten)."""
    top = torch.maximum(log1, log2)
    top = torch.where(torch.isfinite(top), top, 0.0)  # both exactly zero
    acc = u1.mul_(weight(log1 - top)[:, None, None])
    return acc.add_(u2 * weight(log2 - top)[:, None, None]), top


def advance(units: dict[int, Tensor], logs: dict[int, Tensor], l: int, skip_from: int | None,
            jb: Tensor | BranchLinearization, residual: NormJacobian | None = None,
            spare: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``∂h_l/∂h_0 = J_R (J_b ∂h_{l−1}/∂h_0 + ∂h_skip/∂h_0)`` as (unit, ln-norm) from the stored
    partials of its input and skip source; ``J_b`` dense or factored."""
    prev_u, acc_log = units[l - 1], logs[l - 1]
    dense = isinstance(jb, Tensor)
    if skip_from == l - 1 and dense:
        # the standard block: U ← U + J_b U, one GEMM per member accumulating into the spare
        # buffer (addmm per member: faster than baddbmm on CPU, and batch-independent bits)
        acc = torch.empty_like(prev_u) if spare is None else spare
        for i in range(acc.shape[0]):
            torch.addmm(prev_u[i], jb[i], prev_u[i], out=acc[i])
    else:
        acc = jb @ prev_u if dense else jb.apply(prev_u)  # at scale e^acc_log
        if skip_from is not None:
            acc, acc_log = log_sum(acc, acc_log, units[skip_from], logs[skip_from])
    if residual is not None:
        residual.left_(acc)
    return renormalize(acc, acc_log)
