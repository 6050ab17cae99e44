"""Training recipes beyond the study's Adam: SGD with momentum and weight decay, step decay with
warm-up, on-device augmentation — He et al.'s (2016, §4.2) CIFAR-10 recipe, as task=train options.

He et al.: SGD, momentum 0.9, weight decay 1e-4, batch 128, learning rate 0.1 divided by 10 at
32k and 48k of 64k iterations (50 % and 75 %), and for the 110-layer network a warm-up at 0.01
for the first 400 iterations; 4-pixel pad, random 32×32 crop, horizontal flip.

:func:`recipe` turns the ``task`` config into a :class:`~rankexp.tasks.optim.Recipe` the training
loop runs: the default options give :data:`~rankexp.tasks.optim.ADAM` itself (so every earlier
checkpoint and run keeps its identity).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .augment import PadCropFlip
from .optim import ADAM, Recipe, constant, copy_in_place, member_adam


class MemberSGD:
    """SGD with momentum and weight decay (``torch.optim.SGD``'s update) for E members, member
    ``e`` at learning rate ``lrs[e]``::

        d = g + λ·w      (λ = weight_decay on the parameters with ``decay``, else 0)
        v ← μ·v + d      (v = 0 before the first step, so v₁ = d as in torch)
        w ← w − lr_e·v

    The per-member rate is a broadcast ``(E, 1, …)`` factor of one ``addcmul_``. A frozen member
    (``alive[e]`` False) gets ``d = 0`` and rate 0: its weights stay as they are and its velocity
    only decays.

    Args:
        params: tensors ``(E, …)`` sharing one dtype and device.
        lrs: ``(E,)`` positive finite learning rates.
        momentum: μ ∈ [0, 1).
        weight_decay: λ ≥ 0.
        decay: one bool per parameter, whether λ applies (He et al.: conv kernels and the
            classifier matrix, not BN scale/shift or biases); default all.

    Raises:
        ValueError: bad ``lrs``/``momentum``/``weight_decay``, a parameter without the member
            axis, or ``decay`` of another length.
    """

    def __init__(self, params: Sequence[Tensor], lrs: Tensor | Sequence[float], *,
                 momentum: float = 0.9, weight_decay: float = 0.0,
                 decay: Sequence[bool] | None = None):
        self.params = list(params)
        device, self.dtype = self.params[0].device, self.params[0].dtype
        self.lrs = torch.as_tensor(lrs, dtype=torch.float64).to(device)
        members = self.lrs.shape[0] if self.lrs.dim() == 1 else -1
        if members < 1 or not bool(((self.lrs > 0) & torch.isfinite(self.lrs)).all()):
            raise ValueError(f"lrs={self.lrs.tolist()} must be a non-empty (E,) of finite rates > 0")
        if any(p.dim() < 1 or p.shape[0] != members for p in self.params):
            raise ValueError(f"every parameter needs the leading member axis E={members}")
        if not 0 <= momentum < 1 or not (weight_decay >= 0 and math.isfinite(weight_decay)):
            raise ValueError(f"momentum={momentum} must be in [0, 1), weight_decay={weight_decay} ≥ 0")
        decay = [True] * len(self.params) if decay is None else [bool(d) for d in decay]
        if len(decay) != len(self.params):
            raise ValueError(f"decay has {len(decay)} entries for {len(self.params)} parameters")
        self.momentum, self.weight_decay, self.decay = float(momentum), float(weight_decay), decay
        self.velocity = [torch.zeros_like(p) for p in self.params]
        self._shapes = [(members,) + (1,) * (p.dim() - 1) for p in self.params]

    @torch.no_grad()
    def step(self, alive: Tensor, lr_scale: Tensor | float = 1.0) -> None:
        rate = torch.where(alive, -(self.lrs * lr_scale), 0.0).to(self.dtype)  # (E,)
        wd = torch.where(alive, self.weight_decay, 0.0).to(self.dtype)
        # on CPU the read is free: the masking passes run only once a member is frozen
        clear = alive.device.type != "cpu" or not bool(alive.all())
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

    def state_dict(self) -> dict:
        return {"name": "sgd", "momentum": self.momentum, "weight_decay": self.weight_decay,
                "decay": list(self.decay), "velocity": [v.clone() for v in self.velocity]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore in place (a captured CUDA graph stays valid).

        Raises:
            ValueError: another optimizer's state, other constants, or other shapes.
        """
        if state.get("name") != "sgd" or len(state["velocity"]) != len(self.params):
            raise ValueError(f"not the state of this MemberSGD ({len(self.params)} parameters)")
        if (state["momentum"], state["weight_decay"], list(state["decay"])) != (
                self.momentum, self.weight_decay, self.decay):
            raise ValueError("SGD constants differ: "
                             f"{state['momentum']}, {state['weight_decay']}, {state['decay']}")
        copy_in_place(self.velocity, list(state["velocity"]), "velocity")


def decays(p: Tensor) -> bool:
    """Whether weight decay applies: kernels and matrices ``(E, out, in, …)`` yes; vectors
    ``(E, C)`` — BN scale and shift, biases — no (He et al.; fb.resnet.torch)."""
    return p.dim() > 2


@dataclass(frozen=True)
class StepSchedule:
    """Step decay with an optional constant warm-up: the factor on every member's rate at 0-based
    ``step`` of ``steps`` is ``gamma^k`` (k = milestones passed, a milestone m at step
    ``round(m·steps)``), times ``warmup_factor`` for ``step < warmup_steps``.

    He et al.: ``milestones=(0.5, 0.75), gamma=0.1``; at depth 110 ``warmup_steps=400,
    warmup_factor=0.1`` (lr 0.01 while the base rate is 0.1).
    """

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
    """The :class:`Recipe` the ``task`` config (:class:`~rankexp.config.TrainTask`) asks for.

    Args:
        task: ``optimizer`` (adam | sgd), ``momentum``, ``weight_decay``, ``schedule``
            (constant | step), ``milestones``, ``gamma``, ``warmup_steps``, ``warmup_factor``,
            ``warmup_min_depth`` (warm up only networks at least this deep), ``augment``
            (none | pad_crop_flip), ``pad``.
        depth: the network's depth (for ``warmup_min_depth``).
        steps, batch_size, seed: of the run (the augmentation's table and stream).
        fill: the augmentation's padding value per channel (black: ``−mean/std``).
        device: the training device.

    Returns :data:`ADAM` itself for the default options (Adam, constant, no augmentation).
    """
    optimizer = _value(task.optimizer)
    schedule_name = _value(task.schedule)
    augment = _value(task.augment)
    if (optimizer, schedule_name, augment) == ("adam", "constant", "none"):
        return ADAM
    parts: list[str] = []
    if optimizer == "sgd":
        opt: Callable[[nn.Module, Tensor], object] = _sgd_factory(task.momentum, task.weight_decay)
        parts.append(f"sgd(m={task.momentum:g},wd={task.weight_decay:g})")
    else:
        opt = member_adam
        parts.append("adam")
    schedule: Callable[[int, int], float] = constant
    if schedule_name == "step":
        warm = task.warmup_steps if depth >= task.warmup_min_depth else 0
        schedule = StepSchedule(tuple(float(m) for m in task.milestones), float(task.gamma),
                                int(warm), float(task.warmup_factor))
        parts.append(schedule.name)
    transform = None
    if augment == "pad_crop_flip":
        # (+4 rows: a CUDA graph's warm-up steps may run past the last step, LoopState.SLACK)
        transform = PadCropFlip(steps + 4, batch_size, seed, pad=task.pad, fill=fill,
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


def _value(v) -> str:
    return getattr(v, "value", v)
