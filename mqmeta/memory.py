"""Handing a server's freed heap memory back to the kernel (glibc's malloc_trim).

A Python server frees much of what its start allocates (the imports' and the set-up's
temporary objects), but glibc keeps freed pages mapped inside its heaps, where they count
in the process's resident memory until reused. `malloc_trim(0)` returns every whole free
page of every heap (glibc 2.8 and later): about 0.5 MB of an idle controller's 53. Servers
call it once they serve, and then every `TRIM_INTERVAL_S` while they run
(rpc.serve_until_signal). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

TRIM_INTERVAL_S = 30.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back this way
        return None


_trim = _malloc_trim()


def return_freed_memory() -> bool:
    """Hands whole free heap pages back to the kernel; True if any was returned."""
    return bool(_trim(0)) if _trim is not None else False
