"""Object checksums of tiered segments: CRC32C (hardware-accelerated), SHA-256 still readable.

A segment's checksum is a string, stored in the field named `sha256` (the name is part of
the checkpoint, the proto and the audit's tables, so it stays):

    crc32c:xxxxxxxx   CRC32C (Castagnoli) of the object, 8 lowercase hex digits; what
                      uploads write since P11 (object stores verify CRC32C natively);
    64 hex digits     SHA-256 of the object; what earlier uploads wrote, still verified.

CRC32C comes from google-crc32c. Its Python functions take only `bytes` and hold the GIL;
the uploader checksums a memory map of the object it just wrote, while another thread
checks every record's CRC-32, so this module calls the library's C function
`crc32c_extend` (the public API of Google's crc32c library, which the pinned wheel's
extension links) through ctypes: any buffer, no copy, the GIL released. When that entry
point cannot be found, `bytes(view)` goes through google_crc32c.value (one copy, same
result). google_crc32c is imported on first use, so readers of the other formats (the
Spark executors) do not need it.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import threading
from collections.abc import Callable

CRC32C_PREFIX = "crc32c:"
CHECKSUM_PATTERN = re.compile(r"[0-9a-f]{64}|crc32c:[0-9a-f]{8}")
_CHECK_INPUT = b"123456789"
_CHECK_VALUE = 0xE3069283  # CRC32C of _CHECK_INPUT (RFC 3720's check value)

_Buffer = bytes | bytearray | memoryview
_extend: Callable[[int, object, int], int] | None = None
_value: Callable[[bytes], int] | None = None
_loaded = threading.Lock()


def _load() -> None:
    global _extend, _value
    with _loaded:
        if _value is not None:
            return
        import google_crc32c
        import google_crc32c._crc32c as extension  # type: ignore[import-not-found]

        if google_crc32c.implementation != "c":
            raise RuntimeError("google-crc32c has no C implementation here: reinstall the pinned wheel")
        try:
            function = ctypes.CDLL(extension.__file__).crc32c_extend
            function.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
            function.restype = ctypes.c_uint32
            if function(0, _CHECK_INPUT, len(_CHECK_INPUT)) == _CHECK_VALUE:
                _extend = function
        except (OSError, AttributeError):
            _extend = None  # the copying path below gives the same values
        _value = google_crc32c.value


def crc32c(data: _Buffer, value: int = 0) -> int:
    """CRC32C of `data` (bytes, or a contiguous buffer: memoryview, mmap, bytearray),
    continuing from `value` (the CRC32C of the bytes before `data`)."""
    if _value is None:
        _load()
    extend = _extend
    if extend is None:
        import google_crc32c

        return int(google_crc32c.extend(value, data if isinstance(data, bytes) else bytes(data)))
    if isinstance(data, bytes):
        return extend(value, data, len(data))
    view = memoryview(data)
    if not view.nbytes:
        return value
    if view.readonly or not view.c_contiguous:
        return extend(value, bytes(view), view.nbytes)
    # from_buffer needs a writable buffer; the object only lives for this call
    window = (ctypes.c_char * view.nbytes).from_buffer(view)
    try:
        return extend(value, ctypes.addressof(window), view.nbytes)
    finally:
        del window


def crc32c_checksum(value: int) -> str:
    """The checksum string of a CRC32C value: `crc32c:` and 8 hex digits."""
    return f"{CRC32C_PREFIX}{value:08x}"


def object_checksum(data: _Buffer) -> str:
    """The checksum new uploads store (crc32c_checksum of the object's CRC32C)."""
    return crc32c_checksum(crc32c(data))


def checksum_matches(data: _Buffer, checksum: str) -> bool:
    """Whether `data` has `checksum`, in either format (CRC32C or SHA-256)."""
    if checksum.startswith(CRC32C_PREFIX):
        return object_checksum(data) == checksum
    return hashlib.sha256(data).hexdigest() == checksum
