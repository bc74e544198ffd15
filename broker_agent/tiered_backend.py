"""The tiered-storage backend: a small object store of immutable, whole objects.

Every backend keeps the same promises (`TieredBackend`):
- a `put` is atomic: a reader sees the whole object or nothing at its key, never a
  prefix of it, even when the writer crashes half-way;
- objects are immutable: putting different bytes at an existing key raises
  FailedPrecondition, putting the same bytes again is a no-op (so a retried or
  resumed upload is harmless, and a second uploader cannot silently replace data);
- keys are '/'-separated relative paths of safe characters (InvalidArgument
  otherwise); a key never contains TEMP_MARK, which names in-flight temporaries, so
  `list` never returns one;
- limits: an object is at most OBJECT_BYTES_MAX bytes, a listing at most
  LIST_KEYS_MAX keys (FailedPrecondition beyond: list a narrower prefix);
- errors of the filesystem or of fsspec never leak: a missing key is NotFound, any
  other I/O failure Unavailable.

LocalBackend writes POSIX files with temp + fsync + link + directory fsync; the
hard link publishes the object without ever replacing an existing one, so the
immutability check has no race between two local writers.

`put_checked` stores an object from an ObjectSource (bytes, or a range of a file that
the kernel copies without the bytes passing through Python) and calls a check on the
bytes *as stored* before it publishes them: LocalBackend runs the check over a memory
map of its temporary file while the kernel is still copying into it (the check follows
the copy's progress) and while it is fsynced, and links the file only when the check
passed, so what is checked is exactly what is published; FsspecBackend reads the source
once, checks those bytes and puts them.

FsspecBackend serves any fsspec URL. Where the filesystem renames atomically
(memory, local, and the other non-object stores) it writes `key + TEMP_MARK + uuid`
and moves it into place. Object stores (s3, gs, azure, ...) cannot rename: a move
there is copy + delete. Their single PUT is already all-or-nothing (an object,
multipart ones included, becomes visible only when complete), so the object is
written directly with fsspec's `mode="create"`, which implementations may map to a
conditional put-if-absent. For any filesystem that offers neither, the commit
protocol above this layer keeps partial objects unreachable: a reader follows only
keys named by a committed upload record, and checks their length and checksum
(tiered_objects.verify_segment) before trusting them. FsspecBackend checks
immutability by reading before writing, which races between two concurrent
writers; only one uploader per broker set is allowed to write (the caller's job).
It promises no durability beyond the filesystem's own: local paths go to
LocalBackend (open_backend does that) for fsync.
"""

from __future__ import annotations

import builtins
import errno
import mmap
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import fsspec

from mqmeta.errors import (
    CorruptData,
    FailedPrecondition,
    InvalidArgument,
    MqmetaError,
    NotFound,
    Unavailable,
)
from mqmeta.extras import require_for_url
from mqmeta.formats.atomic import fsync_dir
from mqmeta.formats.tiered import OBJECT_BYTES_MAX

LIST_KEYS_MAX = 100_000
KEY_CHARS_MAX = 1024  # S3's limit on a key
KEY_SEGMENT_CHARS_MAX = 255  # a POSIX file name
TEMP_MARK = ".tmp-"
_COMPARE_CHUNK_BYTES = 8 << 20
_KEY_SEGMENT = re.compile(r"[A-Za-z0-9_.=%|-]+")
_LOCAL_SCHEMES = ("file", "local")
# Object stores: no atomic rename, but a PUT is all-or-nothing.
_OBJECT_STORE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "oci", "ocilake", "tos", "tosfs"}
)


T = TypeVar("T")
Ready = Callable[[int], int]
# check(view, ready): `view` is the whole object, but only its first ready(n) bytes are
# there yet: ready(n) blocks until at least min(n, len(view)) bytes are and returns how many
# are (it raises when the copy failed). A check reads only below what ready returned.
Check = Callable[[memoryview, Ready], T]
Progress = Callable[[int], None]
COPY_CHUNK_BYTES = 16 << 20  # BytesSource.write_to: one pwrite (a check follows it)


class ObjectSource(Protocol):
    """The bytes of an object to be put, read at most once."""

    @property
    def length(self) -> int: ...

    def write_to(self, fd: int, progress: Progress | None = None) -> None:
        """Writes all `length` bytes to `fd` at offset 0 on, calling progress(bytes written
        so far) as it goes (CorruptData when fewer bytes exist)."""
        ...

    def read(self) -> bytes:
        """All `length` bytes (CorruptData when fewer exist)."""
        ...


class BytesSource:
    """An ObjectSource over bytes already in memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def length(self) -> int:
        return len(self.data)

    def write_to(self, fd: int, progress: Progress | None = None) -> None:
        view = memoryview(self.data)
        written = 0
        while written < len(view):
            written += os.pwrite(fd, view[written : written + COPY_CHUNK_BYTES], written)
            if progress is not None:
                progress(written)

    def read(self) -> bytes:
        return self.data


class TieredBackend(Protocol):
    """An object store of immutable whole objects under '/'-separated keys."""

    # True when `put` returns only once the object holds exactly the bytes given, durably
    # (it wrote them from that buffer and fsynced, or compared an existing object byte
    # for byte): re-reading it to verify would check nothing more.
    puts_are_verified: bool

    def put(self, key: str, data: bytes) -> None:
        """Stores `data` at `key` atomically; the same bytes again is a no-op,
        different bytes FailedPrecondition."""
        ...

    def put_checked(self, key: str, source: ObjectSource, check: Check[T]) -> T:
        """Stores `source`'s bytes at `key` like `put`, but first calls `check` on the
        bytes as they will be stored and publishes nothing when it raises; returns what
        `check` returned. `check` must not keep the view (or a slice of it)."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object; NotFound when missing."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to `length` bytes from `start` (fewer only at the object's end);
        InvalidArgument when `start` is past the end."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> builtins.list[str]:
        """The sorted keys starting with `prefix` (a plain string prefix, "" for all)."""
        ...

    def delete(self, key: str) -> None:
        """Removes the object; a missing key is fine."""
        ...

    def size(self, key: str) -> int:
        """The object's length in bytes; NotFound when missing."""
        ...


def validate_key(key: str) -> str:
    """`key` when it is a safe relative '/'-separated path, else InvalidArgument."""
    if not isinstance(key, str) or not 0 < len(key) <= KEY_CHARS_MAX:
        raise InvalidArgument(f"key {key!r} must be a string of 1-{KEY_CHARS_MAX} characters")
    if TEMP_MARK in key:
        raise InvalidArgument(f"key {key!r} contains {TEMP_MARK!r}, which names temporary files")
    for segment in key.split("/"):
        if (
            segment in ("", ".", "..")
            or len(segment) > KEY_SEGMENT_CHARS_MAX
            or not _KEY_SEGMENT.fullmatch(segment)
        ):
            raise InvalidArgument(
                f"key {key!r} is malformed: use '/'-separated relative segments of 1-"
                f"{KEY_SEGMENT_CHARS_MAX} characters from A-Z a-z 0-9 _ . = % | - "
                "(no empty, '.' or '..' segment, no leading '/')"
            )
    return key


def _validate_prefix(prefix: str) -> str:
    """A list prefix: "" or a key prefix, whose last segment may be partial or empty."""
    if not isinstance(prefix, str):
        raise InvalidArgument(f"prefix {prefix!r} must be a string")
    if prefix:
        head, _, tail = prefix.rpartition("/")
        if head:
            validate_key(head)
        if (tail and not _KEY_SEGMENT.fullmatch(tail)) or TEMP_MARK in tail:
            raise InvalidArgument(f"prefix {prefix!r} is malformed (see validate_key)")
    return prefix


def _check_data(key: str, data: bytes) -> bytes:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgument(f"data for {key!r} must be bytes, not {type(data).__name__}")
    if len(data) > OBJECT_BYTES_MAX:
        raise InvalidArgument(f"object {key!r} would be {len(data)} bytes; the limit is {OBJECT_BYTES_MAX}")
    return bytes(data)


def _check_length(key: str, length: int) -> None:
    if length > OBJECT_BYTES_MAX:
        raise InvalidArgument(f"object {key!r} would be {length} bytes; the limit is {OBJECT_BYTES_MAX}")


def _check_range(start: int, length: int) -> None:
    for kind, value in (("start", start), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= OBJECT_BYTES_MAX:
            raise InvalidArgument(f"{kind} {value!r} is not an integer in [0, {OBJECT_BYTES_MAX}]")


def _refuse_overwrite(key: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"object {key!r} already exists with different bytes; tiered objects "
        "are immutable (delete it first if it is known garbage)"
    )


@contextmanager
def _translated(action: str, key: str) -> Iterator[None]:
    """Maps dependency and OS errors to the project's errors."""
    try:
        yield
    except MqmetaError:
        raise
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise NotFound(f"tiered object {key!r} not found") from None
    except Exception as exc:  # any fsspec implementation's own errors too
        raise Unavailable(f"tiered storage could not {action} {key!r}: {type(exc).__name__}: {exc}") from exc


class LocalBackend:
    """Objects as POSIX files under `root` (created when missing)."""

    puts_are_verified = True  # with fsync: see _publish and _same_object

    def __init__(self, root: Path | str, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.puts_are_verified = fsync
        with _translated("create the root directory", str(self.root)):
            self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def _make_parents(self, path: Path) -> None:
        """mkdir -p, fsyncing each new directory's parent so the entry is durable."""
        missing = []
        parent = path.parent
        while parent != self.root and not parent.is_dir():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:
                continue  # a concurrent put made it
            if self.fsync:
                fsync_dir(directory.parent)

    def _write_temp(self, tmp: Path, data: bytes) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        data = _check_data(key, data)
        with _translated("write", key):
            same = self._same_object(path, data)
            if same is None:
                self._make_parents(path)
                same = self._publish(path, data)
            if not same:
                raise _refuse_overwrite(key)

    def put_checked(self, key: str, source: ObjectSource, check: Check[T]) -> T:
        path = self._path(key)
        _check_length(key, source.length)
        with _translated("write", key):
            self._make_parents(path)
            tmp = path.with_name(path.name + TEMP_MARK + uuid.uuid4().hex)
            try:
                result = self._write_checked(tmp, source, check)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    if not _same_files(path, tmp):
                        raise _refuse_overwrite(key) from None
                return result
            finally:
                tmp.unlink(missing_ok=True)
                if self.fsync:
                    fsync_dir(path.parent)

    def _write_checked(self, tmp: Path, source: ObjectSource, check: Check[T]) -> T:
        """Copies `source` into the new file `tmp` in a worker thread (then fsyncs it there)
        while `check` runs here over a map of the file, following the copy's progress:
        copy, fsync and check overlap (the copy and the fsync release the GIL)."""
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            length = source.length
            if not length:
                return check(memoryview(b""), lambda n: 0)
            os.ftruncate(fd, length)  # the map's size; the copy fills it
            progress = _Progress(length)
            with (
                mmap.mmap(fd, length, flags=mmap.MAP_SHARED) as mapped,
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiered-copy") as pool,
            ):
                copied = pool.submit(self._copy_and_sync, source, fd, progress)
                view = memoryview(mapped)
                try:
                    result, error = check(view, progress.wait), None
                except BaseException as raised:
                    result, error = None, _without_frames(raised)
                view.release()
                wait_all([copied])  # the fd and the map stay until the copy is done
            if error is not None:
                raise error
            copied.result()
            return result  # type: ignore[return-value]
        finally:
            os.close(fd)

    def _copy_and_sync(self, source: ObjectSource, fd: int, progress: _Progress) -> None:
        try:
            source.write_to(fd, progress.advance)
            if self.fsync:
                os.fsync(fd)
        except BaseException as error:
            progress.fail(error)
            raise

    def _publish(self, path: Path, data: bytes) -> bool | None:
        """Writes a temporary file and hard-links it at `path`; when another writer got
        there first, whether its object holds the same bytes."""
        tmp = path.with_name(path.name + TEMP_MARK + uuid.uuid4().hex)
        try:
            self._write_temp(tmp, data)
            os.link(tmp, path)  # never replaces an existing file, unlike rename
            return True
        except FileExistsError:
            return self._same_object(path, data)
        finally:
            tmp.unlink(missing_ok=True)
            if self.fsync:
                fsync_dir(path.parent)

    def _same_object(self, path: Path, data: bytes) -> bool | None:
        """None when there is no file at `path`, else whether it holds exactly `data`."""
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return None
        with f:
            if os.fstat(f.fileno()).st_size != len(data):
                return False
            for pos in range(0, len(data), _COMPARE_CHUNK_BYTES):
                if f.read(_COMPARE_CHUNK_BYTES) != data[pos : pos + _COMPARE_CHUNK_BYTES]:
                    return False
            return True

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with _translated("read", key), open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > OBJECT_BYTES_MAX:
                raise FailedPrecondition(
                    f"object {key!r} is {size} bytes, past the "
                    f"{OBJECT_BYTES_MAX}-byte limit; not written by us"
                )
            return f.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        _check_range(start, length)
        path = self._path(key)
        with _translated("read", key), open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if start > size:
                raise InvalidArgument(f"start {start} is past the end of {key!r} ({size} bytes)")
            return os.pread(f.fileno(), min(length, size - start), start)

    def exists(self, key: str) -> bool:
        path = self._path(key)
        with _translated("look up", key):
            return path.is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        with _translated("look up", key):
            if not path.is_file():
                raise NotFound(f"tiered object {key!r} not found")
            return path.stat().st_size

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _translated("delete", key):
            try:
                path.unlink()
            except FileNotFoundError:
                return
            if self.fsync:
                fsync_dir(path.parent)

    def list(self, prefix: str) -> builtins.list[str]:
        _validate_prefix(prefix)
        directory = self.root / prefix.rpartition("/")[0]
        keys: builtins.list[str] = []
        with _translated("list", prefix):
            for dirpath, dirnames, filenames in os.walk(directory, onerror=_raise_unless_missing):
                dirnames.sort()
                relative = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    key = name if relative == "." else f"{relative}/{name}"
                    if key.startswith(prefix) and TEMP_MARK not in name:
                        keys.append(key)
                        _check_list_size(prefix, len(keys))
        return sorted(keys)


def _without_frames(error: BaseException) -> BaseException:
    """`error` with its traceback (and its context's) dropped: their frames hold slices of
    the object's memory map, which cannot be closed while they live. The message stays."""
    seen: BaseException | None = error
    for _ in range(16):  # bounded: exception chains are short
        if seen is None:
            break
        seen.__traceback__ = None
        seen = seen.__context__ or seen.__cause__
    return error


class _Progress:
    """How much of an object a copy has written, for a check that follows it."""

    def __init__(self, length: int) -> None:
        self.length = length
        self._written = 0
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def advance(self, written: int) -> None:
        with self._changed:
            self._written = written
            self._changed.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._changed:
            self._error = error
            self._changed.notify_all()

    def wait(self, wanted: int) -> int:
        """Blocks until min(wanted, length) bytes are written; returns how many are."""
        wanted = min(wanted, self.length)
        with self._changed:
            while self._written < wanted:
                if self._error is not None:
                    raise CorruptData(f"the copy of the object failed: {self._error}")
                self._changed.wait(COPY_WAIT_S)
            return self._written


COPY_WAIT_S = 1.0  # a follower re-checks for a failed copy at least this often


def _same_files(path: Path, other: Path) -> bool:
    """Whether two files hold the same bytes."""
    with open(path, "rb") as a, open(other, "rb") as b:
        if os.fstat(a.fileno()).st_size != os.fstat(b.fileno()).st_size:
            return False
        for _ in range(OBJECT_BYTES_MAX // _COMPARE_CHUNK_BYTES + 1):  # bounded by the object limit
            chunk = a.read(_COMPARE_CHUNK_BYTES)
            if chunk != b.read(_COMPARE_CHUNK_BYTES):
                return False
            if not chunk:
                return True
    return False


def _raise_unless_missing(error: OSError) -> None:
    if error.errno not in (errno.ENOENT, errno.ENOTDIR):  # nothing listed under a file
        raise error


def _check_list_size(prefix: str, count: int) -> None:
    if count > LIST_KEYS_MAX:
        raise FailedPrecondition(
            f"more than {LIST_KEYS_MAX} keys start with {prefix!r}; list a narrower prefix"
        )


class FsspecBackend:
    """Objects under an fsspec URL (`memory://root`, `file:///dir`, `s3://bucket/dir`, ...)."""

    puts_are_verified = False  # what a remote store kept is known only by reading it back

    def __init__(self, url: str, **storage_options: Any) -> None:
        scheme = _scheme_of(url)
        if scheme is None:
            raise InvalidArgument(f"{url!r} is not a URL (scheme://path); use open_backend for paths")
        with _translated("open", url):
            try:
                fs, root = fsspec.core.url_to_fs(url, **storage_options)
            except ImportError as exc:
                raise InvalidArgument(
                    f"the {scheme}:// filesystem needs a package that is not installed ({exc})"
                ) from None
        self.url = url
        self.fs = fs
        self.root = str(root).rstrip("/")
        self.direct_put = scheme in _OBJECT_STORE_SCHEMES

    def __repr__(self) -> str:
        return f"FsspecBackend({self.url!r})"

    def _path(self, key: str) -> str:
        return f"{self.root}/{validate_key(key)}"

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        data = _check_data(key, data)
        with _translated("write", key):
            if self.fs.isfile(path):
                self._settle(key, path, data)
            elif self.direct_put:
                try:
                    self.fs.pipe_file(path, data, mode="create")
                except FileExistsError:
                    self._settle(key, path, data)
            else:
                self._publish(path, data)

    def put_checked(self, key: str, source: ObjectSource, check: Check[T]) -> T:
        _check_length(key, source.length)
        data = source.read()  # the one read of the source
        view = memoryview(data)
        try:
            result = check(view, lambda n: len(data))
        finally:
            view.release()
        self.put(key, data)
        return result

    def _publish(self, path: str, data: bytes) -> None:
        tmp = path + TEMP_MARK + uuid.uuid4().hex
        self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        finally:
            if self.fs.exists(tmp):
                self.fs.rm_file(tmp)

    def _settle(self, key: str, path: str, data: bytes) -> None:
        """Returns when the object at `path` holds exactly `data`."""
        if self.fs.size(path) != len(data) or bytes(self.fs.cat_file(path)) != data:
            raise _refuse_overwrite(key)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with _translated("read", key):
            size = self.fs.size(path)
            if size > OBJECT_BYTES_MAX:
                raise FailedPrecondition(
                    f"object {key!r} is {size} bytes, past the "
                    f"{OBJECT_BYTES_MAX}-byte limit; not written by us"
                )
            return bytes(self.fs.cat_file(path))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        _check_range(start, length)
        path = self._path(key)
        with _translated("read", key):
            data = bytes(self.fs.cat_file(path, start=start, end=start + length)) if length else b""
            if len(data) < length and start > self.fs.size(path):
                raise InvalidArgument(f"start {start} is past the end of {key!r}")
            return data

    def exists(self, key: str) -> bool:
        path = self._path(key)
        with _translated("look up", key):
            return bool(self.fs.isfile(path))

    def size(self, key: str) -> int:
        path = self._path(key)
        with _translated("look up", key):
            if not self.fs.isfile(path):
                raise NotFound(f"tiered object {key!r} not found")
            return int(self.fs.size(path))

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _translated("delete", key):
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                return

    def list(self, prefix: str) -> builtins.list[str]:
        _validate_prefix(prefix)
        directory = f"{self.root}/{prefix.rpartition('/')[0]}".rstrip("/")
        keys: builtins.list[str] = []
        with _translated("list", prefix):
            self.fs.invalidate_cache(directory)  # another process may have written
            for path in self.fs.find(directory, detail=False):
                key = str(path)[len(self.root) + 1 :]
                if key.startswith(prefix) and TEMP_MARK not in key:
                    keys.append(key)
                    _check_list_size(prefix, len(keys))
        return sorted(keys)


def _scheme_of(url_or_path: str) -> str | None:
    scheme, sep, _ = url_or_path.partition("://")
    return scheme.lower() if sep else None


def open_backend(url_or_path: str) -> TieredBackend:
    """LocalBackend for a plain path or file:// URL, FsspecBackend for another fsspec scheme."""
    if not isinstance(url_or_path, str) or not url_or_path.strip():
        raise InvalidArgument(f"tiered storage location {url_or_path!r} is empty")
    if "::" in url_or_path:
        raise InvalidArgument(
            f"chained fsspec URLs such as {url_or_path!r} are not supported: "
            "caching layers break atomic publication"
        )
    scheme = _scheme_of(url_or_path)
    if scheme is None:
        return LocalBackend(Path(url_or_path))
    if scheme in _LOCAL_SCHEMES:
        path = url_or_path.partition("://")[2]
        if not path:
            raise InvalidArgument(f"{url_or_path!r} names no directory")
        return LocalBackend(Path(path))
    require_for_url(url_or_path, "tiered storage")
    if scheme not in fsspec.available_protocols():
        raise InvalidArgument(
            f"tiered storage location {url_or_path!r} has the unknown scheme "
            f"{scheme!r}: use a path, file://, memory://, or another fsspec "
            "scheme such as s3:// or gs://"
        )
    return FsspecBackend(url_or_path)
