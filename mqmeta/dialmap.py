"""The dial map: where a process actually connects when it means to reach an address.

The chaos suite puts a fault proxy on every link (controller <-> controller Raft,
broker -> controller, slave -> master, client -> broker). Each process keeps using the
real addresses everywhere (as node identities, in leader hints, in routes), and only
the connect step is redirected: `dial(address)` returns the proxy listening for this
process's link to `address`, or `address` itself. A process gets its map from the JSON
file named by the `MQMETA_DIAL_MAP` environment variable ({"HOST:PORT": "HOST:PORT"});
the chaos runner's own clients install theirs with `install()`. Without a map nothing
changes.
"""

from __future__ import annotations

import json
import os
import threading

from mqmeta.errors import InvalidArgument

ENVIRONMENT_VARIABLE = "MQMETA_DIAL_MAP"

_lock = threading.Lock()
_mapping: dict[str, str] | None = None


def load_from_environment() -> None:
    """Reads MQMETA_DIAL_MAP now; `mqmeta` calls it at start so that a bad map is a
    one-sentence error (exit 2), not a failure inside some connecting thread."""
    global _mapping
    mapping = _read_environment()
    with _lock:
        _mapping = mapping


def _read_environment() -> dict[str, str]:
    path = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            mapping = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{ENVIRONMENT_VARIABLE}={path} is not a readable JSON file: {exc}") from None
    _check(mapping, path)
    return mapping


def _check(mapping: object, where: str) -> None:
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and ":" in k and ":" in v for k, v in mapping.items()
    ):
        raise InvalidArgument(f"the dial map {where} must be a JSON object of HOST:PORT to HOST:PORT")


def install(mapping: dict[str, str]) -> None:
    """Replaces this process's map (the chaos runner's clients use it)."""
    global _mapping
    _check(mapping, "given")
    with _lock:
        _mapping = dict(mapping)


def dial(address: str) -> str:
    if _mapping is None:  # a library user that did not start through `mqmeta`
        load_from_environment()
    with _lock:
        assert _mapping is not None
        return _mapping.get(address, address)
