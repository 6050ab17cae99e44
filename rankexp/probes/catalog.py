"""What every probe declares, without torch: its options, its per-seed memory, its needs.

The config schema, ``rankexp --help`` and the checks before any run read these declarations; each
probe module imports its options from here. :data:`rankexp.probes.PROBES` ties names to functions.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: sweep needs (what :func:`rankexp.probes.jacobian.forward_sweep` computes): ``∂h_L/∂h_0``
#: (unit + log gain) and its singular values
IO_JACOBIAN = "io_jacobian"
#: erank / stable rank / log gain of every ``∂h_l/∂h_0`` (the profile)
PARTIAL_SPECTRA = "partial_spectra"
#: ``‖J_b‖_F/√d`` per layer (the branch-to-skip ratio, Eq. 4)
BRANCH_NORMS = "branch_norms"
#: ``‖Σ_{l≤k} J_b‖_F/√d`` per layer (accumulated branch, Figure 5b)
BRANCH_SUM = "branch_sum"
#: what the forward sweep can compute; ``rms(h_l)`` of its input comes with every sweep
SWEEP_NEEDS = frozenset({IO_JACOBIAN, PARTIAL_SPECTRA, BRANCH_NORMS, BRANCH_SUM})
#: the layer fold of the path-order dynamic program (Eq. 12; :data:`rankexp.probes.FOLDS`)
PATH_ORDERS = "path_orders"


#: the least value of a count option, whichever probe has it (``n``: probe inputs, ≥ 2)
LEAST = {"n": 2, "inputs": 1, "batch": 1, "images": 1, "chunk": 1, "max_order": 0, "classes": 2}


#: ``task.options.deep_linear``: the learning-time grid and the ``[N, a₀]`` chains simulated
DEEP_LINEAR_DEFAULTS = {"depths": list(range(1, 17)), "a0": [0.5, 0.7, 0.9, 1.0], "s": 1.0,
                        "simulate": [[3, 0.7], [4, 0.9], [6, 0.9]], "sim_width": 4}
#: ``task.options.<probe>`` defaults of each probe that has options (``Probe.options``): the
#: probe, its memory estimate, the config schema and ``--help`` read them
OPTIONS: dict[str, dict] = {
    "stream": {"inputs": 1},  # n Gaussian inputs (1: the seed's own h_0)
    "path_order": {"max_order": None, "chunk": 64},
    "representation": {"n": 1024},  # n probe inputs
    # the output gradient δ_L: ``random`` or ``cross_entropy`` over ``classes``
    "backward_representation": {"n": 1024, "delta": "random", "classes": 10},
    "branch_jacobian": {"layers": None, "reference_draws": 4},
    "activation_spike": {"n": 2048, "layers": [1]},  # 1-based layers
    "norm_jacobian": {"input_mean": 1.0},  # added to the Gaussian input (in units of its rms)
    # step angle ε (radians) and the lengths L read off the walk
    "projection_walk": {"step_angle": 0.15, "depths": [48, 96, 192, 384], "walk": "gaussian"},
    "correlation": {"n": 2, "c0": 0.5, "q0": 1.0, "fit_from": 1, "chi_from": None, "tangents": 4},
    "jacobian_spectrum": {"q0": "fixed_point", "bins": 60},
    "deep_linear": DEEP_LINEAR_DEFAULTS,
    "gradient_norms": {"batch": 128},  # Gaussian inputs per member
    "shattered": {"points": 256, "lo": -2.0, "hi": 2.0},  # grid points on [lo, hi]
    "grad_norm_proxy": {"batch": 128},
    "jacob_cov": {"batch": 128, "k": 1e-5},  # N Gaussian inputs per member, Mellor et al.'s k
    "ffn_jacobian": {"first_block": 2},  # the first block in the cosines and sums (the study: 2)
    "layer_response": {"images": 10000, "batch": 500},
    "init_gradient_norms": {"batch": 256, "batch_seed": 0},
    "lesion": {"images": 10000, "batch": 250},
}


def probe_options(options: Mapping, name: str, defaults: dict | None = None) -> dict:
    """``options[name]`` merged over ``defaults`` (default :data:`OPTIONS`; the checks before a
    run call it too).

    Raises:
        ValueError: a key the probe does not know (lists the allowed ones), a count below
            its :data:`LEAST`.
    """
    given = dict(options.get(name) or {})
    defaults = OPTIONS.get(name, {}) if defaults is None else defaults
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(
            f"task.options.{name}: unknown key(s) {sorted(unknown)}; allowed: {sorted(defaults)}"
        )
    for key, v in given.items():
        if key in LEAST and v is not None and not (isinstance(v, int) and v >= LEAST[key]):
            raise ValueError(f"task.options.{name}.{key}={v} — must be an integer ≥ {LEAST[key]}")
    return {**defaults, **given}


def _given(options: Mapping, name: str) -> dict:
    """``options[name]`` over its :data:`OPTIONS` without the key check (memory estimates)."""
    return {**OPTIONS[name], **dict(options.get(name) or {})}


# --------------------------------------------------------------------------- memory
#: per-seed working memory of a probe in bytes: ``fn(shape, options)``
MemoryEstimate = Callable[["ModelShape", Mapping], float]


@dataclass(frozen=True)
class ModelShape:
    """What a memory estimate needs to know about the network (one seed); ``deferred_spectra``:
    the sweep keeps every partial Jacobian for one batched spectrum call (on an accelerator)."""

    width: int
    depth: int
    hidden: int
    matrices: int
    skip_every: int
    itemsize: int
    deferred_spectra: bool = False


def sweep_memory(shape: ModelShape, options: Mapping) -> float:
    """Working set of the forward sweep per seed: the skip window of partials, two buffers,
    ``J_b``, the branch sum and temporaries (≈ (k + 6)·d² numbers)."""
    return (max(shape.skip_every, 1) + 6) * shape.width**2 * shape.itemsize


def profile_memory(shape: ModelShape, options: Mapping) -> float:
    """The sweep's working set, plus the L partials (L·d²) where the spectra are deferred."""
    kept = shape.depth * shape.width**2 * shape.itemsize if shape.deferred_spectra else 0
    return sweep_memory(shape, options) + kept


# --------------------------------------------------------------------------- the forward sweep's probes (sweep.py)

def stream_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: the skip window of n stream states plus one block's hidden activations."""
    n = int(_given(options, "stream")["inputs"])
    return n * (shape.width * (max(shape.skip_every, 1) + 3) + 2 * shape.hidden) * shape.itemsize


# --------------------------------------------------------------------------- path orders (paths.py, Eq. 12)

def path_order_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: the ``K+1`` stored orders plus a chunk of temporaries, and the sweep's."""
    opt = _given(options, "path_order")
    k = shape.depth if opt["max_order"] is None else min(int(opt["max_order"]), shape.depth)
    chunk = min(int(opt["chunk"]), k + 1)
    return (k + 1 + 3 * chunk) * shape.width**2 * shape.itemsize + sweep_memory(shape, options)


# --------------------------------------------------------------------------- representations (representation.py, Figures 7/14/15, Appendix C)

def representation_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: the skip window of n states, one block's hidden activations, the running
    unit sum and the L branch means."""
    n = int(_given(options, "representation")["n"])
    d, m = shape.width, shape.hidden
    return (n * (d * (max(shape.skip_every, 1) + 5) + 2 * m) + shape.depth * d) * shape.itemsize


def backward_representation_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: √L checkpoint windows of n states, a segment of states, autograd buffers."""
    n = int(_given(options, "backward_representation")["n"])
    d, m, k = shape.width, shape.hidden, max(shape.skip_every, 1)
    seg = math.isqrt(max(shape.depth - 1, 0)) + 1
    return n * (d * (2 * seg * k + 8) + 4 * m) * shape.itemsize


# --------------------------------------------------------------------------- branch Jacobians, spike, projection split (branch.py, Figures 4c/8/9, Table 1)

def branch_jacobian_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: ``A`` and ``J_f`` of one layer, its Gram matrix, and the kept eigenvalues."""
    d, m = shape.width, shape.hidden
    return (3 * m * d + 4 * d * d + shape.depth * d) * shape.itemsize



def activation_spike_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: n inputs' stream window and hidden activations, and the Gram matrix."""
    n = int(_given(options, "activation_spike")["n"])
    d, m = shape.width, shape.hidden
    return (n * (d * (max(shape.skip_every, 1) + 3) + 3 * m) + min(n, m) ** 2 * 2) * shape.itemsize


def projection_split_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: three running products over the skip window, J_b, J_R and temporaries."""
    return (3 * max(shape.skip_every, 1) + 10) * shape.width**2 * shape.itemsize


# --------------------------------------------------------------------------- Table 2 and Table 3 (norm_jacobian.py, walk.py)

def norm_jacobian_memory(shape: ModelShape, options: Mapping) -> float:
    """Two dense d×d Jacobians, the autograd intermediates and the SVD: ≈ 6 d² numbers."""
    return 6 * shape.width**2 * shape.itemsize



def projection_walk_memory(shape: ModelShape, options: Mapping) -> float:
    """Q, its update and the SVD workspace (≈ 4 d²) plus the walk ((L+1)·d)."""
    depths = _given(options, "projection_walk")["depths"]
    return (4 * shape.width**2 + (max(depths) + 1) * shape.width) * shape.itemsize


# --------------------------------------------------------------------------- zero-cost proxies (proxies.py)

def _backward_memory(shape: ModelShape, batch: int) -> float:
    """One backward through the stack for ``batch`` inputs: autograd keeps ≈ 3 stream-sized and
    2 hidden-sized tensors per block, plus the weights' gradients (L·M matrices)."""
    d, m = shape.width, shape.hidden
    acts = shape.depth * batch * (3 * d + 2 * m)
    return (acts + shape.depth * shape.matrices * d * max(d, m)) * shape.itemsize


def grad_norm_proxy_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: :func:`_backward_memory` of ``batch`` inputs."""
    return _backward_memory(shape, int(probe_options(options, "grad_norm_proxy")["batch"]))


def jacob_cov_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: :func:`_backward_memory` of N inputs plus the N × N correlation matrix."""
    n = int(probe_options(options, "jacob_cov")["batch"])
    return _backward_memory(shape, n) + 3 * n * n * 8


def synflow_memory(shape: ModelShape, options: Mapping) -> float:
    """Per seed: a float64 copy of the weights and their gradients, one input's backward."""
    d, m = shape.width, shape.hidden
    return 2 * shape.depth * shape.matrices * d * max(d, m) * 8 + _backward_memory(shape, 1) / \
        shape.itemsize * 8


# --------------------------------------------------------------------------- causal LMs (ffn.py, Figure 12)

def ffn_jacobian_memory(shape: ModelShape, options: Mapping) -> float:
    """Per-seed bytes beyond the FFN weights: embeddings (GPT-2's vocabulary and positions),
    attention (4 d² per block), the L Jacobians and one (d, m) temporary."""
    d, L, b = shape.width, shape.depth, shape.itemsize
    return ((50257 + 1024) * d + 4 * L * d * d + L * d * d + 4 * d * d) * b


# --------------------------------------------------------------------------- the CIFAR ConvNets (convnet.py, the degradation replication)

@dataclass(frozen=True)
class ConvShape:
    """What a memory estimate needs to know about one member of a :class:`CifarResNet`: ``depth``
    6n + 2, ``base_width`` (stage-1 filters, 16), ``itemsize`` (bytes per number)."""

    depth: int
    base_width: int
    itemsize: int
    num_classes: int = 10

    @property
    def n(self) -> int:
        return (self.depth - 2) // 6

    def layer_sizes(self) -> list[int]:
        """Numbers per image of each conv layer's output, layers 1 … 6n+1 (C·H·W)."""
        w, n = self.base_width, self.n
        return [w * 32 * 32] * (2 * n + 1) + [2 * w * 16 * 16] * (2 * n) + [4 * w * 8 * 8] * (2 * n)

    def parameters(self) -> int:
        """Trainable numbers of one member (convs, BN scale/shift, classifier; closed form of
        :meth:`CifarResNet.parameter_count`) plus its BN running statistics."""
        w, n = self.base_width, self.n
        convs = 9 * 3 * w + sum(9 * (c // 2 if stage and b == 0 else c) * c + 9 * c * c
                                for stage, c in enumerate((w, 2 * w, 4 * w)) for b in range(n))
        bn = 4 * (w + 2 * n * (w + 2 * w + 4 * w))  # weight, bias, running mean, running var
        return convs + bn + self.num_classes * (4 * w + 1)

    def weight_bytes(self) -> int:
        return self.parameters() * self.itemsize


def layer_response_memory(shape: ConvShape, options: Mapping) -> float:
    """No-grad forward in batches: a block's input, conv, BN and ReLU outputs at the widest
    layer, plus the hook's squared copy (5 × the largest layer × batch)."""
    batch = probe_options(options, "layer_response")["batch"]
    return 5.0 * max(shape.layer_sizes()) * int(batch) * shape.itemsize


def init_gradient_norms_memory(shape: ConvShape, options: Mapping) -> float:
    """One backward through the whole network: autograd keeps ≈ 3 tensors per conv layer (the
    conv's input, the BN's input, the ReLU's output), the backward ≈ 4 more of the widest."""
    batch = probe_options(options, "init_gradient_norms")["batch"]
    sizes = shape.layer_sizes()
    return (3.0 * sum(sizes) + 4.0 * max(sizes)) * int(batch) * shape.itemsize + shape.weight_bytes()


def lesion_memory(shape: ConvShape, options: Mapping) -> float:
    """No-grad forward keeping every block's input of one batch (≈ every second layer's
    output), plus 4 × the widest layer for the running block."""
    batch = probe_options(options, "lesion")["batch"]
    sizes = shape.layer_sizes()
    return (sum(sizes[::2]) + 4.0 * max(sizes)) * int(batch) * shape.itemsize


# --------------------------------------------------------------------------- the registry's entries
#: model families a probe runs on (``Probe.families``): the residual MLP and the plain nets
RESIDUAL = frozenset({"mlp", "plain"})
PLAIN = frozenset({"plain"})
LM = frozenset({"gpt2"})
CONVNET = frozenset({"cifar_resnet"})
#: tasks a probe runs under (``Probe.tasks``)
ANY_TASK = frozenset({"measure", "train"})
TRAINED = frozenset({"train"})


@dataclass(frozen=True)
class Ref:
    """A function named by module and attribute, imported on first call (``"sweep:probe_stream"``
    is :func:`rankexp.probes.sweep.probe_stream`), so the registry costs no import of torch."""

    path: str

    def resolve(self, *default: Any) -> Any:
        """The function (``default``, where given, if the module has none of that name)."""
        module, _, attr = self.path.partition(":")
        return getattr(importlib.import_module(f"rankexp.probes.{module}"), attr, *default)


@functools.cache
def _defs(module: str) -> dict[str, Any]:
    """Top-level function name → its ``ast.FunctionDef`` in ``rankexp/probes/<module>.py``."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).parent / f"{module}.py").read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


@functools.cache
def _logged(module: str, roots: tuple[str, ...]) -> frozenset[str] | None:
    """The metric names functions ``roots`` of ``rankexp/probes/<module>.py`` and the module's
    functions they call log (a seed stat or series also as ``<name>_std``), read from the
    source; None where a name is computed."""
    import ast

    defs = _defs(module)
    todo, seen, names = list(roots), set(roots), set()
    while todo:
        for node in ast.walk(defs[todo.pop()]):
            keys, call = [], isinstance(node, ast.Call)
            attr = getattr(node.func, "attr", None) if call else None
            if call and getattr(node.func, "id", None) in defs.keys() - seen:
                seen.add(node.func.id)
                todo.append(node.func.id)
            elif attr in ("add_seed_stat", "add_seed_series"):
                keys = [node.args[0], ast.Constant(f"{getattr(node.args[0], 'value', '')}_std")]
            elif attr == "update" and getattr(node.func.value, "attr", "") in ("scalars", "series"):
                keys = node.args + [ast.Constant(k.arg) for k in node.keywords]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and getattr(
                    node.value, "attr", "") in ("scalars", "series"):
                keys = [node.slice]
            for k in keys:
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    return None
                names.add(k.value)
    return frozenset(names)


@dataclass(frozen=True)
class Probe:
    """A registered probe: the function, what it needs, how to pool seeds, its memory.

    Attributes:
        ref: ``fn(ctx) -> Measurement`` on one batch of seeds, ``"<module>:probe_<name>"`` for
            the probe ``<name>``. Where the module also has ``reduce_<name>``, ``fn`` leaves
            per-seed arrays in ``m.arrays`` and ``reduce(m, ctx)`` adds what is pooled over
            seeds to the joined measurement (``ctx`` is any chunk's context).
        needs: intermediates read from ``ctx`` (see :mod:`rankexp.probes.base`).
        memory: per-seed working memory in bytes beyond the weights (default: ``<name>_memory``
            of this module, else the sweep's).
        splits_seeds: ``False`` for a probe that pools over all seeds inside ``fn`` without a
            ``reduce``: its seeds always run as one batch.
        options: ``task.options.<name>`` defaults (default: :data:`OPTIONS`; the config schema
            and ``--help`` read them).
        families: the model families (``model.name``) it runs on; others are refused before
            any run (:func:`rankexp.config.checks.check_family`).
        tasks: the tasks it runs under.
        inputs: ``batch``, or ``one`` (one input per seed: a batchnorm has no batch).
        streams: it reads the weights only through the shared forward sweep, so a measurement of
            only such probes may draw weights block by block (:func:`rankexp.memory.streams_weights`).
    """

    ref: Ref
    needs: frozenset[str] = frozenset()
    memory: MemoryEstimate | None = None
    splits_seeds: bool = True
    options: Mapping[str, Any] | None = None
    families: frozenset[str] = RESIDUAL
    tasks: frozenset[str] = ANY_TASK
    inputs: str = "batch"
    streams: bool = False

    def __post_init__(self) -> None:
        name = self.ref.path.partition(":probe_")[2]
        if self.options is None:
            object.__setattr__(self, "options", OPTIONS.get(name, {}))
        if self.memory is None:
            object.__setattr__(self, "memory", globals().get(f"{name}_memory", sweep_memory))

    @property
    def fn(self) -> Callable[..., Any]:
        return self.ref.resolve()

    @property
    def reduce(self) -> Callable[..., None] | None:
        return Ref(self.ref.path.replace(":probe_", ":reduce_")).resolve(None)

    @property
    def doc(self) -> str:
        """The first paragraph of ``fn``'s docstring, one line, read from its module's source
        (``--help`` imports no probe code)."""
        import ast

        module, _, attr = self.ref.path.partition(":")
        doc = ast.get_docstring(_defs(module)[attr]) or ""
        return " ".join(doc.strip().split("\n\n")[0].split())

    @property
    def metrics(self) -> frozenset[str] | None:
        """The metrics it logs, read from the source of ``fn`` and ``reduce`` (``--help``'s
        way); None when they compute a name (it may log any)."""
        module, _, attr = self.ref.path.partition(":")
        reduce = attr.replace("probe_", "reduce_", 1)
        return _logged(module, (attr, reduce) if reduce in _defs(module) else (attr,))

    def __call__(self, ctx: Any) -> Any:
        """Run on every seed of ``ctx`` at once (``fn`` then ``reduce``)."""
        m = self.fn(ctx)
        if self.reduce is not None:
            self.reduce(m, ctx)
        return m


def needs_of(probes: Iterable[Probe]) -> frozenset[str]:
    """The union of the probes' needs: what the context must compute."""
    return frozenset().union(*(p.needs for p in probes))
