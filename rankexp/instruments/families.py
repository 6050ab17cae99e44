"""rankexp's families as :class:`~rankexp.instruments.blocks.UnitBlock` s, a chain per member."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F

from ..models.convnet import CifarResNet
from ..models.gpt2 import CausalLM
from ..models.mlp import ResidualMLP
from ..models.plain import PlainNet
from ..seeding import gaussian_input
from .blocks import (
    BRANCH_LAYER,
    BRANCH_MLP,
    BRANCH_RESIDUAL,
    BlockError,
    UnitBlock,
    _hf_blocks,
    hooked_units,
    rows_stats,
)

FAMILIES = (ResidualMLP, PlainNet, CifarResNet, CausalLM)


def ensemble_inputs(model: nn.Module, inputs, point: int = 0) -> tuple[Tensor, Tensor]:
    """``(h, h0)``: inputs ``(E, n, d)`` and Jacobian point ``(E, 1, d)`` from an int n (the probes'
    inputs), ``(n, d)`` or ``(E, n, d)``. Raises ValueError: another shape, or a bad point."""
    p = next(model.parameters())
    kw = {"dtype": p.dtype, "device": p.device}
    if isinstance(inputs, int):
        if point != 0:
            raise ValueError(f"point={point}: with inputs=n (the probes' inputs) the Jacobians are "
                             "taken at task=measure's h_0; pass a tensor to choose another point")
        h0 = gaussian_input(model.seeds, model.width, **kw)
        return gaussian_input(model.seeds, model.width, batch=inputs, **kw) if inputs > 1 else h0, h0
    h = torch.as_tensor(inputs).to(**kw)
    if h.dim() == 2:
        h = h.expand(model.members, *h.shape)
    if h.dim() != 3 or h.shape[0] != model.members or h.shape[-1] != model.width:
        raise ValueError(f"inputs of shape {tuple(h.shape)}: a {type(model).__name__} of "
                         f"{model.members} member(s), width {model.width} takes an int n, "
                         f"(n, {model.width}) or ({model.members}, n, {model.width})")
    if not 0 <= point < h.shape[1]:
        raise ValueError(f"point={point}: the inputs hold {h.shape[1]} per member")
    return h, h[:, point:point + 1]


def _member_params(module: nn.Module, e: int) -> dict[str, Tensor]:
    return {n: t[e:e + 1] for n, t in (*module.named_parameters(), *module.named_buffers())}


def _stats(rows: Tensor, on: bool) -> dict:
    er, rms, n = rows_stats(rows) if on else (None, None, 0)
    return {"representation": er, "rms": rms, "rows": n}


def ensemble_units(model: ResidualMLP | PlainNet, inputs, *, point: int,
                   representation: bool = True) -> list[UnitBlock]:
    """Units of every member of a :class:`ResidualMLP` or :class:`PlainNet`.
    Raises BlockError: ``skip_every`` > 1, or a batch norm (it couples the inputs of a batch)."""
    if model.skip_every > 1:
        raise BlockError(f"skip_every={model.skip_every}: block l adds h_(l−k), so the stream is "
                         "not a chain of blocks; the closed form (method='auto' or 'closed_form' "
                         "on a ResidualMLP) measures it")
    if getattr(model, "norm_op", None) == "batchnorm":
        raise BlockError("norm_op='batchnorm' couples the inputs of a batch: a per-input Jacobian "
                         "is not defined")
    h, h0 = ensemble_inputs(model, inputs, point)
    with torch.no_grad():
        hs, at = model.trajectory(h), model.trajectory(h0)
    units = []
    for e in range(model.members):
        for l, block in enumerate(model.blocks, start=1):
            params = _member_params(block, e)
            skip = block.has_skip

            def step(v, b=block, p=params, s=skip):
                x = v.reshape(1, 1, -1)
                return functional_call(b, p, (x, x if s else None))[0, 0]

            def branch(v, b=block, p=params):
                return functional_call(b, p, (v.reshape(1, 1, -1),), {"part": "branch"})[0, 0]

            units.append(UnitBlock(
                index=l, name=f"blocks.{l - 1}", member=e, stage=1, x=at[l - 1][e, 0],
                step=step, branch_x=at[l - 1][e, 0], branch=branch, residual=skip,
                label=BRANCH_MLP if skip else BRANCH_LAYER, **_stats(hs[l][e], representation)))
    return units


def _cifar_member_fns(block: nn.Module, e: int, shape: torch.Size):
    params = {m: _member_params(m, e) for m in (block.conv1, block.bn1, block.conv2, block.bn2)}

    def call(m, y):
        return functional_call(m, params[m], (y,))

    def residual(v):
        y = F.relu(call(block.bn1, call(block.conv1, v.reshape(shape))))
        return call(block.bn2, call(block.conv2, y)).reshape(-1)

    if block.residual:
        return residual, (lambda v: F.relu(residual(v) + v))
    return None, (lambda v: F.relu(residual(v)))


def cifar_units(model: CifarResNet, inputs, *, point: int, representation: bool = True) -> list[UnitBlock]:
    """Units of the non-downsampling blocks of every member; ``inputs`` ``(B, 3072)`` or ``(B, 3, 32, 32)``."""
    p = next(model.parameters())
    x = torch.as_tensor(inputs).to(device=p.device, dtype=p.dtype)
    seen, stage, chained = [], 0, False
    with torch.no_grad():
        h = model.stem_forward(x)
        for i, blk in enumerate(model.blocks):
            h_in, h = h, blk(h)
            if blk.downsamples:
                chained = False
                continue
            if not chained:
                stage += 1
            seen.append((i, blk, stage, h_in[point:point + 1], h))
            chained = True
    if not seen:
        raise BlockError(f"CifarResNet depth {model.depth}: no shape-preserving block")
    units = []
    for e in range(model.members):
        for index, (i, blk, stg, sub, out) in enumerate(seen, start=1):
            c = blk.c_out
            xe = sub[:, e * c:(e + 1) * c]
            branch, step = _cifar_member_fns(blk, e, xe.shape)
            units.append(UnitBlock(
                index=index, name=f"blocks.{i}", member=e, stage=stg, x=xe.reshape(-1), step=step,
                branch_x=xe.reshape(-1), branch=branch, residual=blk.residual,
                label=BRANCH_RESIDUAL if blk.residual else BRANCH_LAYER,
                **_stats(out[:, e * c:(e + 1) * c], representation)))
    return units


def causal_lm_units(lm: CausalLM, inputs, *, point: int, position: int | None,
                    representation: bool = True) -> list[UnitBlock]:
    """Units of every member of a :class:`CausalLM` (default: its prompt and traced position)."""
    inputs = {"input_ids": lm.prompt_ids} if inputs is None else inputs
    position = lm.position if position is None else position
    units = []
    for e, member in enumerate(lm.members):
        units += hooked_units(member, inputs, _hf_blocks(member), point=point, position=position,
                              member=e, representation=representation)
    return units


def family_units(model: nn.Module, inputs, *, point: int, position: int | None,
                 representation: bool = True) -> list[UnitBlock]:
    """Units of a rankexp family (:data:`FAMILIES`)."""
    if isinstance(model, (ResidualMLP, PlainNet)):
        return ensemble_units(model, inputs, point=point, representation=representation)
    if isinstance(model, CifarResNet):
        return cifar_units(model, inputs, point=point, representation=representation)
    return causal_lm_units(model, inputs, point=point, position=position, representation=representation)
