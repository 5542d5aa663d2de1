"""libckpt: asynchronous, verified checkpoints of NumPy arrays and PyTorch
tensors (CPU and CUDA), through ctypes on the C library libckpt.

    import libckpt
    with libckpt.Store("ckpt", keep_last=3) as store:
        h = store.save(100, {"model": model.state_dict(),
                             "optim": opt.state_dict(), "epoch": 3})
        ...                      # train on while it is written
        h.wait()                 # durable and committed; raises on failure
        step, state = store.load()  # newest that verifies; torch as saved
        model.load_state_dict(state["model"])
        with store.open() as ck:                  # lazy, tensor by tensor
            w = ck.get_tensor("model.fc1.weight")

Errors raise :class:`libckpt.Error` subclasses carrying the C library's
message.  Blocking calls release the GIL.  See docs/PYTHON.md.
"""

from ._version import __version__
from .errors import (AccessError, BusyError, CorruptError, DeviceError, Error,
                     IncompleteError, InternalError, InvalidArgumentError,
                     IoError, MismatchError, NoCheckpointError, NoDeviceError,
                     NoSpaceError, NotFoundError, OutOfMemoryError,
                     PeerError, SkippedCheckpointWarning, ForeignRootWarning,
                     VersionError)
from . import ffi
from .checkpoint import Checkpoint, TensorInfo
from .handles import SaveHandle
from .store import LoadResult, RestoreResult, Store

__all__ = [
    "Store", "SaveHandle", "Checkpoint", "TensorInfo", "LoadResult",
    "RestoreResult", "Error", "InvalidArgumentError",
    "OutOfMemoryError", "IoError", "NoSpaceError", "BusyError",
    "CorruptError", "NotFoundError", "NoCheckpointError", "MismatchError",
    "VersionError", "DeviceError", "NoDeviceError", "AccessError",
    "InternalError", "IncompleteError", "PeerError", "SkippedCheckpointWarning",
    "ForeignRootWarning",
    "library_version", "library_path", "cuda_available", "__version__",
]

#: Path or name the C library was loaded from.
library_path = ffi.library_path


def library_version():
    """Version string of the loaded C library ("MAJOR.MINOR.PATCH")."""
    return ffi.LIBRARY_VERSION


def cuda_available():
    """True when libckpt found a CUDA runtime and a device."""
    try:
        return ffi.lib.ckpt_cuda_available() == 0
    except Error:  # built without the CUDA part
        return False
