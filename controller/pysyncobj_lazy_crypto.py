"""pysyncobj's encryptor module without cryptography (part of the compat layer:
controller/pysyncobj_compat.py imports this module before pysyncobj).

pysyncobj.syncobj imports `HAS_CRYPTO, getEncryptor` from pysyncobj.encryptor, which
imports cryptography at once: 8.7 MB of every controller's memory and 8 ms of its start.
Importing this module, before pysyncobj is imported, puts `LazyEncryptor` in its place:
the same two names, HAS_CRYPTO found without importing cryptography and getEncryptor
making, on the first call, the Fernet pysyncobj would make (PBKDF2 over the secret with
pysyncobj's salt and rounds) from controller/raft_ciphers.py, which calls the libcrypto
Python has already loaded: a node with a Raft secret does not load cryptography either.
If pysyncobj was imported first (a tool or test that imports it directly), the stock
module stays: that costs only memory. pysyncobj_compat checks at import which one
pysyncobj uses.

The encryptor carries one more key derived from the same secret, `raft_frame_key`:
pysyncobj_compat.AeadTcpConnection seals the Raft messages between two nodes of this
version with it (one AES-GCM per message instead of Fernet's AES-CBC, HMAC and base64,
and no zlib for small messages).
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
    """pysyncobj.encryptor's HAS_CRYPTO and getEncryptor over controller/raft_ciphers.py
    (libcrypto bound and checked against known answers when pysyncobj reads HAS_CRYPTO, at
    its import; cryptography imported only where libcrypto cannot be bound)."""

    def __init__(self) -> None:
        super().__init__(ENCRYPTOR_MODULE, __doc__)

    @property
    def HAS_CRYPTO(self) -> bool:  # noqa: N802 - pysyncobj's name
        from mqmeta.controller import raft_ciphers

        return raft_ciphers.available() or importlib.util.find_spec("cryptography") is not None

    @staticmethod
    def getEncryptor(password: str | bytes) -> Any:  # noqa: N802 - pysyncobj's name
        return encryptor_with_frame_key(password)


PBKDF2_ITERATIONS = 100_000  # pysyncobj's (encryptor.getEncryptor); a test checks the two agree
PBKDF2_SALT = b"\x15%q\xe6\xbb\x02\xa6\xf8\x13q\x90\xcf6+\x1e\xeb"  # pysyncobj's SALT (a test checks)
FRAME_KEY_INFO = b"mqmeta raft frames 1"


def encryptor_with_frame_key(password: str | bytes) -> Any:
    """pysyncobj's Fernet for `password` (the same key: PBKDF2 with pysyncobj's salt and
    rounds), with `raft_frame_key` (32 bytes, HKDF of the same PBKDF2 output): one key
    derivation for both, at the cost pysyncobj's alone had. The Fernet is raft_ciphers'
    (over the libcrypto Python has loaded; cryptography's where that cannot be bound):
    the same tokens as pysyncobj's own."""
    from mqmeta.controller import raft_ciphers

    secret = password if isinstance(password, bytes) else password.encode()
    derived = raft_ciphers.pbkdf2_sha256(secret, PBKDF2_SALT, PBKDF2_ITERATIONS, 32)
    _aead, fernet_class = raft_ciphers.ciphers()
    fernet = fernet_class(base64.urlsafe_b64encode(derived))
    fernet.raft_frame_key = raft_ciphers.hkdf_sha256(derived, FRAME_KEY_INFO, 32)
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
