"""rankexp: rank, magnitude and trainability of residual MLPs across depth.

Entry point: ``python -m rankexp`` (Hydra; configs in ``conf/``).  In Python,
``rankexp.analyze(model, inputs)`` measures the study's quantities on any network and
``rankexp.SpectralMonitor`` does so during training (:mod:`rankexp.instruments`); both are
imported on first use, so ``import rankexp`` stays free of torch.
"""

__version__ = "0.1.0"

import warnings as _warnings

# torch's forward-mode AD loads TorchScript decompositions on first use; the
# deprecation notice is torch-internal and says nothing about rankexp.
_warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)

#: public names served lazily from :mod:`rankexp.instruments` (module-level ``__getattr__``)
_LAZY = ("analyze", "block_records", "SpectralMonitor", "SpectralCallback", "BlockSpec", "MatrixFree")

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        from . import instruments

        return getattr(instruments, name)
    raise AttributeError(f"module 'rankexp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
