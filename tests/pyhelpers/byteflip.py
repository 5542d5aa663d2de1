"""Test helpers shared by the Python test suites (tests/cli and
tests/python).  meson puts this folder on PYTHONPATH; the suites' conftest.py
files add it to sys.path too, for pytest run by hand."""

import os


def flip_byte(path, offset=None):
    """Flip every bit of the byte at `offset` of file `path` (the middle byte
    by default) and return the offset."""
    size = os.path.getsize(path)
    offset = size // 2 if offset is None else offset
    assert 0 <= offset < size, "offset %d outside %s (%d bytes)" % (offset, path, size)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    return offset
