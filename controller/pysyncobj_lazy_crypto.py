"""pysyncobj's encryptor module, imported only when a Raft secret needs it (part of the
compat layer: controller/pysyncobj_compat.py imports this module before pysyncobj).

pysyncobj.syncobj imports `HAS_CRYPTO, getEncryptor` from pysyncobj.encryptor, which
imports cryptography at once: 8.7 MB of every controller's memory and 8 ms of its start,
though only a node with a Raft secret uses it. Importing this module, before pysyncobj is
imported, puts `LazyEncryptor` in its place: the same two names, HAS_CRYPTO found without
importing cryptography and getEncryptor loading pysyncobj's own module (from its file,
so the key derivation is pysyncobj's) on the first call. If pysyncobj was imported
first (a tool or test that imports it directly), the stock module stays: that costs only
memory. pysyncobj_compat checks at import which one pysyncobj uses.

The encryptor getEncryptor returns is pysyncobj's Fernet, made as pysyncobj makes it
(PBKDF2 over the secret with pysyncobj's salt), carrying one more key derived from the
same secret, `raft_frame_key`: pysyncobj_compat.AeadTcpConnection seals the Raft messages
between two nodes of this version with it (one AES-GCM per message instead of Fernet's
AES-CBC, HMAC and base64, and no zlib for small messages).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import sys
import types
from typing import Any

ENCRYPTOR_MODULE = "pysyncobj.encryptor"
STOCK_MODULE = "pysyncobj._stock_encryptor"


class LazyEncryptor(types.ModuleType):
    """pysyncobj.encryptor's HAS_CRYPTO and getEncryptor, cryptography imported on first use."""

    def __init__(self) -> None:
        super().__init__(ENCRYPTOR_MODULE, __doc__)
        self.HAS_CRYPTO = importlib.util.find_spec("cryptography") is not None

    @staticmethod
    def getEncryptor(password: str | bytes) -> Any:  # noqa: N802 - pysyncobj's name
        return encryptor_with_frame_key(password)


PBKDF2_ITERATIONS = 100_000  # pysyncobj's (encryptor.getEncryptor); a test checks the two agree
FRAME_KEY_INFO = b"mqmeta raft frames 1"


def encryptor_with_frame_key(password: str | bytes) -> Any:
    """pysyncobj's Fernet for `password`, with `raft_frame_key` (32 bytes, HKDF of the same
    PBKDF2 output): one key derivation for both, at the cost pysyncobj's alone had."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    stock = stock_encryptor()
    secret = password if isinstance(password, bytes) else password.encode()
    derived = PBKDF2HMAC(
        algorithm=hashes.SHA256(), length=32, salt=stock.SALT, iterations=PBKDF2_ITERATIONS
    ).derive(secret)
    fernet = stock.Fernet(base64.urlsafe_b64encode(derived))
    fernet.raft_frame_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=FRAME_KEY_INFO).derive(
        derived
    )
    return fernet


def stock_encryptor() -> types.ModuleType:
    """pysyncobj's own encryptor module, loaded from its file once."""
    loaded = sys.modules.get(STOCK_MODULE)
    if loaded is None:
        package = importlib.util.find_spec("pysyncobj")
        assert package is not None and package.submodule_search_locations, "pysyncobj is not installed"
        path = os.path.join(list(package.submodule_search_locations)[0], "encryptor.py")
        spec = importlib.util.spec_from_file_location(STOCK_MODULE, path)
        assert spec is not None and spec.loader is not None, path
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        sys.modules[STOCK_MODULE] = loaded
    return loaded


if "pysyncobj" not in sys.modules:
    sys.modules.setdefault(ENCRYPTOR_MODULE, LazyEncryptor())
