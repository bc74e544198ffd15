"""Checksummed JSON: canonical JSON, and small documents that carry a CRC-32 of their body.

A document is `{"body": {...}, "crc32": crc32(canonical_json(body))}`. Used by the epoch
file, the tiered epoch lineages and the identity files: a torn or edited file is
reported (CorruptData), never used.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from mqmeta.errors import CorruptData


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# json.dumps(value, sort_keys=True, separators=...) builds a JSONEncoder and a C encoder for
# every call, half the cost of a small value's text; this one C encoder is made once (the
# arguments json.dumps passes it, but no circular check: a cycle ends in RecursionError).
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # None without the C speedups
_CANONICAL_ENCODER = (
    None
    if _C_MAKE_ENCODER is None
    else _C_MAKE_ENCODER(
        None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True
    )
)


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces (what digests and CRCs are taken over)."""
    if _CANONICAL_ENCODER is None:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "".join(_CANONICAL_ENCODER(value, 0))


def dump_checksummed(body: dict[str, object]) -> bytes:
    """The document for `body` (read back by loads_checksummed)."""
    return canonical_json({"body": body, "crc32": zlib.crc32(canonical_json(body).encode())}).encode()


def loads_checksummed(data: bytes, what: str) -> dict[str, Any]:
    """The body of a document written by dump_checksummed; CorruptData naming `what`
    when it is not one or its checksum does not match."""
    try:
        outer = json.loads(data)
        body = outer["body"]
        crc = outer["crc32"]
        canonical = canonical_json(body)
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        raise CorruptData(f"{what} is not a checksummed JSON file") from None
    if not isinstance(body, dict) or zlib.crc32(canonical.encode()) != crc:
        raise CorruptData(f"{what} is corrupt (checksum mismatch)")
    return body


def load_checksummed(path: Path) -> dict[str, Any]:
    """loads_checksummed of a file's bytes."""
    return loads_checksummed(path.read_bytes(), str(path))
