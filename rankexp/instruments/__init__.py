"""The study's instruments on any PyTorch network (:func:`analyze`) and during training."""

from .blocks import BlockError, BlockSpec, UnitBlock, discover
from .core import PROBES, BlockRecord, SizeError, analyze, block_records
from .matfree import MatrixFree, Spectrum, dense_spectrum, slq_spectrum
from .monitor import SpectralMonitor

__all__ = ["PROBES", "BlockError", "BlockRecord", "BlockSpec", "MatrixFree", "SizeError",
           "SpectralCallback", "SpectralMonitor", "Spectrum", "UnitBlock", "analyze", "block_records",
           "dense_spectrum", "discover", "slq_spectrum"]


def __getattr__(name: str):
    if name == "SpectralCallback":  # subclasses transformers.TrainerCallback: built on first use
        from .monitor import spectral_callback_class

        return spectral_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
