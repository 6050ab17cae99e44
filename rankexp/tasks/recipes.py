"""He et al.'s (2016, §4.2) CIFAR-10 recipe as ``task=train`` options: SGD with momentum 0.9 and
weight decay 1e-4, lr 0.1 divided by 10 at 50 % and 75 % of training (depth 110: warm-up at 0.01
for 400 steps), 4-pixel pad, random crop, flip. :func:`recipe` gives
:data:`~rankexp.tasks.optim.ADAM` itself for the default options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .augment import PadCropFlip
from .loop import LoopState
from .optim import ADAM, MemberOptimizer, Recipe, constant, member_adam


class MemberSGD(MemberOptimizer):
    """SGD with momentum and weight decay (``torch.optim.SGD``'s update) for E members:
    ``d = g + λ·w``, ``v ← μ·v + d``, ``w ← w − lr_e·v`` (λ where ``decay``; default all). A frozen
    member gets ``d = 0`` and rate 0. Raises ValueError: bad ``lrs``, ``momentum`` or
    ``weight_decay``, a parameter without the member axis, or ``decay`` of another length."""

    name, buffer_kind = "sgd", "velocity"

    def __init__(self, params: Sequence[Tensor], lrs: Tensor | Sequence[float], *,
                 momentum: float = 0.9, weight_decay: float = 0.0,
                 decay: Sequence[bool] | None = None):
        super().__init__(params, lrs)
        if not 0 <= momentum < 1 or not (weight_decay >= 0 and math.isfinite(weight_decay)):
            raise ValueError(f"momentum={momentum} must be in [0, 1), weight_decay={weight_decay} ≥ 0")
        decay = [True] * len(self.params) if decay is None else [bool(d) for d in decay]
        if len(decay) != len(self.params):
            raise ValueError(f"decay has {len(decay)} entries for {len(self.params)} parameters")
        self.momentum, self.weight_decay, self.decay = float(momentum), float(weight_decay), decay
        self.velocity = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self, alive: Tensor, lr_scale: Tensor | float = 1.0) -> None:
        rate = torch.where(alive, -(self.lrs * lr_scale), 0.0).to(self.dtype)  # (E,)
        wd = torch.where(alive, self.weight_decay, 0.0).to(self.dtype)
        clear = self._must_clear(alive)
        dead = ~alive
        for p, v, decays, shape in zip(self.params, self.velocity, self.decay, self._shapes,
                                       strict=True):
            g = p.grad
            if g is None:  # like torch.optim: a parameter without gradient is not stepped
                continue
            if clear:
                g.masked_fill_(dead.view(shape), 0.0)
            if decays and self.weight_decay:
                if clear:
                    g.addcmul_(p, wd.view(shape))
                else:
                    g.add_(p, alpha=self.weight_decay)
            v.mul_(self.momentum).add_(g)
            p.addcmul_(v, rate.view(shape))

    def constants(self) -> dict:
        return {"momentum": self.momentum, "weight_decay": self.weight_decay,
                "decay": list(self.decay)}

    def buffers(self) -> dict[str, list[Tensor]]:
        return {"velocity": self.velocity}


def decays(p: Tensor) -> bool:
    """Whether weight decay applies: kernels and matrices yes; BN scale/shift and biases no (He et al.)."""
    return p.dim() > 2


@dataclass(frozen=True)
class StepSchedule:
    """``gamma^k`` (k milestones ``round(m·steps)`` passed), × ``warmup_factor`` in warm-up."""

    milestones: tuple[float, ...] = (0.5, 0.75)
    gamma: float = 0.1
    warmup_steps: int = 0
    warmup_factor: float = 0.1

    def __call__(self, step: int, steps: int) -> float:
        passed = sum(step >= round(m * steps) for m in self.milestones)
        factor = self.gamma**passed
        return factor * self.warmup_factor if step < self.warmup_steps else factor

    @property
    def name(self) -> str:
        ms = ",".join(f"{m:g}" for m in self.milestones)
        text = f"step({ms};x{self.gamma:g})"
        if self.warmup_steps:
            text += f"+warmup({self.warmup_steps}x{self.warmup_factor:g})"
        return text


def recipe(task, *, depth: int, steps: int, batch_size: int, seed: int,
           fill: Tensor | None, device: torch.device) -> Recipe:
    """The :class:`Recipe` the ``task`` config asks for (:data:`ADAM` itself for the defaults)."""
    optimizer, schedule_name, augment = (
        getattr(v, "value", v) for v in (task.optimizer, task.schedule, task.augment))
    if (optimizer, schedule_name, augment) == ("adam", "constant", "none"):
        return ADAM
    opt: Callable[[nn.Module, Tensor], MemberOptimizer] = member_adam
    parts = ["adam"]
    if optimizer == "sgd":
        opt = _sgd_factory(task.momentum, task.weight_decay)
        parts = [f"sgd(m={task.momentum:g},wd={task.weight_decay:g})"]
    schedule: Callable[[int, int], float] = constant
    if schedule_name == "step":
        warm = task.warmup_steps if depth >= task.warmup_min_depth else 0
        schedule = StepSchedule(tuple(float(m) for m in task.milestones), float(task.gamma),
                                int(warm), float(task.warmup_factor))
        parts.append(schedule.name)
    transform = None
    if augment == "pad_crop_flip":
        # a CUDA graph's warm-up steps may run past the last step
        transform = PadCropFlip(steps + LoopState.SLACK, batch_size, seed, pad=task.pad, fill=fill,
                                device=device)
        parts.append(transform.name)
    return Recipe(name="+".join(parts), optimizer=opt, schedule=schedule,
                  batch_transform=transform)


def _sgd_factory(momentum: float, weight_decay: float):
    def member_sgd(model: nn.Module, lrs: Tensor) -> MemberSGD:
        params = list(model.parameters())
        return MemberSGD(params, lrs, momentum=momentum, weight_decay=weight_decay,
                         decay=[decays(p) for p in params])

    return member_sgd
