"""The FUSE side: libfuse3's high-level calls (through mfusepy) onto the page cache.

One lock serializes the cache; an injected delay sleeps before taking it, so a slow
fsync stalls its caller and not every other reader. File handles name inodes (the
filesystem runs with `nullpath_ok` and `hard_remove`, so an open file that was unlinked
or renamed is still reached by its handle). A power loss closes every handle: a process
still holding one gets EIO, as a process on a rebooted machine would have nothing.

The kernel is told to cache no attributes, names or negative look-ups (timeouts 0), and
it drops a file's cached pages at each open (no keep_cache): after a power loss a
restarted process reads what this cache says, not what the kernel remembered.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import mfusepy
from mqmeta.chaos.faultfs.cache import FsError, Inode, Kind, PageCache

log = logging.getLogger(__name__)
T = TypeVar("T")
_KIND_BITS = {Kind.FILE: stat.S_IFREG, Kind.DIRECTORY: stat.S_IFDIR, Kind.SYMLINK: stat.S_IFLNK}


class FaultOperations(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True
    flag_nopath = True
    flag_nullpath_ok = True

    def __init__(self, cache: PageCache) -> None:
        self.cache = cache
        self._mutex = threading.Lock()
        self._handles: dict[int, int] = {}  # handle -> inode number
        self._next_handle = 1

    # --- the control channel's entry points (under the same lock) ---------------------

    def locked(self, action: Callable[[], T]) -> T:
        with self._mutex:
            return action()

    def lose_power(self, writeback_fraction: float, seed: int) -> None:
        with self._mutex:
            self._handles.clear()
            self.cache.lose_power(writeback_fraction, seed)

    # --- libfuse -------------------------------------------------------------------

    def init_with_config(self, conn_info: Any, config: Any) -> None:
        if config is not None:
            config.entry_timeout = config.negative_timeout = config.attr_timeout = 0.0
            config.hard_remove = 1
            config.use_ino = 1
            config.nullpath_ok = 1

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            inode = self._inode(path, fh)
            size = inode.size if inode.kind is Kind.FILE else len(inode.target)
            return {
                "st_mode": _KIND_BITS[inode.kind] | inode.mode,
                "st_ino": inode.number,
                "st_nlink": max(1, inode.links) + (1 if inode.kind is Kind.DIRECTORY else 0),
                "st_uid": inode.uid,
                "st_gid": inode.gid,
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_blksize": 4096,
                "st_atime": inode.mtime_ns,
                "st_mtime": inode.mtime_ns,
                "st_ctime": inode.mtime_ns,
            }

    def opendir(self, path: str) -> int:
        with self._mutex:
            inode = self.cache.lookup(path)
            if inode.kind is not Kind.DIRECTORY:
                raise FsError(errno.ENOTDIR, path)
            return self._open_handle(inode)

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # with use_ino an entry needs its inode number: glibc skips a d_ino of 0
        with self._mutex:
            directory = self._inode(path, fh)
            listed = [(".", directory.number), ("..", directory.number), *directory.entries.items()]
            return [(name, {"st_ino": number, "st_mode": self._mode(number)}, 0) for name, number in listed]

    def releasedir(self, path: str | None, fh: int) -> int:
        return self.release(path, fh)

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self._delay(self.cache.faults.fsync_delay_ms)
        with self._mutex:
            directory = self._inode(path, fh)
            try:
                self.cache.sync_directory(directory)
            except FsError:
                log.warning("directory fsync of %s failed with EIO (injected)", self.cache.path_of(directory))
                raise
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            uid, gid, _ = mfusepy.fuse_get_context()
            self.cache.make(path, Kind.DIRECTORY, stat.S_IMODE(mode), uid, gid)
        return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            self.cache.unlink(path, directory=True)
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            self.cache.unlink(path, directory=False)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            self.cache.rename(old, new)
        return 0

    def link(self, target: str, source: str) -> int:
        with self._mutex:
            self.cache.link(source, target)
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self._mutex:
            uid, gid, _ = mfusepy.fuse_get_context()
            self.cache.make(target, Kind.SYMLINK, 0o777, uid, gid, target=source)
        return 0

    def readlink(self, path: str) -> str:
        with self._mutex:
            inode = self.cache.lookup(path)
            if inode.kind is not Kind.SYMLINK:
                raise FsError(errno.EINVAL, path)
            return inode.target

    def create(self, path: str, mode: int, flags: int) -> int:
        with self._mutex:
            uid, gid, _ = mfusepy.fuse_get_context()
            inode = self.cache.make(path, Kind.FILE, stat.S_IMODE(mode), uid, gid)
            return self._open_handle(inode)

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            inode = self.cache.lookup(path)
            if inode.kind is not Kind.FILE:
                raise FsError(errno.EISDIR, path)
            if flags & os.O_TRUNC:
                self.cache.truncate(inode, 0)
            return self._open_handle(inode)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        self._delay(self.cache.faults.read_delay_ms)
        with self._mutex:
            return self.cache.read(self._inode(path, fh), offset, size)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            return self.cache.write(self._inode(path, fh), offset, data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self.cache.truncate(self._inode(path, fh), length)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self._delay(self.cache.faults.fsync_delay_ms)
        with self._mutex:
            inode = self._inode(path, fh)
            try:
                self.cache.sync_file(inode, data_only=bool(datasync))
            except FsError:
                log.warning("fsync of %s failed with EIO (injected)", self.cache.path_of(inode))
                raise
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close(2) persists nothing

    def release(self, path: str | None, fh: int) -> int:
        with self._mutex:
            number = self._handles.pop(fh, None)
            if number is not None and number in self.cache.inodes:
                self.cache.inodes[number].opens -= 1
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        with self._mutex:
            if path is not None:
                self.cache.lookup(path).mode = stat.S_IMODE(mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        with self._mutex:
            if path is not None:
                inode = self.cache.lookup(path)
                inode.uid = inode.uid if uid == -1 else uid
                inode.gid = inode.gid if gid == -1 else gid
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        with self._mutex:
            if path is not None:
                self.cache.lookup(path).mtime_ns = times[1] if times else time.time_ns()
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        real = os.statvfs(self.cache.backing)
        full = self.cache.faults.disk_full
        return {
            "f_bsize": real.f_bsize,
            "f_frsize": real.f_frsize,
            "f_blocks": real.f_blocks,
            "f_bfree": 0 if full else real.f_bfree,
            "f_bavail": 0 if full else real.f_bavail,
            "f_files": real.f_files,
            "f_ffree": real.f_ffree,
            "f_favail": real.f_favail,
            "f_namemax": real.f_namemax,
        }

    # --- private -------------------------------------------------------------------

    def _inode(self, path: str | None, fh: int | None) -> Inode:
        if fh is not None and fh != 0:
            number = self._handles.get(fh)
            if number is None:
                raise FsError(errno.EIO, "the handle was closed by a power loss")
            return self.cache.inodes[number]
        if path is None:
            raise FsError(errno.EBADF)
        return self.cache.lookup(path)

    def _mode(self, number: int) -> int:
        inode = self.cache.inodes[number]
        return _KIND_BITS[inode.kind] | inode.mode

    def _open_handle(self, inode: Inode) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = inode.number
        inode.opens += 1
        return handle

    @staticmethod
    def _delay(delay_ms: int) -> None:
        if delay_ms > 0:
            time.sleep(delay_ms / 1000)


class FaultFuse(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, with ftruncate given its handle (mfusepy 3.1.1 drops it on
    libfuse3, and with nullpath_ok the path of an open file may be None)."""

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        result: int = self.operations.truncate(decoded, length, fh)
        return result
