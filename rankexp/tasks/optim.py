"""Optimizers and schedules for ensembles whose member ``e`` trains at its own learning rate:
elementwise, so member ``e`` follows a one-member model at ``lrs[e]`` exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


class MemberOptimizer:
    """An optimizer of ``params`` (leading member axis E) with member e at ``lrs[e]``, float64
    ``(E,)``; subclasses give :meth:`step` (no host sync on CUDA), ``constants`` and ``buffers``.
    Raises ValueError: ``lrs`` not ``(E,)`` positive and finite, or a parameter without axis E."""

    name = ""
    buffer_kind = "buffer"

    def __init__(self, params: Sequence[Tensor], lrs: Tensor | Sequence[float]):
        self.params = list(params)
        self.device, self.dtype = self.params[0].device, self.params[0].dtype
        self.lrs = torch.as_tensor(lrs, dtype=torch.float64).to(self.device)
        members = self.lrs.shape[0] if self.lrs.dim() == 1 else -1
        if members < 1 or not bool(((self.lrs > 0) & torch.isfinite(self.lrs)).all()):
            raise ValueError(
                f"lrs={self.lrs.tolist()} must be a non-empty (E,) of finite rates > 0")
        if any(p.dim() < 1 or p.shape[0] != members for p in self.params):
            raise ValueError(f"every parameter needs the leading member axis E={members}")
        self._shapes = [(members,) + (1,) * (p.dim() - 1) for p in self.params]

    def step(self, alive: Tensor, lr_scale: Tensor | float = 1.0) -> None:
        """One update from ``.grad``: member e at ``lrs[e] · lr_scale``, frozen members unchanged."""
        raise NotImplementedError

    @staticmethod
    def _must_clear(alive: Tensor) -> bool:  # on CUDA always: reading ``alive`` is a host sync
        return alive.device.type != "cpu" or not bool(alive.all())

    def constants(self) -> dict:
        return {}

    def buffers(self) -> dict[str, list[Tensor]]:
        return {}

    def state_dict(self) -> dict:
        return {"name": self.name, **self.constants(),
                **{k: [t.clone() for t in ts] for k, ts in self.buffers().items()}}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore in place (a captured CUDA graph stays valid).
        Raises ValueError: another optimizer's state, other constants, or other shapes."""
        mine = self.buffers()
        if state.get("name") != self.name or any(len(state[k]) != len(self.params) for k in mine):
            raise ValueError(
                f"not the state of this {type(self).__name__} ({len(self.params)} parameters)")
        constants = self.constants()
        if any(state[k] != v for k, v in constants.items()):
            raise ValueError(f"{type(self).__name__} constants differ: "
                             + ", ".join(str(state[k]) for k in constants))
        pairs = [(m, v) for k in mine for m, v in zip(mine[k], state[k], strict=True)]
        for m, v in pairs:
            if m.shape != v.shape:
                raise ValueError(
                    f"{self.buffer_kind} of shape {tuple(v.shape)}, expected {tuple(m.shape)}")
        for m, v in pairs:
            m.copy_(v)


class MemberAdam(MemberOptimizer):
    """Adam (``torch.optim.Adam``'s defaults) for E members at ``lrs`` ``(E,)``: the step is
    ``m / (a_e √v + b_e)`` with ``a_e = c1 / (lr_e √c2)``, ``b_e = ε c1 / lr_e`` (one broadcast
    multiply-add); a frozen member gets ``a_e = 0, b_e = +inf``, a step of exactly 0.
    """

    name, buffer_kind = "adam", "moment"

    def __init__(self, params: Sequence[Tensor], lrs: Tensor | Sequence[float], *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lrs)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.t = torch.zeros((), dtype=torch.float64, device=self.device)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self._denom = [torch.empty_like(p) for p in self.params]

    @torch.no_grad()
    def step(self, alive: Tensor, lr_scale: Tensor | float = 1.0) -> None:
        beta1, beta2 = self.betas
        self.t += 1
        c1, c2 = 1 - beta1**self.t, 1 - beta2**self.t
        lr = self.lrs * lr_scale
        a = torch.where(alive, c1 / (lr * c2.sqrt()), 0.0).to(self.dtype)
        b = torch.where(alive, self.eps * c1 / lr, math.inf).to(self.dtype)
        clear, dead = self._must_clear(alive), ~alive
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

    def constants(self) -> dict:
        return {"betas": list(self.betas), "eps": self.eps}

    def buffers(self) -> dict[str, list[Tensor]]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "t": self.t.clone()}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.t.copy_(state["t"])


def member_adam(model: nn.Module, lrs: Tensor) -> MemberAdam:
    """The study's optimizer: :class:`MemberAdam` over every parameter of ``model``."""
    return MemberAdam(list(model.parameters()), lrs)


def constant(step: int, steps: int) -> float:
    """The study's schedule: every member at its own rate throughout (multiplier 1)."""
    return 1.0


@dataclass(frozen=True)
class Recipe:
    """``optimizer(model, lrs)``, ``schedule(step, steps)`` (factor on every rate) and the on-device
    ``batch_transform(x, step)`` (``step`` a 0-dim device tensor); ``name`` goes in checkpoints."""

    name: str = "adam"
    optimizer: Callable[[nn.Module, Tensor], MemberOptimizer] = member_adam
    schedule: Callable[[int, int], float] = constant
    batch_transform: Callable[[Tensor, Tensor], Tensor] | None = None


#: Adam at constant per-member rates (the study's fig6 / Table 5 training).
ADAM = Recipe()
