"""Input–output and partial Jacobians by forward-mode accumulation (design.md §4).

One forward sweep over the blocks gives every partial Jacobian
``∂h_l/∂h_0``: block l contributes

    ∂h_l/∂h_0 = J_R · ( ∂h_{l−k}/∂h_0 + J_b · ∂h_{l−1}/∂h_0 )          (Eq. 2/10/18)

where ``J_b = ∂[β B(f(P(x)))]/∂x`` is the scaled branch Jacobian at the
forward activation ``x = h_{l−1}``, ``J_R`` the post-residual norm's Jacobian
(identity unless Post-Norm) and the skip term is present only on blocks with a
skip.  ``J_b`` and ``J_R`` come from ``torch.func.jvp`` on the module itself
(one batched jvp per block over the d basis directions, seeds batched too), so
every activation and norm op works without hand-written derivatives; the
closed forms of Table 2 serve as test oracles.

Products of many Jacobians span many decades, so the running product is kept
as a unit-Frobenius matrix plus its log-norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.func import functional_call, jacfwd, vmap
from tqdm.auto import tqdm

from ..models.mlp import Block, ResidualMLP
from ..spectra import erank_from_sv, singular_values, stable_rank_from_sv


def member_jacobian(fn: Callable[..., Tensor], x: Tensor, params: dict | None = None) -> Tensor:
    """Per-member Jacobian by forward mode: ``vmap`` over members of ``jacfwd``.

    Args:
        fn: ``fn(params_e, x_e) → y_e`` for one member, ``x_e`` of shape ``(d_in,)``,
            ``y_e`` of shape ``(d_out,)``; ``params_e`` holds that member's slices.
        x: points ``(E, 1, d_in)``.
        params: tensors with leading member axis E (or ``None``).

    Returns:
        ``(E, d_out, d_in)`` with ``J[e] = ∂fn(params_e, x_e)/∂x_e``. Members are
        mapped with ``vmap`` so each member's weights stay 2-D and the d tangent
        directions fold into one GEMM per matrix.
    """
    if x.shape[1] != 1:
        raise ValueError(f"one input per member expected, got x of shape {tuple(x.shape)}")
    return vmap(jacfwd(fn, argnums=1))(params or {}, x[:, 0])


def branch_jacobian(block: Block, x: Tensor) -> Tensor:
    """``J_b = ∂[β B(f(P(x)))]/∂x`` of ``block`` at ``x`` ``(E, 1, d)`` → ``(E, d, d)`` (Eq. 9/17)."""
    params = dict(block.named_parameters())
    return member_jacobian(
        lambda p, xe: functional_call(block, p, (xe,), {"part": "branch"}), x, params
    )


def residual_norm_jacobian(block: Block, s: Tensor) -> Tensor:
    """``J_R`` of the post-residual norm at the sum ``s`` ``(E, 1, d)`` → ``(E, d, d)`` (Eq. 18/19)."""
    return member_jacobian(lambda _, se: block.res_norm(se), s)


@dataclass
class LayerJacobian:
    """The pieces of block ``layer``'s Jacobian at the forward activation.

    Attributes:
        layer: 1-based block index l.
        h_in: ``h_{l−1}``, ``(E, 1, d)``.
        h_out: ``h_l``, ``(E, 1, d)``.
        branch: ``J_b = ∂[β B(f(P(x)))]/∂x`` at ``h_{l−1}``, ``(E, d, d)`` (β only on residual blocks).
        skip_from: j such that the block adds ``h_j`` (``l − k``), or ``None`` on a plain layer.
        residual_norm: ``J_R`` at the pre-norm sum, ``(E, d, d)``, or ``None`` when R is the identity.
    """

    layer: int
    h_in: Tensor
    h_out: Tensor
    branch: Tensor
    skip_from: int | None
    residual_norm: Tensor | None


def layer_jacobians(model: ResidualMLP, h0: Tensor) -> Iterator[LayerJacobian]:
    """Walk the blocks once, yielding each block's Jacobian pieces (Eq. 17/18).

    Args:
        model: the network (E members).
        h0: inputs ``(E, 1, d)``.
    """
    hs = [h0]
    with torch.no_grad():
        for l, block in enumerate(model.blocks, start=1):
            x = hs[-1]
            jb = branch_jacobian(block, x)
            skip_from = model.skip_source(l) if block.has_skip else None
            s = block.branch(x)
            if skip_from is not None:
                s = s + hs[skip_from]
            jr = residual_norm_jacobian(block, s) if model.placement == "post" else None
            h = block.res_norm(s)
            hs.append(h)
            yield LayerJacobian(l, x, h, jb, skip_from, jr)


@dataclass
class ForwardSweep:
    """Everything one forward sweep measures, per member (seed).

    Attributes (E = members, L = depth, d = width):
        rms: ``rms(h_l)`` for l = 0…L, ``(E, L+1)``.
        erank: ``erank(∂h_l/∂h_0)`` for l = 1…L, unnormalized, ``(E, L)``.
        stable_rank: ``‖∂h_l/∂h_0‖_F² / ‖∂h_l/∂h_0‖_2²``, ``(E, L)``.
        log_gain: ``ln ‖∂h_l/∂h_0‖_F``, ``(E, L)``.
        branch_ratio: branch-to-skip ratio ``r_l = ‖β J_l‖_F / ‖I‖_F`` (Eq. 4), ``(E, L)``.
        accumulated_branch: ``‖Σ_{l≤k} β J_l‖_F / ‖I‖_F`` for k = 1…L, ``(E, L)`` (Figure 5b/12).
        io_unit: ``∂h_L/∂h_0`` divided by its Frobenius norm, ``(E, d, d)``.
        io_singular_values: singular values of ``∂h_L/∂h_0``, unit-Frobenius scale, ``(E, d)``.
        partials: if kept, every ``∂h_l/∂h_0`` at true scale, l = 1…L, each ``(E, d, d)``.
    """

    rms: Tensor
    erank: Tensor
    stable_rank: Tensor
    log_gain: Tensor
    branch_ratio: Tensor
    accumulated_branch: Tensor
    io_unit: Tensor
    io_singular_values: Tensor
    partials: list[Tensor] = field(default_factory=list)

    @property
    def io_jacobian(self) -> Tensor:
        """``∂h_L/∂h_0`` at true scale, ``(E, d, d)`` (may overflow where the gain does)."""
        return self.io_unit * self.log_gain[:, -1].exp()[:, None, None]


def forward_sweep(
    model: ResidualMLP,
    h0: Tensor,
    *,
    keep_partials: bool = False,
    on_layer: Callable[[LayerJacobian], None] | None = None,
    progress: bool | None = False,
    spectra: bool = True,
) -> ForwardSweep:
    """All partial Jacobians ``∂h_l/∂h_0`` from one forward sweep, with their spectra.

    Args:
        model: the network; its dtype and device are used throughout.
        h0: inputs ``(E, 1, d)``, one per member.
        keep_partials: also return every ``∂h_l/∂h_0`` (memory ``L·E·d²``; for tests).
        on_layer: called with each block's :class:`LayerJacobian` (lets other
            probes share the sweep instead of recomputing Jacobians).
        progress: tqdm bar over blocks (``None``: only on a terminal).
        spectra: compute the per-layer SVDs (``False`` leaves erank/stable rank NaN;
            for timing the Jacobians alone).

    Returns:
        :class:`ForwardSweep`. Costs per block one d-batched jvp through the
        branch, one ``d×d`` product and one batched SVD.
    """
    e, _, d = h0.shape
    eye = torch.eye(d, dtype=h0.dtype, device=h0.device).expand(e, d, d)
    zero = torch.zeros(e, dtype=h0.dtype, device=h0.device)
    # unit-Frobenius factor and log-norm of ∂h_j/∂h_0; index j = 0…L (anchors only, unless kept)
    units: dict[int, Tensor] = {0: eye / d**0.5}
    logs: dict[int, Tensor] = {0: zero + 0.5 * torch.log(torch.tensor(float(d), dtype=h0.dtype))}
    rms, er, sr, lg, ratio, acc_branch, partials = [h0.square().mean((-2, -1)).sqrt()], [], [], [], [], [], []
    branch_sum = torch.zeros(e, d, d, dtype=h0.dtype, device=h0.device)
    io_unit, s = units[0], None
    with torch.no_grad():
        blocks = tqdm(layer_jacobians(model, h0), total=model.depth, desc="forward sweep",
                      unit="block", leave=False, disable=None if progress is None else not progress)
        for lj in blocks:
            l = lj.layer
            prev_u, prev_log = units[l - 1], logs[l - 1]
            acc = lj.branch @ prev_u  # at scale exp(prev_log)
            acc_log = prev_log
            if lj.skip_from is not None:
                skip_u, skip_log = units[lj.skip_from], logs[lj.skip_from]
                top = torch.maximum(acc_log, skip_log)
                # weights below e^-80 only add subnormals (100× slower on CPU), not accuracy
                wa = torch.where(acc_log - top < -80, 0.0, (acc_log - top).exp())
                ws = torch.where(skip_log - top < -80, 0.0, (skip_log - top).exp())
                acc = acc * wa[:, None, None] + skip_u * ws[:, None, None]
                acc_log = top
            if lj.residual_norm is not None:
                acc = lj.residual_norm @ acc
            norm = torch.linalg.matrix_norm(acc)
            unit, log = acc / norm[:, None, None], acc_log + norm.log()
            units[l], logs[l] = unit, log
            # later blocks read only ∂h_j/∂h_0 for j ≥ l + 1 − k (their input or skip source)
            stale = l - max(model.skip_every, 1)
            units.pop(stale, None)
            logs.pop(stale, None)
            if spectra or l == model.depth:
                s = singular_values(unit)
                er.append(erank_from_sv(s))
                sr.append(stable_rank_from_sv(s))
            else:
                er.append(torch.full_like(log, float("nan")))
                sr.append(er[-1])
            lg.append(log)
            ratio.append(torch.linalg.matrix_norm(lj.branch) / d**0.5)
            branch_sum += lj.branch
            acc_branch.append(torch.linalg.matrix_norm(branch_sum) / d**0.5)
            rms.append(lj.h_out.square().mean((-2, -1)).sqrt())
            if keep_partials:
                partials.append(unit * log.exp()[:, None, None])
            if on_layer is not None:
                on_layer(lj)
            io_unit = unit
    return ForwardSweep(
        rms=torch.stack(rms, 1),
        erank=torch.stack(er, 1),
        stable_rank=torch.stack(sr, 1),
        log_gain=torch.stack(lg, 1),
        branch_ratio=torch.stack(ratio, 1),
        accumulated_branch=torch.stack(acc_branch, 1),
        io_unit=io_unit,
        io_singular_values=s,
        partials=partials,
    )
