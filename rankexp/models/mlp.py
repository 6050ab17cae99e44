"""The residual MLP of the study: ``h_l = R(skip + β · B(f(P(h_{l−1}))))`` (Eq. 17).

P (pre), B (branch output) and R (post-residual) are each a norm op of Table 2 or the identity,
set one by one or by a *placement* preset (:data:`rankexp.models.norms.PRESET_SLOTS`) that puts
``norm_op`` in its slots.  The branch ``f`` is ``σ(W x)`` (M = 1), ``W_down σ(W_up x)`` (M = 2,
Eq. 9) or SwiGLU; weights are biasless, ``N(0, α²/fan_in)``.  Every weight carries a leading
member axis E (seeds, or one member per learning rate) and every activation is ``(E, B, d)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..seeding import normal_many_
from .activations import ACTIVATIONS, activation_fn
from .norms import NORM_FNS, NORM_OPS, PRESET, block_ops
from .norms import identity as _identity
from .spec import BETA_SCALINGS, PLACEMENTS, effective_beta, hidden_width, nominal_ratio

__all__ = ["ACTIVATIONS", "BETA_SCALINGS", "NORM_OPS", "PLACEMENTS", "Block", "ResidualMLP",
           "effective_beta"]


# --------------------------------------------------------------------------- blocks
class Layer(nn.Module):
    """What the layers of a :class:`Stack` share: σ, the branch gain β and whether a skip is
    added (:attr:`scale`)."""

    def __init__(self, width: int, activation: str, beta: float, has_skip: bool):
        super().__init__()
        self.width, self.activation, self.sigma = width, activation, activation_fn(activation)
        self.beta, self.has_skip = float(beta), bool(has_skip)

    @property
    def scale(self) -> float:
        """The factor in front of the branch: β on a residual layer, 1 on a plain one."""
        return self.beta if self.has_skip else 1.0


class Block(Layer):
    """One layer ``h_l = R(skip + β B(f(P(x))))`` (Eq. 17) for E members, built by
    :class:`ResidualMLP`: ``ops`` are its (P, B, R) (``None``: the identity), ``beta`` already
    depth-scaled; without ``has_skip`` it is a plain layer ``R(B(f(P(x))))`` with no β.  Weights
    ``w`` (M=1), ``w_up``/``w_down`` (M=2), ``w_gate`` (gated): ``(E, fan_out, fan_in)``,
    allocated uninitialized.
    """

    def __init__(self, width: int, hidden: int, *, matrices: int, activation: str,
                 ops: tuple[str | None, str | None, str | None], beta: float, has_skip: bool,
                 members: int, dtype: torch.dtype, device: str | torch.device):
        super().__init__(width, activation, beta, has_skip)
        self.matrices, self.hidden, self.gated = matrices, hidden, activation == "swiglu"
        #: the ops P, B, R of Eq. 17 by name (``None`` = identity)
        self.pre_op, self.out_op, self.post_op = ops
        self.pre_norm, self.out_norm, self.res_norm = (
            NORM_FNS[op] if op else _identity for op in ops)
        e, d, m = members, width, hidden
        kw = {"dtype": dtype, "device": device}
        if matrices == 1:
            self.w = nn.Parameter(torch.empty(e, d, d, **kw))
        else:
            if self.gated:
                self.w_gate = nn.Parameter(torch.empty(e, m, d, **kw))
            self.w_up = nn.Parameter(torch.empty(e, m, d, **kw))
            self.w_down = nn.Parameter(torch.empty(e, d, m, **kw))

    def weight_names(self) -> list[str]:
        """Parameter names in initialization order."""
        if self.matrices == 1:
            return ["w"]
        return (["w_gate"] if self.gated else []) + ["w_up", "w_down"]

    def preactivation(self, x: Tensor) -> Tensor:
        """``W_up P(x)`` (M=2) or ``W P(x)`` (M=1), shape ``(E, B, m)``: the argument of σ."""
        w = self.w if self.matrices == 1 else self.w_up
        return torch.matmul(self.pre_norm(x), w.mT)

    def f(self, x: Tensor) -> Tensor:
        """The bare branch ``f`` (Eq. 9): ``σ(W x)`` or ``W_down σ(W_up x)`` or SwiGLU."""
        return self.f_parts(x)[1]

    def f_parts(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(z, f(x))``: the preactivation ``z = W x`` / ``W_up x`` ``(E, B, m)`` and the branch
        output ``(E, B, d)`` — the pieces the closed-form Jacobian reuses (σ′ is taken at z)."""
        if self.matrices == 1:
            z = torch.matmul(x, self.w.mT)
            return z, self.sigma(z)
        up = torch.matmul(x, self.w_up.mT)
        if self.gated:
            hidden = self.sigma(torch.matmul(x, self.w_gate.mT)) * up
        else:
            hidden = self.sigma(up)
        return up, torch.matmul(hidden, self.w_down.mT)

    def branch(self, x: Tensor) -> Tensor:
        """``β B(f(P(x)))`` (β only when the block has a skip), ``(E, B, d)``."""
        return self.scale * self.out_norm(self.f(self.pre_norm(x)))

    def forward(self, x: Tensor, skip: Tensor | None = None, *, part: str = "block") -> Tensor:
        """``R(skip + branch(x))`` (``skip`` None on a plain layer); ``part="branch"`` / ``"f"``:
        :meth:`branch` / :meth:`f` alone (entry points for ``torch.func.functional_call``)."""
        if part == "branch":
            return self.branch(x)
        if part == "f":
            return self.f(x)
        s = self.branch(x)
        if skip is not None:
            s = skip + s
        return self.res_norm(s)


class Stack(nn.Module):
    """What the stacks on one stream share (:class:`ResidualMLP`,
    :class:`~rankexp.models.plain.PlainNet`): sizes, members, β, skips, the trajectory.
    Raises ValueError: a size < 1, ``skip_every`` < 0 or ``alpha`` ≤ 0."""

    def __init__(self, width: int, depth: int, *, alpha: float, beta: float, beta_scaling: str,
                 skip_every: int, seeds: Sequence[int]):
        super().__init__()
        if depth < 1 or width < 1:
            raise ValueError(f"depth={depth} and width={width} must be ≥ 1")
        if skip_every < 0:
            raise ValueError(f"skip_every={skip_every} must be ≥ 0 (0 = no skips)")
        if not alpha > 0:
            raise ValueError(f"alpha={alpha} must be > 0")
        self.width, self.depth, self.alpha, self.skip_every = width, depth, float(alpha), skip_every
        self.seeds = [int(s) for s in seeds]
        self.beta_eff = effective_beta(beta, depth, beta_scaling)

    @property
    def members(self) -> int:
        return len(self.seeds)

    def has_skip(self, layer: int) -> bool:
        """Whether block ``layer`` (1-based) adds an identity skip from ``h_{layer−k}``."""
        return self.skip_every > 0 and layer % self.skip_every == 0

    def skip_source(self, layer: int) -> int:
        """Index j of the stream state ``h_j`` the skip of block ``layer`` carries."""
        return layer - self.skip_every

    def walk(self, upto: int | None = None) -> Iterator[tuple[int, nn.Module]]:
        """Yield ``(l, block)`` for l = 1…upto (default L), in order."""
        yield from enumerate(self.blocks[: upto if upto is not None else self.depth], start=1)

    def states(self, h0: Tensor, upto: int | None = None, **kw) -> Iterator[tuple[int, Tensor]]:
        """Yield ``(l, h_l)`` for l = 1…upto (default L), keeping only the states a later skip
        reads (memory ``max(k, 1)`` states instead of L + 1); inputs ``(E, B, d)``; ``kw`` go to
        each block."""
        keep, window = max(self.skip_every, 1), {0: h0}
        for l, block in self.walk(upto):
            skip = window[self.skip_source(l)] if block.has_skip else None
            window[l] = block(window[l - 1], skip, **kw)
            window.pop(l - keep, None)
            yield l, window[l]

    def forward(self, h0: Tensor, **kw) -> Tensor:
        """``h_L`` for inputs ``h0`` of shape ``(E, B, d)``."""
        return self.trajectory(h0, **kw)[-1]

    def trajectory(self, h0: Tensor, upto: int | None = None, **kw) -> list[Tensor]:
        """Stream states ``[h_0, h_1, …, h_upto]`` (default upto = L), each ``(E, B, d)``."""
        return [h0, *(h for _, h in self.states(h0, upto, **kw))]


class ResidualMLP(Stack):
    """A stack of L blocks on a width-d residual stream (the study, Eq. 17).

    Args:
        width, depth: d, L ≥ 1.  expansion: m/d of two-matrix branches.  matrices: M ∈ {1, 2}.
        activation, placement, norm_op: of :data:`ACTIVATIONS`, :data:`PLACEMENTS`,
            :data:`NORM_OPS`.
        pre, out, post: P, B, R of Eq. 17 (an op or ``"none"``), each overriding the preset's
            slot (default ``PRESET``); Figure 4b is ``placement="pre", post="detached"``.
        alpha: init scale α > 0.  beta, beta_scaling: β, and its depth scaling.
        skip_every: identity skip every k blocks (1: residual, k > 1: Figure 1's sawtooth,
            0: plain MLP).
        seeds: one seed per member (:meth:`reset_parameters`).  dtype, device: of the weights.
        streamed: draw each block's weights only when :meth:`walk` reaches it, into one buffer
            per weight name shared by every block (bit for bit the same numbers; NaN outside
            a walk).

    Shapes: ``forward`` maps ``(E, B, d) → (E, B, d)`` with E = ``len(seeds)``.
    """

    def __init__(
        self,
        width: int = 256,
        depth: int = 48,
        *,
        expansion: float = 4.0,
        matrices: int = 2,
        activation: str = "relu",
        placement: str = "pre",
        norm_op: str = "rmsnorm",
        pre: str | None = PRESET,
        out: str | None = PRESET,
        post: str | None = PRESET,
        alpha: float = 1.0,
        beta: float = 1.0,
        beta_scaling: str = "const",
        skip_every: int = 1,
        seeds: Sequence[int] = (0,),
        dtype: torch.dtype = torch.float64,
        device: str | torch.device = "cpu",
        streamed: bool = False,
    ):
        super().__init__(width, depth, alpha=alpha, beta=beta, beta_scaling=beta_scaling,
                         skip_every=skip_every, seeds=seeds)
        self.placement, self.norm_op = placement, norm_op
        self.pre_op, self.out_op, self.post_op = block_ops(placement, norm_op, pre, out, post)
        if norm_op not in NORM_OPS:
            raise ValueError(f"norm_op={norm_op!r} is not one of {', '.join(NORM_OPS)}")
        if matrices not in (1, 2):
            raise ValueError(f"matrices={matrices!r}: a branch has M = 1 or 2 weight matrices")
        if activation == "swiglu" and matrices != 2:
            raise ValueError("activation='swiglu' is a gated M = 2 branch; set matrices=2")
        self.matrices, self.activation = matrices, activation
        self.blocks = nn.ModuleList(
            Block(width, hidden_width(width, expansion, matrices), matrices=matrices,
                  activation=activation, ops=(self.pre_op, self.out_op, self.post_op),
                  beta=self.beta_eff, has_skip=self.has_skip(l), members=len(self.seeds),
                  dtype=dtype, device=device)
            for l in range(1, depth + 1)
        )
        self.streamed = bool(streamed)
        #: [wall, CPU] seconds spent drawing weights so far (construction, and each walk's
        #: blocks when streamed); shared, so a caller may keep it after the model is gone
        self.draw_seconds = [0.0, 0.0]
        if self.streamed:  # every block's weights are views of one buffer per name
            first = self.blocks[0]
            self._buffers_streamed = {
                n: torch.full_like(getattr(first, n).data, float("nan")) for n in first.weight_names()}
            for block in self.blocks:
                for n, buf in self._buffers_streamed.items():
                    getattr(block, n).data = buf
        self.reset_parameters()

    @property
    def nominal_ratio(self) -> float:
        """βα^M, the nominal branch-to-skip ratio (Eq. 21 at ‖h‖ = √d)."""
        return nominal_ratio(self.beta_eff, self.alpha, self.matrices)

    def _targets(self, blocks: Sequence[int]) -> list[tuple[Tensor, int, float]]:
        """``(weight, draw number, α/√fan_in)`` of every matrix of the blocks at these 0-based
        indices: block 1…L, within a block :meth:`Block.weight_names`, numbered in that order."""
        targets = []
        for i in blocks:
            block = self.blocks[i]
            names = block.weight_names()
            for j, name in enumerate(names):
                w = getattr(block, name).data
                targets.append((w, i * len(names) + j, self.alpha / math.sqrt(w.shape[-1])))
        return targets

    @contextmanager
    def _drawing(self):
        """Adds the wall and CPU seconds of its body to :attr:`draw_seconds`."""
        t, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.draw_seconds[0] += time.perf_counter() - t
            self.draw_seconds[1] += time.process_time() - c

    def reset_parameters(self) -> None:
        """Draw every weight from ``N(0, α²/fan_in)``, member e from seed ``seeds[e]``, matrix
        by matrix as :meth:`_targets` numbers them (:func:`rankexp.seeding.normal_many_`).  A
        ``streamed`` model draws nothing here: :meth:`walk` draws each block as it reaches it.
        """
        if not self.streamed:
            with self._drawing():
                normal_many_(self._targets(range(self.depth)), self.seeds)

    def walk(self, upto: int | None = None) -> Iterator[tuple[int, Block]]:
        """Yield ``(l, block)`` for l = 1…upto (default L), in order: the way every pass over
        the blocks reads them.  A ``streamed`` model draws block l's weights just before it is
        yielded and sets its buffers to NaN when the walk ends; the consumer must be done with
        block l when it asks for block l + 1."""
        try:
            for l, block in super().walk(upto):
                if self.streamed:  # block l's weights into the shared buffers
                    with self._drawing():
                        normal_many_(self._targets([l - 1]), self.seeds)
                yield l, block
        finally:
            if self.streamed:
                for buf in self._buffers_streamed.values():
                    buf.fill_(float("nan"))

