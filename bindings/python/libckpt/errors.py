"""Exceptions raised by the binding.

Every failing libckpt call raises a subclass of :class:`Error` chosen by its
status code, with the message the C library left in its per-thread slot
(``ckpt_error_last()``), which names the file, tensor and byte offset
involved.
"""

__all__ = [
    "Error", "InvalidArgumentError", "OutOfMemoryError", "IoError",
    "NoSpaceError", "BusyError", "CorruptError", "NotFoundError",
    "NoCheckpointError", "MismatchError", "VersionError", "DeviceError",
    "NoDeviceError", "AccessError", "InternalError", "IncompleteError",
    "PeerError", "SkippedCheckpointWarning", "error_for_status", "code_name",
]

import traceback


class Error(Exception):
    """A libckpt call failed.

    Attributes: ``status`` (the negative ``CKPT_E*`` code, or None for an
    error found by the binding itself), ``code`` (its name, e.g.
    ``"CKPT_ECORRUPT"``), ``message`` (the library's message) and
    ``function`` (the C function that failed).  An error of
    :meth:`libckpt.Store.restore` also has ``skipped``: the newer
    checkpoints it passed over as damaged before failing (dicts as in
    :meth:`libckpt.Store.verify` problems; empty when none).
    """

    status = None
    code = None
    skipped = ()

    def __init__(self, message, status=None, function=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.function = function

    def __str__(self):
        # Many of the library's messages already begin with the function
        # ("ckpt_store_open: ..."): it is not said twice.
        if self.function and not self.message.startswith(self.function + ":"):
            return "%s: %s" % (self.function, self.message)
        return self.message


class InvalidArgumentError(Error, ValueError):
    """CKPT_EINVAL: a bad argument or option (also a ValueError)."""
    status, code = -1, "CKPT_EINVAL"


class OutOfMemoryError(Error, MemoryError):
    """CKPT_ENOMEM: out of host memory."""
    status, code = -2, "CKPT_ENOMEM"


class IoError(Error):
    """CKPT_EIO: a file-system call failed."""
    status, code = -3, "CKPT_EIO"


class NoSpaceError(IoError):
    """CKPT_ENOSPC: no space left on the device."""
    status, code = -4, "CKPT_ENOSPC"


class BusyError(Error):
    """CKPT_EBUSY: another writer holds the checkpoint root."""
    status, code = -5, "CKPT_EBUSY"


class CorruptError(Error):
    """CKPT_ECORRUPT: data failed verification."""
    status, code = -6, "CKPT_ECORRUPT"


class NotFoundError(Error, KeyError):
    """CKPT_ENOTFOUND: no such step or tensor (also a KeyError)."""
    status, code = -7, "CKPT_ENOTFOUND"
    __str__ = Error.__str__  # not KeyError's repr() of the message


class NoCheckpointError(Error):
    """CKPT_ENOCKPT: no valid checkpoint to restore.

    ``skipped`` lists the checkpoints that were tried and why they failed
    (dicts as in :meth:`libckpt.Store.verify` problems, newest first),
    when known; empty for a root with no checkpoint.  When it is not
    empty (every checkpoint damaged) the message says how many were found
    damaged and names them, and each was reported before the error was
    raised, as a skipped one is (a SkippedCheckpointWarning and a log
    record of the "libckpt" logger).
    """
    status, code = -8, "CKPT_ENOCKPT"
    skipped = ()


class MismatchError(Error):
    """CKPT_EMISMATCH: a dtype, shape or size differs from the checkpoint."""
    status, code = -9, "CKPT_EMISMATCH"


class VersionError(Error):
    """CKPT_EVERSION: unknown options version or format version."""
    status, code = -10, "CKPT_EVERSION"


class DeviceError(Error):
    """CKPT_EDEVICE: the CUDA device reported an error."""
    status, code = -11, "CKPT_EDEVICE"


class NoDeviceError(DeviceError):
    """CKPT_ENODEVICE: no CUDA runtime or no device."""
    status, code = -12, "CKPT_ENODEVICE"


class AccessError(Error, PermissionError):
    """CKPT_EACCES: permission denied (e.g. a read-only root)."""
    status, code = -13, "CKPT_EACCES"


class InternalError(Error):
    """CKPT_EINTERNAL: a bug in libckpt."""
    status, code = -14, "CKPT_EINTERNAL"


class IncompleteError(CorruptError):
    """CKPT_EINCOMPLETE: a checkpoint file is missing or truncated."""
    status, code = -15, "CKPT_EINCOMPLETE"


class PeerError(Error):
    """CKPT_EPEER: another rank failed, died or did not answer in time."""
    status, code = -16, "CKPT_EPEER"


class SkippedCheckpointWarning(UserWarning):
    """A newer checkpoint failed verification and an older one was used."""


class ForeignRootWarning(UserWarning):
    """A root opened for reading belongs to another user (not root)."""


_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, OutOfMemoryError, IoError, NoSpaceError, BusyError,
    CorruptError, NotFoundError, NoCheckpointError, MismatchError,
    VersionError, DeviceError, NoDeviceError, AccessError, InternalError,
    IncompleteError, PeerError)}


# The first exception a coordinator of this process raised (libckpt.dist)
# since a PeerError last took it: libckpt calls the coordinator from its own
# threads and sees only that the collective failed, so the PeerError the
# caller then gets names the runtime's own error and chains it (__cause__).
_coordinator_failure = [None]


def note_coordinator_failure(rank, exc):
    """Called by libckpt.dist when a coordinator's collective raised."""
    if _coordinator_failure[0] is None:
        _coordinator_failure[0] = (rank, exc)


def error_for_status(status, message, function=None):
    """The exception for a negative status code (Error for unknown codes)."""
    cls = _BY_STATUS.get(status, Error)
    cause = None
    if cls is PeerError and _coordinator_failure[0] is not None:
        (rank, cause), _coordinator_failure[0] = _coordinator_failure[0], None
        what = "".join(traceback.format_exception_only(type(cause), cause)).strip()
        message = "%s (rank %d's coordinator raised %s)" % (message, rank, what)
    err = cls(message, status=status, function=function)
    err.__cause__ = cause
    return err


def code_name(status):
    """"CKPT_ECORRUPT" for -6; "CKPT_OK" for 0; the number for unknown codes."""
    if status == 0:
        return "CKPT_OK"
    cls = _BY_STATUS.get(status)
    return cls.code if cls else str(status)
