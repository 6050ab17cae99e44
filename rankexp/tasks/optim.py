"""Optimizers and schedules for ensembles whose member ``e`` trains at its own learning rate.

Every operation is elementwise or broadcasts an ``(E,)`` coefficient, so member ``e`` follows a
one-member model at ``lrs[e]`` exactly; a frozen member stays bit-for-bit (gradients cleared with
``masked_fill``: ``0 · NaN`` is NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn


class MemberOptimizer(Protocol):
    """What the training loop needs of an optimizer (no host sync in :meth:`step` on CUDA)."""

    def step(self, alive: Tensor, lr_scale: Tensor | float = 1.0) -> None:
        """One update from ``.grad``: member e at ``lrs[e] · lr_scale``, frozen members unchanged."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class MemberAdam:
    """Adam (``torch.optim.Adam``'s defaults) for E members at ``lrs`` ``(E,)``: the step is
    ``m / (a_e √v + b_e)`` with ``a_e = c1 / (lr_e √c2)``, ``b_e = ε c1 / lr_e`` (one broadcast
    multiply-add); a frozen member gets ``a_e = 0, b_e = +inf``, a step of exactly 0.

    Raises:
        ValueError: ``lrs`` not ``(E,)`` positive and finite, or a parameter without the member axis.
    """

    def __init__(self, params: Sequence[Tensor], lrs: Tensor | Sequence[float], *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        members, device = member_setup(self, params, lrs)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.t = torch.zeros((), dtype=torch.float64, device=device)  # steps taken
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        # the denominator's buffer: allocated once (a fresh one per step costs page faults on CPU)
        self._denom = [torch.empty_like(p) for p in self.params]
        self._shapes = [(members,) + (1,) * (p.dim() - 1) for p in self.params]

    @torch.no_grad()
    def coefficients(self, alive: Tensor, lr_scale: Tensor | float) -> tuple[Tensor, Tensor]:
        """``(a, b)``, ``(E,)`` in the parameters' dtype, for the step about to be taken."""
        beta1, beta2 = self.betas
        t = self.t + 1
        c1, c2 = 1 - beta1**t, 1 - beta2**t
        lr = self.lrs * lr_scale
        a = torch.where(alive, c1 / (lr * c2.sqrt()), 0.0)
        b = torch.where(alive, self.eps * c1 / lr, math.inf)
        return a.to(self.dtype), b.to(self.dtype)

    @torch.no_grad()
    def step(self, alive: Tensor, lr_scale: Tensor | float = 1.0) -> None:
        a, b = self.coefficients(alive, lr_scale)
        # On CPU reading ``alive`` is free, so the clearing pass runs only once a member is
        # frozen; on CUDA that read would be a host sync, so it always runs (graphs fuse it).
        clear = alive.device.type != "cpu" or not bool(alive.all())
        self.t += 1
        beta1, beta2 = self.betas
        dead = ~alive
        for p, m, v, d, shape in zip(
            self.params, self.exp_avg, self.exp_avg_sq, self._denom, self._shapes, strict=True):
            g = p.grad
            if g is None:  # like torch.optim: a parameter without gradient is not stepped
                continue
            if clear:
                g.masked_fill_(dead.view(shape), 0.0)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            torch.sqrt(v, out=d)
            d.mul_(a.view(shape)).add_(b.view(shape))
            p.addcdiv_(m, d, value=-1.0)

    def state_dict(self) -> dict:
        return {"name": "adam", "betas": list(self.betas), "eps": self.eps, "t": self.t.clone(),
                "exp_avg": [m.clone() for m in self.exp_avg],
                "exp_avg_sq": [v.clone() for v in self.exp_avg_sq]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore in place (a captured CUDA graph stays valid).

        Raises:
            ValueError: another optimizer's state, other constants, or other shapes.
        """
        if state.get("name") != "adam" or len(state["exp_avg"]) != len(self.params):
            raise ValueError(f"not the state of this MemberAdam ({len(self.params)} parameters)")
        if tuple(state["betas"]) != self.betas or state["eps"] != self.eps:
            raise ValueError(f"Adam constants differ: {state['betas']}, {state['eps']}")
        copy_in_place(self.exp_avg + self.exp_avg_sq,
                      list(state["exp_avg"]) + list(state["exp_avg_sq"]), "moment")
        self.t.copy_(state["t"])


def member_setup(opt, params: Sequence[Tensor], lrs) -> tuple[int, torch.device]:
    """Set ``opt.params``, ``opt.dtype``, ``opt.lrs`` (float64 ``(E,)``); returns ``(E, device)``.

    Raises:
        ValueError: ``lrs`` not ``(E,)`` positive and finite, or a parameter without axis E.
    """
    opt.params = list(params)
    device, opt.dtype = opt.params[0].device, opt.params[0].dtype
    opt.lrs = torch.as_tensor(lrs, dtype=torch.float64).to(device)
    members = opt.lrs.shape[0] if opt.lrs.dim() == 1 else -1
    if members < 1 or not bool(((opt.lrs > 0) & torch.isfinite(opt.lrs)).all()):
        raise ValueError(f"lrs={opt.lrs.tolist()} must be a non-empty (E,) of finite rates > 0")
    if any(p.dim() < 1 or p.shape[0] != members for p in opt.params):
        raise ValueError(f"every parameter needs the leading member axis E={members}")
    return members, device


@torch.no_grad()
def copy_in_place(mine: list[Tensor], saved: list[Tensor], what: str) -> None:
    """Copy ``saved`` into ``mine`` in place, every shape checked before anything changes.

    Raises:
        ValueError: a shape differs (names ``what``).
    """
    pairs = list(zip(mine, saved, strict=True))
    for m, v in pairs:
        if m.shape != v.shape:
            raise ValueError(f"{what} of shape {tuple(v.shape)}, expected {tuple(m.shape)}")
    for m, v in pairs:
        m.copy_(v)


def member_adam(model: nn.Module, lrs: Tensor) -> MemberAdam:
    """The study's optimizer: :class:`MemberAdam` over every parameter of ``model``."""
    return MemberAdam(list(model.parameters()), lrs)


def constant(step: int, steps: int) -> float:
    """The study's schedule: every member at its own rate throughout (multiplier 1)."""
    return 1.0


@dataclass(frozen=True)
class Recipe:
    """How the members of a model are optimized: ``optimizer(model, lrs)``, ``schedule(step, steps)``
    (the factor on every rate, host arithmetic) and ``batch_transform(x, step)`` (on-device, ``step``
    a 0-dim device counter, so it is graph-safe); ``name`` identifies it in checkpoints.
    """

    name: str = "adam"
    optimizer: Callable[[nn.Module, Tensor], MemberOptimizer] = member_adam
    schedule: Callable[[int, int], float] = constant
    batch_transform: Callable[[Tensor, Tensor], Tensor] | None = None


#: Adam at constant per-member rates (the study's fig6 / Table 5 training).
ADAM = Recipe()
