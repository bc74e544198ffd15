"""controller/raft_ciphers.py against cryptography, byte for byte.

Properties checked:
- AES-GCM (128, 192, 256-bit keys; empty to 70 KB messages; with and without associated
  data) seals exactly as cryptography's AESGCM, each opens the other's, and an altered
  message, tag, nonce or associated data does not open (InvalidTag);
- Fernet tokens made by either implementation decrypt in the other, with the same
  timestamp; an altered, truncated or foreign token is refused (InvalidToken);
- HKDF-SHA256 and PBKDF2-HMAC-SHA256 derive cryptography's keys;
- where libcrypto cannot be bound, ciphers() is cryptography's classes, and the node's
  encryptor is cryptography's Fernet with the same key;
- a binding that does not compute the known answers stops the node (RuntimeError on
  first use), it is not used.
"""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.fernet import Fernet as CryptographyFernet
from cryptography.fernet import InvalidToken as CryptographyInvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
from mqmeta.controller import pysyncobj_lazy_crypto, raft_ciphers

pytestmark = pytest.mark.timeout(60)

SIZES = (0, 1, 15, 16, 17, 1000, 70_000)


def test_libcrypto_is_bound_here():
    assert raft_ciphers.available()
    assert raft_ciphers.ciphers() == (raft_ciphers.AesGcm, raft_ciphers.Fernet)


@pytest.mark.parametrize("key_bytes", [16, 24, 32])
def test_aes_gcm_seals_as_cryptography_does_and_each_opens_the_other(key_bytes):
    key = os.urandom(key_bytes)
    ours, theirs = raft_ciphers.AesGcm(key), AESGCM(key)
    for size in SIZES:
        for associated in (None, b"", b"h", os.urandom(40)):
            nonce, data = os.urandom(12), os.urandom(size)
            sealed = ours.encrypt(nonce, data, associated)
            assert sealed == theirs.encrypt(nonce, data, associated), (size, associated)
            assert (
                ours.decrypt(nonce, sealed, associated) == data == theirs.decrypt(nonce, sealed, associated)
            )


def test_aes_gcm_refuses_what_was_altered():
    gcm, nonce = raft_ciphers.AesGcm(os.urandom(32)), os.urandom(12)
    sealed = gcm.encrypt(nonce, b"a message", b"header")
    altered = [
        bytes([sealed[0] ^ 1]) + sealed[1:],  # the ciphertext
        sealed[:-1] + bytes([sealed[-1] ^ 1]),  # the tag
        sealed[:-1],  # truncated
        b"short",  # shorter than a tag
    ]
    for message in altered:
        with pytest.raises(raft_ciphers.InvalidTag):
            gcm.decrypt(nonce, message, b"header")
    with pytest.raises(raft_ciphers.InvalidTag):
        gcm.decrypt(os.urandom(12), sealed, b"header")
    with pytest.raises(raft_ciphers.InvalidTag):
        gcm.decrypt(nonce, sealed, b"another header")
    with pytest.raises(raft_ciphers.InvalidTag):
        raft_ciphers.AesGcm(os.urandom(32)).decrypt(nonce, sealed, b"header")
    assert gcm.decrypt(nonce, sealed, b"header") == b"a message"  # still usable after failures
    with pytest.raises(ValueError):
        gcm.encrypt(b"not twelve", b"data", None)
    with pytest.raises(ValueError):
        raft_ciphers.AesGcm(os.urandom(20))


def test_fernet_tokens_cross_both_ways():
    key = CryptographyFernet.generate_key()
    ours, theirs = raft_ciphers.Fernet(key), CryptographyFernet(key)
    for size in SIZES:
        data = os.urandom(size)
        token = ours.encrypt_at_time(data, 1_234_567)
        assert theirs.decrypt(token) == data and theirs.extract_timestamp(token) == 1_234_567
        token = theirs.encrypt_at_time(data, 7_654_321)
        assert ours.decrypt(token) == data and ours.extract_timestamp(token) == 7_654_321
    assert ours.decrypt(ours.encrypt(b"now"), ttl=60) == b"now"
    with pytest.raises(raft_ciphers.InvalidToken):
        ours.decrypt(ours.encrypt_at_time(b"old", 1000), ttl=60)


def test_fernet_refuses_altered_and_foreign_tokens():
    key = CryptographyFernet.generate_key()
    ours, theirs = raft_ciphers.Fernet(key), CryptographyFernet(key)
    token = ours.encrypt(b"a handshake key")
    raw = base64.urlsafe_b64decode(token)
    refused = [
        base64.urlsafe_b64encode(raw[:30] + bytes([raw[30] ^ 1]) + raw[31:]),  # the ciphertext
        base64.urlsafe_b64encode(raw[:-1] + bytes([raw[-1] ^ 1])),  # the HMAC
        base64.urlsafe_b64encode(bytes([0x81]) + raw[1:]),  # the version
        base64.urlsafe_b64encode(raw[:-16]),  # truncated
        b"not base64 at all!",
        b"",
        raft_ciphers.Fernet(CryptographyFernet.generate_key()).encrypt(b"another key"),
    ]
    for bad in refused:
        with pytest.raises(raft_ciphers.InvalidToken):
            ours.decrypt(bad)
        with pytest.raises(raft_ciphers.InvalidToken):
            ours.extract_timestamp(bad)
        with pytest.raises(CryptographyInvalidToken):
            theirs.decrypt(bad)
    with pytest.raises(ValueError):
        raft_ciphers.Fernet(base64.urlsafe_b64encode(b"too short"))


def test_key_derivations_match_cryptography():
    for length in (1, 32, 33, 64, 100):
        secret, info = os.urandom(32), os.urandom(12)
        expected = HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)
        assert raft_ciphers.hkdf_sha256(secret, info, length) == expected
    salt = os.urandom(16)
    expected = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=salt, iterations=1000).derive(b"pw")
    assert raft_ciphers.pbkdf2_sha256(b"pw", salt, 1000, 32) == expected


def test_without_libcrypto_the_ciphers_are_cryptographys(monkeypatch):
    monkeypatch.setattr(raft_ciphers, "_bound", [None])
    assert not raft_ciphers.available()
    assert raft_ciphers.ciphers() == (AESGCM, CryptographyFernet)
    theirs = pysyncobj_lazy_crypto.encryptor_with_frame_key("a secret")
    assert isinstance(theirs, CryptographyFernet)
    monkeypatch.setattr(raft_ciphers, "_bound", [])
    ours = pysyncobj_lazy_crypto.encryptor_with_frame_key("a secret")
    assert isinstance(ours, raft_ciphers.Fernet) and ours.raft_frame_key == theirs.raft_frame_key
    assert theirs.decrypt(ours.encrypt(b"entry")) == b"entry" == ours.decrypt(theirs.encrypt(b"entry"))


def test_a_binding_that_fails_its_known_answers_is_not_used(monkeypatch):
    monkeypatch.setattr(raft_ciphers, "_bound", [])
    monkeypatch.setattr(raft_ciphers, "_GCM_256_TAG", bytes(16))
    with pytest.raises(RuntimeError, match="AES-256-GCM binding is wrong"):
        raft_ciphers.available()
    assert raft_ciphers._bound == [], "a binding that failed its check was kept"


def test_only_bytes_are_sealed():
    """ctypes would pass a str as wide characters: refused, as cryptography refuses it."""
    gcm = raft_ciphers.AesGcm(bytes(32), raft_ciphers._libcrypto())
    with pytest.raises(TypeError):
        gcm.encrypt(bytes(12), "text", None)
