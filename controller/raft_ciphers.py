"""The ciphers of a Raft secret (Fernet for pysyncobj's handshake and a peer of an older
version, AES-GCM for the sealed frames, PBKDF2 and HKDF for the keys) over the OpenSSL
libcrypto that Python's own hashlib has loaded, so a controller with a Raft secret does
not load cryptography.

cryptography's wheel carries its own OpenSSL: importing it maps 8.7 MB more into every
controller (its `_rust` library), where the interpreter already holds a libcrypto (for
hashlib and ssl) that has these ciphers. Here the same primitives are called through
ctypes: EVP_aes_{128,192,256}_gcm and EVP_aes_128_cbc, the same as cryptography calls
(in its own copy of OpenSSL); PBKDF2 is hashlib's (OpenSSL's PKCS5_PBKDF2_HMAC), HKDF
(RFC 5869) and Fernet's HMAC are the standard library's hmac. The tokens, frames and keys
are byte for byte those of cryptography's Fernet, AESGCM, PBKDF2HMAC and HKDF (a test
checks each against it).

On first use the binding checks itself against known answers (NIST's AES-GCM and
AES-CBC test vectors) and crashes if one differs: a binding that computes something else
is a bug, never a reason to go on. Where the symbols cannot be found (a Python built
without a shared libcrypto), `ciphers()` gives cryptography's classes instead, imported
then: the same bytes, with cryptography's memory.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import hashlib
import hmac
import os
import threading
import time
from typing import Any, Protocol, cast

GCM_TAG_BYTES = 16
GCM_NONCE_BYTES = 12
AES_BLOCK_BYTES = 16
FERNET_VERSION = 0x80
FERNET_HMAC_BYTES = 32
_FERNET_OVERHEAD_BYTES = 1 + 8 + AES_BLOCK_BYTES + FERNET_HMAC_BYTES  # version, time, IV, HMAC
_DATA_BYTES_MAX = 2**31 - 1 - AES_BLOCK_BYTES  # OpenSSL's lengths are C ints

# EVP_CIPHER_CTX_ctrl's commands for GCM (openssl/evp.h, the same in 1.1 and 3)
_CTRL_GCM_SET_IVLEN = 0x9
_CTRL_GCM_GET_TAG = 0x10
_CTRL_GCM_SET_TAG = 0x11


class InvalidTag(Exception):
    """A sealed message that does not open: altered, or sealed under another key or nonce."""


class InvalidToken(Exception):
    """A Fernet token that does not verify or decrypt."""


class Aead(Protocol):
    def encrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes: ...

    def decrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes: ...


# The binding ---------------------------------------------------------------------------------


_RAW_FUNCTIONS = (
    "EVP_EncryptInit_ex",
    "EVP_EncryptUpdate",
    "EVP_EncryptFinal_ex",
    "EVP_DecryptInit_ex",
    "EVP_DecryptUpdate",
    "EVP_DecryptFinal_ex",
    "EVP_CIPHER_CTX_ctrl",
)


class _LibCrypto:
    """The EVP functions used here, typed, from the libcrypto `_hashlib` is linked to."""

    def __init__(self) -> None:
        import _hashlib

        # dlsym on the extension's handle searches its dependencies too: its libcrypto, the
        # one already mapped (no second copy is loaded). PyDLL: the calls keep the GIL. Each
        # takes a microsecond; releasing and taking the GIL back around it (CDLL) let other
        # threads in five times per message, and the Raft thread waited for it each time.
        library = ctypes.PyDLL(_hashlib.__file__)
        # The per-message calls, untyped (a handle of their own: typing a function types it
        # for every user of the handle); each returns a C int, as ctypes assumes.
        self.raw = ctypes.PyDLL(_hashlib.__file__)
        for name in _RAW_FUNCTIONS:
            getattr(self.raw, name)  # AttributeError: not there
        pointer, integer, char_p = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        int_p = ctypes.POINTER(ctypes.c_int)
        self.ctx_new = _function(library, "EVP_CIPHER_CTX_new", pointer, [])
        self.ctx_free = _function(library, "EVP_CIPHER_CTX_free", None, [pointer])
        self.ctx_ctrl = _function(
            library, "EVP_CIPHER_CTX_ctrl", integer, [pointer, integer, integer, pointer]
        )
        for verb in ("Encrypt", "Decrypt"):
            setattr(
                self,
                f"{verb.lower()}_init",
                _function(
                    library, f"EVP_{verb}Init_ex", integer, [pointer, pointer, pointer, char_p, char_p]
                ),
            )
            setattr(
                self,
                f"{verb.lower()}_update",
                _function(library, f"EVP_{verb}Update", integer, [pointer, pointer, int_p, char_p, integer]),
            )
            setattr(
                self,
                f"{verb.lower()}_final",
                _function(library, f"EVP_{verb}Final_ex", integer, [pointer, pointer, int_p]),
            )
        self.gcm = {
            bits // 8: _function(library, f"EVP_aes_{bits}_gcm", pointer, [])() for bits in (128, 192, 256)
        }
        self.cbc_128 = _function(library, "EVP_aes_128_cbc", pointer, [])()
        _require(all(self.gcm.values()) and self.cbc_128, "libcrypto has no AES ciphers")

    encrypt_init: Any
    encrypt_update: Any
    encrypt_final: Any
    decrypt_init: Any
    decrypt_update: Any
    decrypt_final: Any


def _function(library: ctypes.PyDLL, name: str, result: Any, arguments: list[Any]) -> Any:
    function = getattr(library, name)  # AttributeError: not there
    function.restype = result
    function.argtypes = arguments
    return function


_lock = threading.Lock()
_bound: list[_LibCrypto | None] = []  # [] not tried yet; [None] not available


def _libcrypto() -> _LibCrypto | None:
    with _lock:
        if not _bound:
            try:
                library: _LibCrypto | None = _LibCrypto()
            except (ImportError, OSError, AttributeError):
                library = None
            if library is not None:
                _check_known_answers(library)
            _bound.append(library)
        return _bound[0]


def available() -> bool:
    """Whether these ciphers run over Python's libcrypto (else ciphers() is cryptography's)."""
    return _libcrypto() is not None


# AES-GCM -------------------------------------------------------------------------------------


class AesGcm:
    """cryptography's AESGCM (encrypt and decrypt with a 12-byte nonce; the 16-byte tag
    after the ciphertext) over libcrypto. The key schedule is made once per direction;
    calls on one object are serialized (each direction holds a cipher context and an
    output buffer it reuses). Per message: five calls into libcrypto, untyped (their
    arguments are ctypes objects, bytes, ints and None already): 3.5 µs a message in all,
    against 0.7 µs in cryptography (docs/benchmarks.md)."""

    def __init__(self, key: bytes, library: _LibCrypto | None = None) -> None:
        library = library or _libcrypto()
        if library is None:
            raise RuntimeError("AesGcm without libcrypto: use ciphers()")
        if len(key) not in library.gcm:
            raise ValueError("AES-GCM key must be 128, 192 or 256 bits")
        self._library = library
        self._key = bytes(key)
        self._lock = threading.Lock()
        self._contexts: dict[str, ctypes.c_void_p] = {}
        self._buffers: dict[str, ctypes.Array[ctypes.c_char]] = {}
        self._written = ctypes.c_int(0)
        self._written_at = ctypes.pointer(self._written)  # the untyped calls take its address

    def __del__(self) -> None:
        for context in getattr(self, "_contexts", {}).values():
            self._library.ctx_free(context)

    def _context(self, verb: str) -> ctypes.c_void_p:
        """This direction's context, keyed once; each call then sets only the nonce."""
        context = self._contexts.get(verb)
        if context is None:
            library = self._library
            context = ctypes.c_void_p(library.ctx_new())
            if not context.value:
                raise MemoryError("EVP_CIPHER_CTX_new")
            init = library.encrypt_init if verb == "encrypt" else library.decrypt_init
            try:
                _ok(init(context, library.gcm[len(self._key)], None, None, None), "init")
                _ok(library.ctx_ctrl(context, _CTRL_GCM_SET_IVLEN, GCM_NONCE_BYTES, None), "IV length")
                _ok(init(context, None, None, self._key, None), "key")
            except BaseException:
                library.ctx_free(context)
                raise
            self._contexts[verb] = context  # kept only once keyed
        return context

    def _buffer(self, verb: str, size: int) -> ctypes.Array[ctypes.c_char]:
        buffer = self._buffers.get(verb)
        if buffer is None or len(buffer) < size:
            buffer = self._buffers[verb] = ctypes.create_string_buffer(max(size, 4096))
        return buffer

    def encrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes:
        _check_sizes(nonce, data, associated_data)
        raw, length, written, at = self._library.raw, len(data), self._written, self._written_at
        with self._lock:
            context = self._context("encrypt")
            out = self._buffer("encrypt", length + GCM_TAG_BYTES)
            _ok(raw.EVP_EncryptInit_ex(context, None, None, None, nonce), "nonce")
            if associated_data:
                _ok(
                    raw.EVP_EncryptUpdate(context, None, at, associated_data, len(associated_data)),
                    "AAD",
                )
            _ok(raw.EVP_EncryptUpdate(context, out, at, data, length), "update")
            _require(written.value == length, f"libcrypto wrote {written.value} of {length} bytes")
            end = ctypes.byref(out, length)
            _ok(raw.EVP_EncryptFinal_ex(context, end, at), "final")
            _require(written.value == 0, f"libcrypto wrote {written.value} bytes at the end of a GCM message")
            _ok(raw.EVP_CIPHER_CTX_ctrl(context, _CTRL_GCM_GET_TAG, GCM_TAG_BYTES, end), "tag")
            return cast(bytes, out[: length + GCM_TAG_BYTES])  # a char array slice is bytes

    def decrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes:
        _check_sizes(nonce, data, associated_data)
        if len(data) < GCM_TAG_BYTES:
            raise InvalidTag("shorter than its tag")
        raw, length, written, at = (
            self._library.raw,
            len(data) - GCM_TAG_BYTES,
            self._written,
            self._written_at,
        )
        with self._lock:
            context = self._context("decrypt")
            out = self._buffer("decrypt", length + AES_BLOCK_BYTES)
            _ok(raw.EVP_DecryptInit_ex(context, None, None, None, nonce), "nonce")
            if associated_data:
                _ok(
                    raw.EVP_DecryptUpdate(context, None, at, associated_data, len(associated_data)),
                    "AAD",
                )
            _ok(raw.EVP_DecryptUpdate(context, out, at, data, length), "update")  # the tag is not read
            _require(written.value == length, f"libcrypto wrote {written.value} of {length} bytes")
            _ok(raw.EVP_CIPHER_CTX_ctrl(context, _CTRL_GCM_SET_TAG, GCM_TAG_BYTES, data[length:]), "tag")
            if raw.EVP_DecryptFinal_ex(context, ctypes.byref(out, length), at) <= 0:
                raise InvalidTag("the tag does not match")
            return cast(bytes, out[:length])


def _require(condition: object, message: str) -> None:
    """A check that stays under `python -O` (assert statements do not)."""
    if not condition:
        raise RuntimeError(message)


def _check_sizes(nonce: bytes, data: bytes, associated_data: bytes | None) -> None:
    # ctypes would pass a str as wide characters: only bytes are accepted, as cryptography does
    if (
        type(nonce) is not bytes
        or type(data) is not bytes
        or type(associated_data) not in (bytes, type(None))
    ):
        raise TypeError("nonce, data and associated data must be bytes")
    if len(nonce) != GCM_NONCE_BYTES:
        raise ValueError(f"the nonce must be {GCM_NONCE_BYTES} bytes")
    if len(data) > _DATA_BYTES_MAX or len(associated_data or b"") > _DATA_BYTES_MAX:
        raise OverflowError("data or associated data longer than 2**31 - 17 bytes")


def _ok(result: int, step: str) -> None:
    if result != 1:
        raise RuntimeError(f"libcrypto refused the cipher's {step}")


# AES-128-CBC and Fernet ----------------------------------------------------------------------


def _cbc(library: _LibCrypto, key: bytes, iv: bytes, data: bytes, encrypt: bool) -> bytes:
    """AES-128-CBC with PKCS#7 padding (OpenSSL's default); ValueError on bad padding."""
    init, update, final = (
        (library.encrypt_init, library.encrypt_update, library.encrypt_final)
        if encrypt
        else (library.decrypt_init, library.decrypt_update, library.decrypt_final)
    )
    context = library.ctx_new()
    if not context:
        raise MemoryError("EVP_CIPHER_CTX_new")
    try:
        out = ctypes.create_string_buffer(len(data) + AES_BLOCK_BYTES)
        written, last = ctypes.c_int(0), ctypes.c_int(0)
        _ok(init(context, library.cbc_128, None, key, iv), "init")
        _ok(update(context, out, written, data, len(data)), "update")
        if final(context, ctypes.byref(out, written.value), last) != 1:
            raise ValueError("bad padding")
        return out.raw[: written.value + last.value]
    finally:
        library.ctx_free(context)


class Fernet:
    """cryptography's Fernet (the methods pysyncobj calls: encrypt, encrypt_at_time,
    extract_timestamp, decrypt) over libcrypto and hmac: the same tokens."""

    def __init__(self, key: bytes | str) -> None:
        try:
            raw = base64.urlsafe_b64decode(key)
        except (TypeError, binascii.Error) as error:
            raise ValueError("Fernet key must be 32 url-safe base64-encoded bytes.") from error
        if len(raw) != 32:
            raise ValueError("Fernet key must be 32 url-safe base64-encoded bytes.")
        self._signing_key, self._encryption_key = raw[:16], raw[16:]
        library = _libcrypto()
        if library is None:
            raise RuntimeError("Fernet without libcrypto: use ciphers()")
        self._library = library

    def encrypt(self, data: bytes) -> bytes:
        return self.encrypt_at_time(data, int(time.time()))

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        iv = os.urandom(AES_BLOCK_BYTES)
        ciphertext = _cbc(self._library, self._encryption_key, iv, data, encrypt=True)
        basic = bytes([FERNET_VERSION]) + current_time.to_bytes(8, "big") + iv + ciphertext
        return base64.urlsafe_b64encode(basic + hmac.digest(self._signing_key, basic, "sha256"))

    def extract_timestamp(self, token: bytes | str) -> int:
        data = self._verified(token)
        return int.from_bytes(data[1:9], "big")

    def decrypt(self, token: bytes | str, ttl: int | None = None) -> bytes:
        data = self._verified(token)
        if ttl is not None and int.from_bytes(data[1:9], "big") + ttl < int(time.time()):
            raise InvalidToken("expired")
        iv, ciphertext = data[9:25], data[25:-FERNET_HMAC_BYTES]
        try:
            return _cbc(self._library, self._encryption_key, iv, ciphertext, encrypt=False)
        except ValueError as error:
            raise InvalidToken("does not decrypt") from error

    def _verified(self, token: bytes | str) -> bytes:
        if not isinstance(token, (bytes, str)):
            raise TypeError("token must be bytes or str")
        try:
            data = base64.urlsafe_b64decode(token)
        except (TypeError, binascii.Error) as error:
            raise InvalidToken("not base64") from error
        body = len(data) - _FERNET_OVERHEAD_BYTES
        if body < AES_BLOCK_BYTES or body % AES_BLOCK_BYTES or data[0] != FERNET_VERSION:
            raise InvalidToken("not a Fernet token")
        expected = hmac.digest(self._signing_key, data[:-FERNET_HMAC_BYTES], "sha256")
        if not hmac.compare_digest(expected, data[-FERNET_HMAC_BYTES:]):
            raise InvalidToken("the HMAC does not match")
        return data


# Key derivation ------------------------------------------------------------------------------


def pbkdf2_sha256(secret: bytes, salt: bytes, iterations: int, length: int) -> bytes:
    """PBKDF2-HMAC-SHA256 (cryptography's PBKDF2HMAC; both are OpenSSL's)."""
    return hashlib.pbkdf2_hmac("sha256", secret, salt, iterations, length)


def hkdf_sha256(secret: bytes, info: bytes, length: int, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256 (RFC 5869; cryptography's HKDF): extract, then expand to `length`."""
    _require(0 < length <= 255 * 32, f"HKDF-SHA256 gives 1 to {255 * 32} bytes, not {length}")
    prk = hmac.digest(salt or bytes(32), secret, "sha256")
    out, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        out += block
    return out[:length]


# Choice and self-check -----------------------------------------------------------------------


def ciphers() -> tuple[type, type]:
    """(the AES-GCM class, the Fernet class): these over libcrypto, or cryptography's."""
    if available():
        return AesGcm, Fernet
    from cryptography.fernet import Fernet as CryptographyFernet
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM, CryptographyFernet


# The GCM specification's test case 14 (AES-256, zero key and IV, one zero block, no AAD);
# associated data and altered messages are checked by round trips below, and every key
# size and length against cryptography in tests/test_raft_ciphers.py.
_GCM_256_KEY = bytes(32)
_GCM_256_CIPHERTEXT = bytes.fromhex("cea7403d4d606b6e074ec5d3baf39d18")
_GCM_256_TAG = bytes.fromhex("d0d1c8a799996bf0265b98b5d48ab919")
# NIST SP 800-38A F.2.1, CBC-AES128.Encrypt, first block (then OpenSSL's padding block)
_CBC_KEY = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
_CBC_IV = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
_CBC_PLAINTEXT = bytes.fromhex("6bc1bee22e409f96e93d7e117393172a")
_CBC_CIPHERTEXT = bytes.fromhex("7649abac8119b246cee98e9b12e9197d")


def _check_known_answers(library: _LibCrypto) -> None:
    """Crashes if the binding computes anything but AES (called under _lock, before use)."""
    gcm = AesGcm(_GCM_256_KEY, library)
    sealed = gcm.encrypt(bytes(GCM_NONCE_BYTES), bytes(16), None)
    _require(sealed == _GCM_256_CIPHERTEXT + _GCM_256_TAG, f"AES-256-GCM binding is wrong: {sealed.hex()}")
    _require(
        gcm.decrypt(bytes(GCM_NONCE_BYTES), sealed, None) == bytes(16),
        "AES-256-GCM binding does not open its own message",
    )
    with_aad = gcm.encrypt(bytes(GCM_NONCE_BYTES), b"data", b"header")
    _require(
        gcm.decrypt(bytes(GCM_NONCE_BYTES), with_aad, b"header") == b"data",
        "AES-256-GCM binding does not open a message with associated data",
    )
    for altered in (with_aad[:-1] + bytes([with_aad[-1] ^ 1]), bytes([with_aad[0] ^ 1]) + with_aad[1:]):
        try:
            gcm.decrypt(bytes(GCM_NONCE_BYTES), altered, b"header")
        except InvalidTag:
            continue
        raise RuntimeError("AES-GCM binding opened an altered message")
    try:
        gcm.decrypt(bytes(GCM_NONCE_BYTES), with_aad, b"other header")
        raise RuntimeError("AES-GCM binding opened a message under other associated data")
    except InvalidTag:
        pass
    cbc = _cbc(library, _CBC_KEY, _CBC_IV, _CBC_PLAINTEXT, encrypt=True)
    _require(cbc[:16] == _CBC_CIPHERTEXT and len(cbc) == 32, f"AES-128-CBC binding is wrong: {cbc.hex()}")
    _require(
        _cbc(library, _CBC_KEY, _CBC_IV, cbc, encrypt=False) == _CBC_PLAINTEXT,
        "AES-128-CBC binding does not decrypt its own message",
    )
