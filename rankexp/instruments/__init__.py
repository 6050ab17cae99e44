"""The study's instruments on any PyTorch network, and during anyone's training.

* :func:`analyze` — one call, a pandas DataFrame with one row per block: erank/D and stable rank
  of the branch Jacobian and of the stream's prefix Jacobian, the branch-to-skip ratio, the
  representation erank and rms (exact up to a size bound, matrix-free estimates with errors
  above; :mod:`.core`); :func:`block_records` is the same as records a probe can wrap.
* :class:`SpectralMonitor` — :func:`analyze` every N optimizer steps, logged to the active MLflow
  run (:mod:`.monitor`); ``SpectralCallback`` wraps it for a Hugging Face ``Trainer``.

Layout: :mod:`.blocks` finds blocks and turns them into maps of one stream vector
(:class:`BlockSpec`, :class:`UnitBlock`); :mod:`.families` does it for rankexp's own families;
:mod:`.matfree` is the pure linear algebra (exact and matrix-free spectra, no models);
:mod:`.core` differentiates the units and tabulates; :mod:`.monitor` is the only part with a
side effect (logging).
"""

from .blocks import BlockError, BlockSpec, UnitBlock, discover
from .core import PROBES, BlockRecord, SizeError, analyze, block_records, records_frame
from .matfree import MatrixFree, Spectrum, dense_spectrum, slq_spectrum
from .monitor import SpectralMonitor

__all__ = ["PROBES", "BlockError", "BlockRecord", "BlockSpec", "MatrixFree", "SizeError",
           "SpectralCallback", "SpectralMonitor", "Spectrum", "UnitBlock", "analyze", "block_records",
           "dense_spectrum", "discover", "records_frame", "slq_spectrum"]


def __getattr__(name: str):
    if name == "SpectralCallback":  # subclasses transformers.TrainerCallback: built on first use
        from .monitor import spectral_callback_class

        return spectral_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
