"""FFN-branch Jacobians along the residual stream of a causal LM (``model=gpt2``; Figure 12).

``J_l = ∂ mlp(ln₂(x))/∂x = W_projᵀ diag(gelu′(z)) W_fcᵀ J_ln(x_l)`` with the LayerNorm Jacobian
``J_ln = diag(γ) [(I − 11ᵀ/d)/s − u uᵀ/(d s³)]``, ``u = x − mean(x)``, ``s = (‖u‖²/d + ε)^{1/2}``:
one GEMM per block (``torch.func.jacrev`` for other architectures and as the oracle).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..models.activations import ACTIVATION_DERIVATIVES as SCALAR_DERIVATIVES
from ..models.gpt2 import CausalLM
from ..result import Measurement
from .base import ProbeContext

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_derivative(z: Tensor) -> Tensor:
    """d/dz of ``½ z (1 + tanh(√(2/π)(z + 0.044715 z³)))`` (GPT-2's ``gelu_new``)."""
    t = torch.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * z**3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * z * z)


#: ``config.activation_function`` → its derivative in closed form
ACTIVATION_DERIVATIVES: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": _gelu_tanh_derivative, "gelu_pytorch_tanh": _gelu_tanh_derivative,
    "gelu_fast": _gelu_tanh_derivative, "gelu": SCALAR_DERIVATIVES["gelu"],
    "relu": SCALAR_DERIVATIVES["relu"]}


def gpt2_ffn_jacobian(norm: torch.nn.LayerNorm, mlp: torch.nn.Module, x: Tensor,
                      activation: str = "gelu_new") -> Tensor:
    """``J = ∂ mlp(ln₂(x))/∂x`` ``(d, d)`` of a GPT-2 block in closed form at ``x`` ``(d,)``.

    ``norm``: ``ln_2``; ``mlp``: ``GPT2MLP`` (``Conv1D`` weights ``(d, m)``, ``(m, d)``);
    ``activation``: ``config.activation_function``.
    """
    d = x.shape[-1]
    u = x - x.mean()
    s = torch.sqrt(u.pow(2).mean() + norm.eps)
    gamma = norm.weight if norm.weight is not None else torch.ones_like(x)
    z = torch.addmm(mlp.c_fc.bias[None], norm(x)[None], mlp.c_fc.weight)[0]
    if activation in ACTIVATION_DERIVATIVES:
        dz = ACTIVATION_DERIVATIVES[activation](z)
    else:  # one jvp of the module's own σ
        dz = torch.func.jvp(mlp.act, (z,), (torch.ones_like(z),))[1]
    # B = W_projᵀ diag(σ′) W_fcᵀ diag(γ): the one GEMM; J_ln then enters as a rank-2 correction
    b = (mlp.c_proj.weight.T * dz) @ (mlp.c_fc.weight.T * gamma)
    return b / s - torch.outer(b.sum(1), torch.ones_like(x)) / (d * s) - torch.outer(b @ u, u) / (d * s**3)


def ffn_jacobian_autograd(lm: CausalLM, member: int, layer: int, x: Tensor) -> Tensor:
    """``∂ mlp(ln₂(x))/∂x`` by reverse-mode ``torch.func.jacrev`` on the modules, ``(d, d)``."""
    return torch.func.jacrev(lm.ffn_branch(member, layer))(x)


def ffn_jacobians(lm: CausalLM, member: int, ffn_in: Tensor) -> Tensor:
    """``J_1 … J_L`` ``(L, d, d)`` of one member at its traced FFN inputs ``(L, d)``."""
    act = getattr(lm.members[member].config, "activation_function", "")
    out = []
    with torch.no_grad() if lm.model_type == "gpt2" else torch.enable_grad():
        for l in range(1, lm.depth + 1):
            if lm.model_type == "gpt2":
                out.append(gpt2_ffn_jacobian(*lm.ffn_parts(member, l), ffn_in[l - 1], act))
            else:
                out.append(ffn_jacobian_autograd(lm, member, l, ffn_in[l - 1]).detach())
    return torch.stack(out)


def ffn_statistics(jac: Tensor, first_block: int = 2) -> dict[str, Tensor]:
    """Figure 12's quantities from the Jacobians ``(L, d, d)`` of one network, over blocks
    ``first_block … L``: ratios, cosines, accumulated/uncorrelated/coherent sums (/√d).

    Raises:
        ValueError: ``first_block`` outside 1…L.
    """
    L, d = jac.shape[0], jac.shape[-1]
    if not 1 <= first_block <= L:
        raise ValueError(f"task.options.ffn_jacobian.first_block={first_block}: must be in 1…{L} (L = depth)")
    flat = jac.reshape(L, -1)
    gram = flat @ flat.T
    norms = gram.diagonal().clamp_min(0).sqrt()
    cos = gram / torch.outer(norms, norms)
    kept, g = cos[first_block - 1:, first_block - 1:], gram[first_block - 1:, first_block - 1:]
    off = kept[~torch.eye(kept.shape[0], dtype=torch.bool, device=kept.device)]
    nan = torch.tensor(math.nan, dtype=jac.dtype, device=jac.device)
    root_d = math.sqrt(d)
    return {
        "ratio": norms / root_d,
        "cosines": cos,
        # ‖Σ_{l≤k} J_l‖_F² = Σ_{i,j≤k} ⟨J_i, J_j⟩: the leading k×k block of the Gram matrix
        "accumulated": g.cumsum(0).cumsum(1).diagonal().clamp_min(0).sqrt() / root_d,
        "uncorrelated": g.diagonal().cumsum(0).sqrt() / root_d,
        "coherent": norms[first_block - 1:].cumsum(0) / root_d,
        "cos_offdiag_mean": off.mean() if off.numel() else nan,
        "cos_offdiag_abs_mean": off.abs().mean() if off.numel() else nan,
        "cos_offdiag_rms": off.pow(2).mean().sqrt() if off.numel() else nan}


def probe_ffn_jacobian(ctx: ProbeContext) -> Measurement:
    """``ffn_jacobian``: Figure 12 on every member of a :class:`CausalLM` (``model=gpt2``).

    Option ``first_block``; ``ffn_cos_offdiag_rms_d`` is the rms cosine in units of 1/d.

    Raises:
        TypeError: the network is not a :class:`CausalLM`.
    """
    lm = ctx.model
    if not isinstance(lm, CausalLM):
        raise TypeError("probe ffn_jacobian needs model=gpt2 (a causal LM)")
    first = int(ctx.probe_options("ffn_jacobian")["first_block"])
    per: dict[str, list[Tensor]] = {}
    for e in range(len(lm.members)):
        stream, ffn_in = lm.trace(e)
        stats = ffn_statistics(ffn_jacobians(lm, e, ffn_in), first)
        stats["rms"], stats["rms_ffn_input"] = (t.pow(2).mean(-1).sqrt() for t in (stream, ffn_in))
        for k, v in stats.items():
            per.setdefault(k, []).append(v)
    v = {k: torch.stack(x) for k, x in per.items()}
    L, d = lm.depth, lm.width
    m = Measurement()
    m.add_seed_series("ffn_ratio", v["ratio"], range(1, L + 1))
    m.add_seed_series("rms", v["rms"], range(0, L + 1))
    m.add_seed_series("rms_ffn_input", v["rms_ffn_input"], range(1, L + 1))
    for key in ("accumulated", "uncorrelated", "coherent"):
        m.add_seed_series(f"ffn_{key}", v[key], range(first, L + 1))
    m.add_seed_stat("ffn_accumulated_ratio", v["accumulated"][:, -1] / v["uncorrelated"][:, -1])
    m.add_seed_stat("ffn_coherent_ratio", v["coherent"][:, -1] / v["uncorrelated"][:, -1])
    for key in ("cos_offdiag_mean", "cos_offdiag_abs_mean", "cos_offdiag_rms"):
        m.add_seed_stat(f"ffn_{key}", v[key])
    m.add_seed_stat("ffn_cos_offdiag_rms_d", v["cos_offdiag_rms"] * d)
    m.add_seed_stat("ffn_ratio_decay", v["ratio"][:, -1] / v["ratio"][:, first - 1])
    m.add_seed_stat("rms_final", v["rms"][:, -1])
    m.add_seed_array("ffn_cosines", v["cosines"])
    m.scalars["ffn_cos_baseline"] = 1.0 / d
    return m
