"""castle: CASTLE attention (Causal Attention with Lookahead Keys) from libcastle, for NumPy,
pyopencl and (castle.torch) PyTorch.

castle.library_path is the libcastle this process loaded and castle.library_origin how it was
found (CASTLE_LIBRARY, this checkout's build, or an installed copy)."""

from ._lib import library_origin, library_path, lib as _clib
from ._core import (Cache, CastleError, CausalCache, Device, DeviceInfo, backward, causal_backward, causal_forward,
                    default_device, devices, forward)

__version__ = "0.1.0"
library_version = _clib.castle_version_string().decode()

__all__ = ["forward", "backward", "causal_forward", "causal_backward", "Cache", "CausalCache", "Device", "DeviceInfo", "devices",
           "default_device", "CastleError", "library_path", "library_origin", "library_version"]
