"""The page cache and the namespace of the fault filesystem: what survives a power loss.

A file's synced bytes live in a store file (`<backing>/.faultfs/inodes/<number>`, the
"disk"); what was written since its last fsync/fdatasync lives here, in memory, as
dirty 4 KiB pages. A directory keeps two entry tables: the one readers see, and the
durable one, copied from it when the directory is fsynced (a create, rename, unlink or
mkdir is durable only then, as ext4/xfs promise for a directory fsync and no more).
`lose_power()` drops every dirty page and every entry table back to its durable copy:
what a machine holds after its power is cut.

Linux semantics kept on purpose:
- a failed fsync (EIO) marks the dirty pages clean without writing them: they stay
  readable, a later fsync succeeds, and a power loss loses them (errseq writeback
  errors; PostgreSQL's "fsyncgate");
- fsync and fdatasync both persist data and size (fdatasync skips only metadata that
  reading does not need; this model keeps no such metadata durable anyway);
- a power loss may have written some dirty pages back before the cut
  (`writeback_fraction`): a torn write at page granularity, holes read as zeros.

Not modelled: permissions, owners and timestamps are never lost (kept in memory and
written on unmount). A rename between two directories is durable per directory: with only
the new one fsynced, the entry is durable in both (a directory too: unmount then writes it
twice, its files hard-linked). Every method runs under the caller's lock
(fuse_ops.FaultOperations).
"""

from __future__ import annotations

import enum
import errno
import os
import random
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

PAGE_BYTES = 4096
ROOT_NUMBER = 1
STATE_DIRECTORY = ".faultfs"
# Dirty bytes kept before the oldest-written file is written back, as the kernel's
# background writeback would (a bound on this process's memory, counted in writebacks).
DIRTY_BYTES_MAX = 512 * 1024 * 1024


class Kind(enum.Enum):
    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"


class FsError(OSError):
    """An errno for the caller (the FUSE layer returns it as -errno)."""

    def __init__(self, code: int, what: str = "") -> None:
        super().__init__(code, os.strerror(code) + (f": {what}" if what else ""))


@dataclass
class Inode:
    number: int
    kind: Kind
    mode: int  # permission bits
    uid: int = 0
    gid: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)
    links: int = 0  # names in the readers' namespace
    opens: int = 0
    # FILE: readers see `size` bytes: dirty or failed pages first, then the store's first
    # `store_valid_bytes` (lowered by a truncate since the last sync), zeros after.
    size: int = 0
    durable_size: int = 0
    store_valid_bytes: int = 0
    dirty: dict[int, bytearray] = field(default_factory=dict)
    failed: dict[int, bytearray] = field(default_factory=dict)  # written back with EIO
    store_fd: int = -1
    # DIRECTORY
    entries: dict[str, int] = field(default_factory=dict)
    durable_entries: dict[str, int] = field(default_factory=dict)
    # SYMLINK
    target: str = ""


@dataclass
class Faults:
    fsync_delay_ms: int = 0
    read_delay_ms: int = 0
    fsync_failures_pending: int = 0
    fsync_failure_under: str = "/"  # only fsyncs of paths under this one fail
    disk_full: bool = False


@dataclass
class Counters:
    fsyncs: int = 0
    fdatasyncs: int = 0
    directory_fsyncs: int = 0
    failed_fsyncs: int = 0
    enospc_refusals: int = 0
    power_losses: int = 0
    writebacks: int = 0
    pages_lost: int = 0
    pages_torn_in: int = 0


class PageCache:
    """The filesystem's state over `backing`: imported at start, written back by `close`."""

    def __init__(self, backing: Path, dirty_bytes_max: int = DIRTY_BYTES_MAX) -> None:
        self.backing = backing.resolve()
        self.state = self.backing / STATE_DIRECTORY
        self.store = self.state / "inodes"
        self.dirty_bytes_max = dirty_bytes_max
        self.inodes: dict[int, Inode] = {}
        self.faults = Faults()
        self.counters = Counters()
        self._next_number = ROOT_NUMBER
        self._dirty_bytes = 0
        self._import()

    # --- namespace -------------------------------------------------------------------

    def lookup(self, path: str) -> Inode:
        inode = self.inodes[ROOT_NUMBER]
        for name in _names(path):
            if inode.kind is not Kind.DIRECTORY:
                raise FsError(errno.ENOTDIR, path)
            number = inode.entries.get(name)
            if number is None:
                raise FsError(errno.ENOENT, path)
            inode = self.inodes[number]
        return inode

    def parent_of(self, path: str) -> tuple[Inode, str]:
        names = _names(path)
        if not names:
            raise FsError(errno.EBUSY, "the root")
        parent = self.lookup("/" + "/".join(names[:-1]))
        if parent.kind is not Kind.DIRECTORY:
            raise FsError(errno.ENOTDIR, path)
        return parent, names[-1]

    def make(self, path: str, kind: Kind, mode: int, uid: int, gid: int, target: str = "") -> Inode:
        self.refuse_if_full()
        parent, name = self.parent_of(path)
        if name in parent.entries:
            raise FsError(errno.EEXIST, path)
        inode = self._new_inode(kind, mode, uid, gid)
        inode.target = target
        self._link(parent, name, inode)
        return inode

    def link(self, existing: str, new: str) -> None:
        self.refuse_if_full()
        inode = self.lookup(existing)
        if inode.kind is Kind.DIRECTORY:
            raise FsError(errno.EPERM, existing)
        parent, name = self.parent_of(new)
        if name in parent.entries:
            raise FsError(errno.EEXIST, new)
        self._link(parent, name, inode)

    def unlink(self, path: str, directory: bool) -> None:
        parent, name = self.parent_of(path)
        inode = self.lookup(path)
        if directory and inode.kind is not Kind.DIRECTORY:
            raise FsError(errno.ENOTDIR, path)
        if not directory and inode.kind is Kind.DIRECTORY:
            raise FsError(errno.EISDIR, path)
        if directory and inode.entries:
            raise FsError(errno.ENOTEMPTY, path)
        self._unlink(parent, name)

    def rename(self, old: str, new: str) -> None:
        old_parent, old_name = self.parent_of(old)
        inode = self.lookup(old)
        new_parent, new_name = self.parent_of(new)
        if inode.kind is Kind.DIRECTORY and _is_inside(new, old):
            raise FsError(errno.EINVAL, f"{new} is inside {old}")
        replaced_number = new_parent.entries.get(new_name)
        if replaced_number == inode.number:
            return
        if replaced_number is not None:
            replaced = self.inodes[replaced_number]
            if replaced.kind is Kind.DIRECTORY and inode.kind is not Kind.DIRECTORY:
                raise FsError(errno.EISDIR, new)
            if replaced.kind is not Kind.DIRECTORY and inode.kind is Kind.DIRECTORY:
                raise FsError(errno.ENOTDIR, new)
            if replaced.entries:
                raise FsError(errno.ENOTEMPTY, new)
            self._unlink(new_parent, new_name)
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = inode.number
        old_parent.mtime_ns = new_parent.mtime_ns = time.time_ns()

    def sync_directory(self, directory: Inode) -> None:
        """fsync of a directory: its entries as readers see them become durable."""
        self.counters.directory_fsyncs += 1
        if self._take_pending_failure(directory):  # the entries stay as unsynced as they were
            raise FsError(errno.EIO, "injected: the next fsync fails")
        directory.durable_entries = dict(directory.entries)
        self._collect()

    # --- file data -------------------------------------------------------------------

    def read(self, inode: Inode, offset: int, count: int) -> bytes:
        end = min(inode.size, offset + count)
        if offset >= end:
            return b""
        out = bytearray()
        for index in range(offset // PAGE_BYTES, (end - 1) // PAGE_BYTES + 1):
            page = self._page(inode, index)
            start = index * PAGE_BYTES
            out += page[max(offset, start) - start : min(end, start + PAGE_BYTES) - start]
        return bytes(out)

    def write(self, inode: Inode, offset: int, data: bytes) -> int:
        self.refuse_if_full()
        if not data:
            return 0
        end = offset + len(data)
        for index in range(offset // PAGE_BYTES, (end - 1) // PAGE_BYTES + 1):
            page = inode.dirty.get(index)
            if page is None:
                page = bytearray(self._page(inode, index))
                inode.dirty[index] = page
                inode.failed.pop(index, None)
                self._dirty_bytes += PAGE_BYTES
            start = index * PAGE_BYTES
            low, high = max(offset, start), min(end, start + PAGE_BYTES)
            page[low - start : high - start] = data[low - offset : high - offset]
        inode.size = max(inode.size, end)
        inode.mtime_ns = time.time_ns()
        if self._dirty_bytes > self.dirty_bytes_max:
            self._write_back_largest()
        return len(data)

    def truncate(self, inode: Inode, length: int) -> None:
        if inode.kind is not Kind.FILE:
            raise FsError(errno.EISDIR)
        if length < inode.size:
            for pages in (inode.dirty, inode.failed):
                for index in [i for i in pages if i * PAGE_BYTES >= length]:
                    del pages[index]
                    self._dirty_bytes -= PAGE_BYTES if pages is inode.dirty else 0
                tail = pages.get(length // PAGE_BYTES)
                if tail is not None:
                    tail[length % PAGE_BYTES :] = bytes(PAGE_BYTES - length % PAGE_BYTES)
            inode.store_valid_bytes = min(inode.store_valid_bytes, length)
        inode.size = length
        inode.mtime_ns = time.time_ns()

    def sync_file(self, inode: Inode, data_only: bool) -> None:
        """fsync/fdatasync: the file's dirty pages and size become durable."""
        if data_only:
            self.counters.fdatasyncs += 1
        else:
            self.counters.fsyncs += 1
        if self._take_pending_failure(inode):
            # Linux marks the pages clean without writing them: readable, never durable.
            for index, page in inode.dirty.items():
                inode.failed[index] = page
            self._dirty_bytes -= PAGE_BYTES * len(inode.dirty)
            inode.dirty.clear()
            raise FsError(errno.EIO, "injected: the next fsync fails")
        self._write_back(inode)

    def path_of(self, inode: Inode) -> str:
        """One name of `inode` readers see ("(unlinked)" when none), for log lines."""
        parents = {n: (d.number, name) for d in self.inodes.values() for name, n in d.entries.items()}
        names: list[str] = []
        number = inode.number
        while number != ROOT_NUMBER:
            if number not in parents or len(names) > len(self.inodes):
                return "(unlinked)"
            number, name = parents[number]
            names.append(name)
        return "/" + "/".join(reversed(names))

    def sync_all(self) -> None:
        """Everything becomes durable (a clean unmount, or `sync`)."""
        for inode in list(self.inodes.values()):
            if inode.kind is Kind.FILE:
                self._write_back(inode)
            elif inode.kind is Kind.DIRECTORY:
                inode.durable_entries = dict(inode.entries)
        self._collect()

    # --- faults ----------------------------------------------------------------------

    def refuse_if_full(self) -> None:
        if self.faults.disk_full:
            self.counters.enospc_refusals += 1
            raise FsError(errno.ENOSPC, "injected: the disk is full")

    def lose_power(self, writeback_fraction: float = 0.0, seed: int = 0) -> None:
        """Everything not synced is gone, except the dirty pages that a seeded draw with
        probability `writeback_fraction` says were written back before the cut."""
        draw = random.Random(seed)
        self.counters.power_losses += 1
        for inode in self.inodes.values():
            if inode.kind is Kind.FILE:
                self._drop_unsynced(inode, draw, writeback_fraction)
            elif inode.kind is Kind.DIRECTORY:
                inode.entries = dict(inode.durable_entries)
            inode.opens = 0
        self._dirty_bytes = 0
        self._recount_links()
        self._collect()

    def dirty_bytes(self) -> int:
        return self._dirty_bytes

    # --- lifecycle -------------------------------------------------------------------

    def close(self, sync: bool) -> None:
        """Writes the durable state back to `backing` as a plain tree (after `sync_all`
        when `sync`: a clean unmount flushes everything) and removes the store."""
        if sync:
            self.sync_all()
        tree = self.state / "tree"
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        self._materialize(self.inodes[ROOT_NUMBER], tree)
        for inode in self.inodes.values():
            if inode.store_fd >= 0:
                os.close(inode.store_fd)
                inode.store_fd = -1
        for entry in list(self.backing.iterdir()):
            if entry.name != STATE_DIRECTORY:
                _remove(entry)
        for entry in list(tree.iterdir()):
            entry.rename(self.backing / entry.name)
        shutil.rmtree(self.state)

    # --- private ---------------------------------------------------------------------

    def _import(self) -> None:
        """The backing tree as it is becomes the durable (and visible) state."""
        if self.state.exists():
            shutil.rmtree(self.state)  # a previous run that never unmounted
        self.store.mkdir(parents=True)
        root = self._new_inode(Kind.DIRECTORY, stat.S_IMODE(self.backing.stat().st_mode), 0, 0)
        assert root.number == ROOT_NUMBER
        by_device_inode: dict[tuple[int, int], Inode] = {}
        self._import_directory(self.backing, root, by_device_inode)
        self._recount_links()

    def _import_directory(self, path: Path, directory: Inode, seen: dict[tuple[int, int], Inode]) -> None:
        for entry in sorted(path.iterdir()):
            if path == self.backing and entry.name == STATE_DIRECTORY:
                continue
            info = entry.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISDIR(info.st_mode):
                child = self._new_inode(Kind.DIRECTORY, mode, info.st_uid, info.st_gid)
                self._import_directory(entry, child, seen)
            elif stat.S_ISLNK(info.st_mode):
                child = self._new_inode(Kind.SYMLINK, mode, info.st_uid, info.st_gid)
                child.target = os.readlink(entry)
            elif stat.S_ISREG(info.st_mode):
                known = seen.get((info.st_dev, info.st_ino))
                child = known or self._new_inode(Kind.FILE, mode, info.st_uid, info.st_gid, store=False)
                if known is None:
                    os.link(entry, self._store_path(child))
                    child.size = child.durable_size = child.store_valid_bytes = info.st_size
                    seen[(info.st_dev, info.st_ino)] = child
            else:
                continue  # sockets, fifos, devices: not part of any data dir
            child.mtime_ns = info.st_mtime_ns
            directory.entries[entry.name] = child.number
        directory.durable_entries = dict(directory.entries)

    def _new_inode(self, kind: Kind, mode: int, uid: int, gid: int, store: bool = True) -> Inode:
        inode = Inode(self._next_number, kind, mode, uid, gid)
        self._next_number += 1
        self.inodes[inode.number] = inode
        if kind is Kind.FILE and store:
            self._store_path(inode).touch()
        return inode

    def _store_path(self, inode: Inode) -> Path:
        return self.store / str(inode.number)

    def _store_fd(self, inode: Inode) -> int:
        if inode.store_fd < 0:
            inode.store_fd = os.open(self._store_path(inode), os.O_RDWR)
        return inode.store_fd

    def _link(self, parent: Inode, name: str, inode: Inode) -> None:
        parent.entries[name] = inode.number
        parent.mtime_ns = time.time_ns()
        inode.links += 1

    def _unlink(self, parent: Inode, name: str) -> None:
        inode = self.inodes[parent.entries.pop(name)]
        parent.mtime_ns = time.time_ns()
        inode.links -= 1

    def _page(self, inode: Inode, index: int) -> bytes:
        """Page `index` as readers see it (zeros past the size)."""
        page = inode.dirty.get(index)
        if page is None:
            page = inode.failed.get(index)
        if page is not None:
            return bytes(page)
        start = index * PAGE_BYTES
        valid = max(0, min(inode.store_valid_bytes, inode.size, start + PAGE_BYTES) - start)
        data = os.pread(self._store_fd(inode), valid, start) if valid else b""
        return data + bytes(PAGE_BYTES - len(data))

    def _write_back(self, inode: Inode) -> None:
        fd = self._store_fd(inode)
        os.ftruncate(fd, inode.store_valid_bytes)  # what a truncate cut reads as zeros
        for index in sorted(inode.dirty):
            start = index * PAGE_BYTES
            os.pwrite(fd, inode.dirty[index][: max(0, min(PAGE_BYTES, inode.size - start))], start)
        os.ftruncate(fd, inode.size)
        self._dirty_bytes -= PAGE_BYTES * len(inode.dirty)
        inode.dirty.clear()
        inode.durable_size = inode.store_valid_bytes = inode.size

    def _write_back_largest(self) -> None:
        largest = max((i for i in self.inodes.values() if i.kind is Kind.FILE), key=lambda i: len(i.dirty))
        self.counters.writebacks += 1
        self._write_back(largest)

    def _drop_unsynced(self, inode: Inode, draw: random.Random, writeback_fraction: float) -> None:
        kept = {i: p for i, p in inode.dirty.items() if draw.random() < writeback_fraction}
        self.counters.pages_lost += len(inode.dirty) - len(kept)
        self.counters.pages_torn_in += len(kept)
        if kept:
            fd = self._store_fd(inode)
            for index in sorted(kept):
                start = index * PAGE_BYTES
                os.pwrite(fd, kept[index][: max(0, min(PAGE_BYTES, inode.size - start))], start)
            inode.durable_size = os.fstat(fd).st_size
        inode.dirty.clear()
        inode.failed.clear()
        inode.size = inode.store_valid_bytes = inode.durable_size

    def _take_pending_failure(self, inode: Inode) -> bool:
        if self.faults.fsync_failures_pending <= 0:
            return False
        if self.faults.fsync_failure_under != "/" and not _is_inside(
            self.path_of(inode), self.faults.fsync_failure_under
        ):
            return False
        self.faults.fsync_failures_pending -= 1
        self.counters.failed_fsyncs += 1
        return True

    def _recount_links(self) -> None:
        for inode in self.inodes.values():
            inode.links = 0
        for inode in list(self.inodes.values()):
            for number in inode.entries.values():
                self.inodes[number].links += 1
        self.inodes[ROOT_NUMBER].links = 1

    def _collect(self) -> None:
        """Frees the inodes that no name (visible or durable) and no open file reaches."""
        reached: set[int] = set()
        pending = [ROOT_NUMBER] + [i.number for i in self.inodes.values() if i.opens > 0]
        while pending:
            number = pending.pop()
            if number in reached:
                continue
            reached.add(number)
            inode = self.inodes[number]
            pending += list(inode.entries.values()) + list(inode.durable_entries.values())
        for number in [n for n in self.inodes if n not in reached]:
            inode = self.inodes.pop(number)
            self._dirty_bytes -= PAGE_BYTES * len(inode.dirty)
            if inode.store_fd >= 0:
                os.close(inode.store_fd)
            if inode.kind is Kind.FILE:
                self._store_path(inode).unlink(missing_ok=True)

    def _materialize(self, directory: Inode, path: Path, above: frozenset[int] = frozenset()) -> None:
        above = above | {directory.number}
        for name, number in directory.durable_entries.items():
            inode = self.inodes[number]
            target = path / name
            if inode.kind is Kind.DIRECTORY:
                if number in above:
                    continue  # renames crossing unsynced directories made a durable cycle
                target.mkdir()
                self._materialize(inode, target, above)
            elif inode.kind is Kind.SYMLINK:
                target.symlink_to(inode.target)
                continue
            else:
                os.link(self._store_path(inode), target)
            os.chmod(target, inode.mode)
            os.utime(target, ns=(inode.mtime_ns, inode.mtime_ns))


def _names(path: str) -> list[str]:
    return [name for name in path.split("/") if name]


def _is_inside(path: str, directory: str) -> bool:
    names, prefix = _names(path), _names(directory)
    return names[: len(prefix)] == prefix


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
