"""Model families, chosen by the ``model=`` config group (``conf/model/``).

Each family is one module (``mlp.py``: the residual MLP of the study; ``plain.py``: the
mean-field plain networks of the textbook chapter; ``convnet.py``: He et al.'s CIFAR ResNets
and plain ConvNets; ``gpt2.py``: Hugging Face causal LMs, which imports ``transformers`` only
when built) and one builder in :mod:`.build`; each is declared once, torch-free, in
:mod:`.families` (schema, builder, tasks, run name, derived params, memory shape, rules), and
:data:`FAMILIES` maps the group's ``model.name`` to its builder.  Models never import probes.

This package imports nothing heavy itself: :mod:`.spec` (names, Eq. 17's slots, GPT-2's
shapes) is torch-free, so composing and checking a config never loads torch; the builders and
the torch dtypes (``build_model``, ``FAMILIES``, ``DTYPES``, ``build_mlp`` …) are loaded on first
use (PEP 562).
"""

from __future__ import annotations

from typing import Any

#: names this package serves from :mod:`.build` (which imports torch) on first access
_BUILD = ("DTYPES", "FAMILIES", "build_cifar_resnet", "build_gpt2", "build_mlp", "build_model",
          "build_plain")

#: the modules of this package that import no torch (config checks, --help and a tab press
#: read them; tests/test_cli.py and benchmarks/bench_cli.py check nothing else is imported)
TORCH_FREE = ("rankexp.models.spec", "rankexp.models.families")

__all__ = [*_BUILD, "TORCH_FREE"]


def __getattr__(name: str) -> Any:
    if name in _BUILD:
        from . import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
