"""Model families (``model=``): one network module each, a builder in :mod:`.build` and a
torch-free declaration in :mod:`.families`.  The builders load on first use (PEP 562), so
composing and checking a config never loads torch.
"""

from __future__ import annotations

from typing import Any

#: names this package serves from :mod:`.build` (which imports torch) on first access
_BUILD = ("DTYPES", "build_cifar_resnet", "build_gpt2", "build_mlp", "build_model",
          "build_plain")

#: the modules of this package that import no torch (config checks, --help and a tab press
#: read them; tests/test_cli.py checks nothing else is imported)
TORCH_FREE = ("rankexp.models.spec", "rankexp.models.families")

__all__ = [*_BUILD, "TORCH_FREE"]


def __getattr__(name: str) -> Any:
    if name in _BUILD:
        from . import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
