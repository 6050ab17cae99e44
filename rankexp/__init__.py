"""rankexp: rank, magnitude and trainability of residual MLPs across depth.

Entry point: ``python -m rankexp`` (Hydra; configs in ``conf/``).
"""

__version__ = "0.1.0"

import warnings as _warnings

# torch's forward-mode AD loads TorchScript decompositions on first use; the
# deprecation notice is torch-internal and says nothing about rankexp.
_warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
