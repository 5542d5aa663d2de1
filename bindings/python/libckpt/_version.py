"""The binding's version; it needs a C library with the same MAJOR.MINOR."""
__version__ = "0.1.0"
VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = (int(x) for x in __version__.split("."))
