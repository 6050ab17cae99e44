"""Blocks of any network as maps ``h_{l−1} ↦ h_l`` of one stream vector (a *unit*: one input,
or one token) around a *branch* ``f``; found in Hugging Face causal LMs (Figure 12), torchvision
ResNets and rankexp's families, or given. Blocks chained output to input form a *stage*.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..spectra import erank_from_sv

#: stream vector → stream vector, ``(D,) → (D,)``
VectorMap = Callable[[Tensor], Tensor]

#: where Hugging Face models keep their blocks (tried in order)
HF_BLOCK_PATHS = ("transformer.h", "model.layers", "model.decoder.layers", "gpt_neox.layers",
                  "transformer.blocks", "model.language_model.layers", "h", "layers")
#: (FFN norm, FFN) names to try outside :data:`rankexp.models.gpt2.ARCHITECTURES` (GPT-2, Llama)
HF_FFN_NAMES = (("ln_2", "mlp"), ("post_attention_layernorm", "mlp"))
BRANCH_FFN, BRANCH_RESIDUAL, BRANCH_MLP, BRANCH_UPDATE, BRANCH_LAYER, BRANCH_USER = (
    "ffn", "residual_function", "β·B(f(P(h)))", "block(h) − h", "block(h)", "user")


class BlockError(ValueError):
    """No blocks found, a block that is not shape-preserving, or one not called exactly once."""


@dataclass(frozen=True)
class BlockSpec:
    """One block: ``branch`` f (``None``: block − I when ``residual``, else the block),
    ``branch_input`` (the submodule whose input f reads, e.g. ``ln_2``), ``label`` (the
    ``branch_kind`` column), ``tokenwise`` (f acts on each token alone)."""

    module: nn.Module
    name: str = ""
    branch: Callable[[Tensor], Tensor] | None = None
    branch_input: nn.Module | None = None
    residual: bool = True
    label: str = ""
    tokenwise: bool = False


@dataclass
class UnitBlock:
    """One block at one unit: input ``x`` ``(D,)``, ``step`` ``x ↦ h_l``, ``branch`` at ``branch_x``
    (``None``: ``step − I`` or ``step``), representation statistics over every input."""

    index: int
    name: str
    member: int
    stage: int
    x: Tensor
    step: VectorMap
    branch_x: Tensor
    branch: VectorMap | None
    residual: bool
    label: str
    representation: float | None
    rms: float | None
    rows: int

    @property
    def dim(self) -> int:
        return self.x.numel()


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the duration, every submodule's training flag restored after."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def _first_tensor(out):
    if isinstance(out, Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    if isinstance(out, Mapping):
        return next(v for v in out.values() if isinstance(v, Tensor))
    raise BlockError(f"a block returned {type(out).__name__}, not a tensor or a tuple starting with one")


def map_tensors(v, fn: Callable[[Tensor], Tensor]):
    """``fn`` applied to every tensor of ``v``, a tensor or a (nested) tuple, list or dict."""
    if isinstance(v, Tensor):
        return fn(v)
    if isinstance(v, (tuple, list)):
        return (tuple if isinstance(v, tuple) else list)(map_tensors(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: map_tensors(x, fn) for k, x in v.items()}
    return v


def _take(v, point: int, batch: int):
    """Input ``point`` of every tensor of ``v`` whose leading dimension is the batch."""
    return map_tensors(v, lambda t: t[point:point + 1] if batch > 1 and t.dim() > 0
                       and t.shape[0] == batch else t)


def call_model(model: nn.Module, inputs) -> object:
    """``model(**inputs)``, ``model(*inputs)`` or ``model(inputs)``; HF models get ``use_cache=False``."""
    kwargs = dict(inputs) if isinstance(inputs, Mapping) else {}
    args = () if isinstance(inputs, Mapping) else tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if is_hf(model):
        kwargs.setdefault("use_cache", False)
    return model(*args, **kwargs)


def is_hf(model: nn.Module) -> bool:
    """Whether ``model`` looks like a Hugging Face model (a ``config`` with a ``model_type``)."""
    return hasattr(getattr(model, "config", None), "model_type")


def rows_stats(h: Tensor, token: bool = False) -> tuple[float, float, int]:
    """``(erank(Z)/D, rms, rows)`` of block outputs ``h`` ``(B, …)``, rows uncentred (inputs, or
    inputs × tokens)."""
    z = h.reshape(-1, h.shape[-1]) if token else h.reshape(h.shape[0], -1)
    n, d = z.shape
    gram = z.mT @ z if n >= d else z @ z.mT
    ev = torch.linalg.eigvalsh(gram.double()).clamp(min=0).flip(-1)
    rms = torch.linalg.vector_norm(z, dtype=torch.float64) / math.sqrt(z.numel())
    return float(erank_from_sv(ev.sqrt()) / d), float(rms), n


def _hf_blocks(model: nn.Module) -> list[BlockSpec]:
    from ..models.gpt2 import ARCHITECTURES

    for path in HF_BLOCK_PATHS:
        try:
            layers = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(layers, nn.ModuleList) and len(layers):
            break
    else:
        return []
    arch = ARCHITECTURES.get(getattr(model.config, "model_type", ""))
    names = [(arch.ffn_norm, arch.ffn)] if arch is not None else list(HF_FFN_NAMES)
    specs = []
    for i, block in enumerate(layers):
        found = next(((n, f) for n, f in names if hasattr(block, n) and hasattr(block, f)), None)
        if found is None:
            specs.append(BlockSpec(block, f"{path}.{i}", label=BRANCH_UPDATE))
            continue
        norm, ffn = getattr(block, found[0]), getattr(block, found[1])
        specs.append(BlockSpec(block, f"{path}.{i}", branch=lambda y, n=norm, f=ffn: f(n(y)),
                               branch_input=norm, label=f"{BRANCH_FFN}: {found[1]}({found[0]}(x))",
                               tokenwise=True))
    return specs


def residual_function(block: nn.Module) -> Callable[[Tensor], Tensor]:
    """He et al.'s F(x) of a torchvision ``BasicBlock``/``Bottleneck``: no identity, no final ReLU."""
    def basic(y):
        return block.bn2(block.conv2(F.relu(block.bn1(block.conv1(y)))))

    def bottleneck(y):
        return block.bn3(block.conv3(F.relu(basic(y))))

    return bottleneck if hasattr(block, "conv3") else basic


def _torchvision_blocks(model: nn.Module) -> list[BlockSpec]:
    specs = []
    for name, m in model.named_modules():
        if (type(m).__name__ in ("BasicBlock", "Bottleneck")
                and type(m).__module__.startswith("torchvision.") and m.downsample is None):
            specs.append(BlockSpec(m, name, branch=residual_function(m), label=BRANCH_RESIDUAL))
    return specs


def discover(model: nn.Module) -> list[BlockSpec]:
    """The blocks of a Hugging Face causal LM or a torchvision ResNet.
    Raises BlockError: none found."""
    specs = _hf_blocks(model) if is_hf(model) else _torchvision_blocks(model)
    if not specs:
        raise BlockError(
            f"no blocks found in {type(model).__name__}: rankexp.analyze finds them in Hugging Face "
            f"causal LMs ({', '.join(HF_BLOCK_PATHS[:3])}, …), torchvision ResNets and rankexp's "
            "families; pass blocks=[…] (module names, modules or BlockSpec) for other networks")
    return specs


def resolve(model: nn.Module, blocks) -> list[BlockSpec]:
    """``blocks`` (names, modules or :class:`BlockSpec`; ``None``: :func:`discover`) as specs.
    Raises BlockError: an empty list, an unknown name, a module that is not part of ``model``."""
    if blocks is None:
        return discover(model)
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for b in blocks:
        if isinstance(b, str):
            try:
                b = BlockSpec(model.get_submodule(b), b)
            except AttributeError as e:
                raise BlockError(f"blocks: {b!r} is not a submodule of {type(model).__name__}") from e
        elif isinstance(b, nn.Module):
            b = BlockSpec(b)
        if id(b.module) not in names:
            raise BlockError(f"blocks: a {type(b.module).__name__} that is not part of {type(model).__name__}")
        label = b.label or (BRANCH_USER if b.branch else BRANCH_UPDATE if b.residual else BRANCH_LAYER)
        out.append(replace(b, name=b.name or names[id(b.module)], label=label))
    if not out:
        raise BlockError("blocks=[]: give at least one block (or None to find them)")
    return out


@dataclass
class _Seen:
    args: tuple = ()
    kwargs: dict | None = None
    key: str | None = None  # the kwarg holding the stream when it is not args[0]
    x: Tensor | None = None  # block input, input `point` only (1, …)
    out: Tensor | None = None
    y: Tensor | None = None  # branch input (1, …)
    stats: tuple[float, float, int] | None = None
    calls: int = 0
    batch: int = 1


def _stream_arg(args, kwargs) -> tuple[Tensor, str | None]:
    if args and isinstance(args[0], Tensor):
        return args[0], None
    key = "hidden_states" if isinstance(kwargs.get("hidden_states"), Tensor) else next(
        (k for k, v in kwargs.items() if isinstance(v, Tensor)), None)
    if key is None:
        raise BlockError("a block was called without a tensor argument (the stream)")
    return kwargs[key], key


def _hooks(specs, seen, point, token, stats):
    def pre(_mod, args, kwargs, s):
        h, key = _stream_arg(args, kwargs)
        s.calls, s.batch = s.calls + 1, h.shape[0]
        s.key, s.x = key, _take(h, point, s.batch).clone()
        s.args = _take(args[1:] if key is None else args, point, s.batch)
        s.kwargs = _take({k: v for k, v in kwargs.items() if k != key}, point, s.batch)

    def post(_mod, _args, _kwargs, out, s):
        o = _first_tensor(out)
        s.out = _take(o, point, s.batch).clone()
        s.stats = rows_stats(o, token) if stats else (None, None, 0)

    def branch_pre(_mod, args, s):
        s.y = _take(args[0], point, args[0].shape[0]).clone()

    handles = []
    for spec, s in zip(specs, seen, strict=True):
        handles.append(spec.module.register_forward_pre_hook(partial(pre, s=s), with_kwargs=True))
        handles.append(spec.module.register_forward_hook(partial(post, s=s), with_kwargs=True))
        if spec.branch_input is not None:
            handles.append(spec.branch_input.register_forward_pre_hook(partial(branch_pre, s=s)))
    return handles


def capture(model: nn.Module, inputs, specs: Sequence[BlockSpec], *, point: int,
            token: bool, stats: bool = True) -> list[_Seen]:
    """One forward pass recording each block's input at ``point``, output, branch input and stats.
    Raises BlockError: a block not called exactly once, or not shape-preserving."""
    seen = [_Seen() for _ in specs]
    handles = _hooks(specs, seen, point, token, stats)
    try:
        with torch.no_grad():
            call_model(model, inputs)
    finally:
        for h in handles:
            h.remove()
    for spec, s in zip(specs, seen, strict=True):
        if s.calls == 1 and s.x.shape[0] == 0:
            raise BlockError(f"point={point}: the inputs hold {s.batch}")
        if s.calls != 1:
            raise BlockError(f"block {spec.name!r} was called {s.calls} times by one forward pass; "
                             "analyze needs each block called once")
        if s.out.shape != s.x.shape:
            raise BlockError(f"block {spec.name!r} is not shape-preserving: input "
                             f"{tuple(s.x.shape[1:])} → output {tuple(s.out.shape[1:])} (per input); "
                             "the instruments need maps of the stream to itself")
        if spec.branch_input is not None and s.y is None:
            raise BlockError(f"block {spec.name!r}: its branch input module was not called")
    return seen


def _unit(sub: Tensor, position: int | None) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """``(put, get)`` between a unit vector ``(D,)`` and ``sub`` ``(1, …)``."""
    if position is None:
        shape = sub.shape
        return (lambda x: x.reshape(shape)), (lambda h: h.reshape(-1))
    if sub.dim() != 3:
        raise BlockError(f"position={position} picks a token of a (batch, tokens, width) stream; "
                         f"this stream is {tuple(sub.shape[1:])} per input (position=None: whole inputs)")
    if not -sub.shape[1] <= position < sub.shape[1]:
        raise BlockError(f"position={position}: the inputs have {sub.shape[1]} tokens")
    t = position % sub.shape[1]
    before, after = sub[:, :t], sub[:, t + 1:]
    return ((lambda x: torch.cat([before, x.reshape(1, 1, -1), after], 1)),
            (lambda h: h[0, t]))


def _through(fn: Callable[[Tensor], Tensor], put, get) -> VectorMap:
    return lambda v: get(fn(put(v)))


def _block_call(module: nn.Module, s: _Seen) -> Callable[[Tensor], Tensor]:
    def call(h):
        if s.key is None:
            return _first_tensor(module(h, *s.args, **s.kwargs))
        return _first_tensor(module(*s.args, **{**s.kwargs, s.key: h}))
    return call


def _stages(seen: Sequence[_Seen]) -> list[int]:
    """Stage per block: a new one wherever a block's input is not the previous output."""
    stage, out = 1, []
    for i, s in enumerate(seen):
        if i and not (s.x.shape == seen[i - 1].out.shape and torch.equal(s.x, seen[i - 1].out)):
            stage += 1
        out.append(stage)
    return out


def hooked_units(model: nn.Module, inputs, specs: Sequence[BlockSpec], *, point: int,
                 position: int | None, member: int = 0, representation: bool = True) -> list[UnitBlock]:
    """:class:`UnitBlock` s of ``specs`` from one hooked forward pass (``position``: the token of a
    ``(B, T, d)`` stream, ``None``: whole inputs)."""
    seen = capture(model, inputs, specs, point=point, token=position is not None, stats=representation)
    units = []
    for i, (spec, s, stage) in enumerate(zip(specs, seen, _stages(seen), strict=True), start=1):
        put, get = _unit(s.x, position)
        call = _block_call(spec.module, s)
        bx, branch = get(s.x), None
        if spec.branch is not None:
            y = s.y if spec.branch_input is not None else s.x
            bput, bget = _unit(y, position)
            bx = bget(y)
            if spec.tokenwise and position is not None:  # the token alone, as (1, 1, d)
                bput, bget = (lambda v: v.reshape(1, 1, -1)), (lambda h: h.reshape(-1))
            branch = _through(spec.branch, bput, bget)
        er, rms, rows = s.stats
        units.append(UnitBlock(
            index=i, name=spec.name, member=member, stage=stage, x=get(s.x),
            step=_through(call, put, get), branch_x=bx, branch=branch,
            residual=spec.residual, label=spec.label, representation=er, rms=rms, rows=rows))
    return units
