"""The fault filesystem (chaos/faultfs) keeps the POSIX durability rules and no more.

Each test names the rule it checks. Real FUSE mounts in tmp dirs (one per module, each
test in a fresh durable subdirectory), real syscalls, and a power loss in between:
- data written by write(2) is durable only after fsync(2) or fdatasync(2) of the file;
- a directory entry (create, rename, unlink) is durable only after fsync(2) of the
  directory that holds it;
- a failed fsync reports EIO once; the pages it failed to write are marked clean (Linux),
  so a later fsync succeeds and a power loss loses them;
- a delayed disk adds its delay to every fsync and read; a full disk refuses writes with
  ENOSPC until space returns.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqmeta.chaos.faultfs import FaultFs
from mqmeta.chaos.faultfs.cache import Kind, PageCache

from mqmeta.cli import main as cli_main
from tests.support.faultfs_mount import mounted, sync_directory

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: FUSE is not in this kernel"),
]

PAGE = 4096


def _write(path: Path, data: bytes, *, sync: str | None = None, flags: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        os.write(fd, data)
        if sync == "fsync":
            os.fsync(fd)
        elif sync == "fdatasync":
            os.fdatasync(fd)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultFs]:
    with mounted(tmp_path_factory.mktemp("faultfs")) as fs:
        yield fs


@pytest.fixture
def fs(mount: FaultFs) -> Iterator[FaultFs]:
    yield mount
    mount.delay(fsync_ms=0, read_ms=0)
    mount.disk_full(False)
    mount.fail_next_fsync(0)


@pytest.fixture
def here(fs: FaultFs, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of the mount, itself durable (made and its parent fsynced)."""
    directory = fs.mountpoint / request.node.name
    directory.mkdir()
    sync_directory(fs.mountpoint)
    return directory


def _durable_file(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    _write(path, data, sync="fsync")
    sync_directory(directory)
    return path


def test_unsynced_write_is_lost_and_synced_write_kept(fs: FaultFs, here: Path) -> None:
    """write(2) alone promises nothing across a power loss; fsync(2) promises the data."""
    kept = _durable_file(here, "kept", b"synced")
    lost = _durable_file(here, "lost", b"old")
    _write(lost, b"new", flags=os.O_TRUNC)
    assert lost.read_bytes() == b"new"  # readers see the page cache
    fs.lose_power()
    assert kept.read_bytes() == b"synced"
    assert lost.read_bytes() == b"old"


def test_fdatasync_makes_data_and_size_durable(fs: FaultFs, here: Path) -> None:
    """fdatasync(2) persists the data and the size needed to read it back (not mtime)."""
    path = _durable_file(here, "log", b"")
    before = fs.status()["counters"]["fdatasyncs"]
    _write(path, b"x" * 10_000, sync="fdatasync", flags=os.O_APPEND)
    assert fs.status()["counters"]["fdatasyncs"] == before + 1
    fs.lose_power()
    assert path.read_bytes() == b"x" * 10_000


def test_fsynced_file_without_directory_fsync_is_gone(fs: FaultFs, here: Path) -> None:
    """fsync(2) of a new file does not persist its directory entry: the directory must
    be fsynced too (fsync(2): "an explicit fsync() on a file descriptor for the
    directory is also needed")."""
    _write(here / "orphan", b"data", sync="fsync")
    fs.lose_power()
    assert os.listdir(here) == []
    _write(here / "linked", b"data", sync="fsync")
    sync_directory(here)
    _write(here / "late", b"data", sync="fsync")
    fs.lose_power()
    assert os.listdir(here) == ["linked"]
    assert (here / "linked").read_bytes() == b"data"


def test_rename_is_durable_only_after_directory_fsync(fs: FaultFs, here: Path) -> None:
    """rename(2) over an old file (the atomic-replace idiom) survives a power loss only
    once the directory is fsynced; before, the old name and content come back."""
    target = _durable_file(here, "state", b"v1")
    _write(here / "state.tmp", b"v2", sync="fsync")
    sync_directory(here)
    os.rename(here / "state.tmp", target)
    assert target.read_bytes() == b"v2"
    fs.lose_power()
    assert target.read_bytes() == b"v1"
    assert (here / "state.tmp").read_bytes() == b"v2"
    os.rename(here / "state.tmp", target)
    sync_directory(here)
    fs.lose_power()
    assert sorted(os.listdir(here)) == ["state"]
    assert target.read_bytes() == b"v2"


def test_unlink_and_mkdir_are_durable_only_after_directory_fsync(fs: FaultFs, here: Path) -> None:
    """unlink(2) and mkdir(2) change a directory: undone by a power loss before its fsync."""
    doomed = _durable_file(here, "doomed", b"still here")
    doomed.unlink()
    (here / "subdir").mkdir()
    fs.lose_power()
    assert sorted(os.listdir(here)) == ["doomed"]
    assert doomed.read_bytes() == b"still here"
    doomed.unlink()
    sync_directory(here)
    fs.lose_power()
    assert os.listdir(here) == []


def test_torn_tail_keeps_only_the_synced_prefix(fs: FaultFs, here: Path) -> None:
    """Appends after the last fsync are lost, whole or in part: a log keeps exactly what
    was synced (write A, fsync, write B, power loss: A)."""
    path = _durable_file(here, "segment", b"")
    record_a, record_b = b"A" * 6000, b"B" * 3000  # B starts inside A's last page
    _write(path, record_a, sync="fsync", flags=os.O_APPEND)
    _write(path, record_b, flags=os.O_APPEND)
    assert path.stat().st_size == 9000
    fs.lose_power()
    assert path.read_bytes() == record_a
    # an unsynced truncate is undone too
    fd = os.open(path, os.O_WRONLY)
    os.ftruncate(fd, 10)
    os.close(fd)
    fs.lose_power()
    assert path.read_bytes() == record_a


def test_power_loss_may_write_back_some_pages_first(fs: FaultFs, here: Path) -> None:
    """Before the cut the kernel may have written back any dirty pages: with a writeback
    fraction, an unsynced multi-page write survives torn at page granularity."""
    path = _durable_file(here, "big", b"o" * (16 * PAGE))
    _write(path, b"n" * (16 * PAGE))
    fs.lose_power(writeback_fraction=0.5, seed=7)
    pages = [path.read_bytes()[i * PAGE : (i + 1) * PAGE] for i in range(16)]
    assert set(pages) == {b"o" * PAGE, b"n" * PAGE}  # some old, some new: torn


def test_fsync_and_read_delays_are_added(fs: FaultFs, here: Path) -> None:
    """A slow disk: every fsync (file and directory) and every read waits the delay."""
    path = _durable_file(here, "slow", b"data")
    fs.delay(fsync_ms=800, read_ms=300)
    fd = os.open(path, os.O_RDWR)
    try:
        started = time.monotonic()
        os.fsync(fd)
        assert time.monotonic() - started >= 0.8
        started = time.monotonic()
        assert os.pread(fd, 4, 0) == b"data"
        assert time.monotonic() - started >= 0.3
        fs.delay(fsync_ms=0, read_ms=0)
        started = time.monotonic()
        os.fsync(fd)
        assert time.monotonic() - started < 0.8  # the delay is gone (a loaded machine is slow)
    finally:
        os.close(fd)


def test_failed_fsync_reports_eio_once_and_loses_its_pages(fs: FaultFs, here: Path) -> None:
    """After a writeback error Linux marks the pages clean: the failing fsync says EIO,
    the next succeeds without writing them, they stay readable until a power loss."""
    path = _durable_file(here, "journal", b"synced;")
    fs.fail_next_fsync()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"unlucky;")
        with pytest.raises(OSError) as failed:
            os.fsync(fd)
        assert failed.value.errno == errno.EIO
        os.fsync(fd)  # the error was reported once
        assert path.read_bytes() == b"synced;unlucky;"
    finally:
        os.close(fd)
    assert fs.status()["counters"]["failed_fsyncs"] >= 1
    fs.lose_power()
    # the later fsync persisted the size, never the failed page's bytes: zeros on disk
    assert path.read_bytes() == b"synced;" + bytes(len(b"unlucky;"))


def test_failed_directory_fsync_reports_eio_and_persists_nothing(fs: FaultFs, here: Path) -> None:
    """A directory fsync that fails (EIO) made none of its entries durable; the next one
    succeeds and does. A failure armed for a subtree spares fsyncs outside it."""
    _write(here / "new", b"data", sync="fsync")
    fs.fail_next_fsync(under=f"/{here.name}")
    sync_directory(fs.mountpoint)  # not under it: not failed
    with pytest.raises(OSError) as failed:
        sync_directory(here)
    assert failed.value.errno == errno.EIO
    fs.lose_power()
    assert os.listdir(here) == []
    _write(here / "new", b"data", sync="fsync")
    sync_directory(here)
    fs.lose_power()
    assert os.listdir(here) == ["new"]


def test_disk_full_refuses_writes_until_space_returns(fs: FaultFs, here: Path) -> None:
    """ENOSPC: a full disk refuses write(2), creat(2) and mkdir(2); reads and fsync of
    what was accepted go on; once space returns writes succeed again."""
    path = _durable_file(here, "data", b"before")
    fs.disk_full(True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(OSError) as refused:
            os.write(fd, b"x")
        assert refused.value.errno == errno.ENOSPC
        for make in (lambda: _write(here / "new", b""), lambda: (here / "newdir").mkdir()):
            with pytest.raises(OSError) as refused:
                make()
            assert refused.value.errno == errno.ENOSPC
        assert os.statvfs(here).f_bavail == 0
        os.fsync(fd)
        assert path.read_bytes() == b"before"
        fs.disk_full(False)
        os.write(fd, b"+after")
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"before+after"


def test_unmount_leaves_the_durable_tree_in_the_backing_directory(tmp_path: Path) -> None:
    """A mount starts from the backing directory's files; after a power loss and unmount
    the backing directory holds exactly what was durable, as a plain tree."""
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    (backing / "sub").mkdir(parents=True)
    (backing / "sub" / "old").write_bytes(b"from before")
    mnt.mkdir()
    with FaultFs.mount(backing, mnt) as fs:
        assert (mnt / "sub" / "old").read_bytes() == b"from before"
        _durable_file(mnt / "sub", "synced", b"s")
        _write(mnt / "sub" / "old", b"unsynced", flags=os.O_TRUNC)
        _write(mnt / "sub" / "unlinked", b"u", sync="fsync")
        fs.lose_power()
    assert sorted(p.name for p in backing.iterdir()) == ["sub"]
    assert sorted(p.name for p in (backing / "sub").iterdir()) == ["old", "synced"]
    assert (backing / "sub" / "old").read_bytes() == b"from before"
    assert (backing / "sub" / "synced").read_bytes() == b"s"


def test_cli_controls_a_mount(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mqmeta chaos faultfs mount | lose-power | status | unmount`; a mountpoint with no
    fault filesystem is exit 2 with one sentence."""
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    command = [sys.executable, "-m", "mqmeta.cli", "chaos", "faultfs", "mount", str(backing), str(mnt)]
    mounted = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert mounted.returncode == 0, mounted.stderr
    try:
        _write(mnt / "file", b"x")
        sync_directory(mnt)
        _write(mnt / "file", b"y", flags=os.O_APPEND)
        assert cli_main(["chaos", "faultfs", "lose-power", str(mnt)]) == 0
        assert (mnt / "file").read_bytes() == b""
        capsys.readouterr()
        assert cli_main(["chaos", "faultfs", "status", str(mnt)]) == 0
        assert json.loads(capsys.readouterr().out)["counters"]["power_losses"] == 1
    finally:
        unmounted = cli_main(["chaos", "faultfs", "unmount", str(mnt)])
    assert unmounted == 0
    assert not os.path.ismount(mnt)
    assert [p.name for p in backing.iterdir()] == ["file"]
    capsys.readouterr()
    assert cli_main(["chaos", "faultfs", "status", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no fault filesystem is mounted" in error


def test_page_cache_truncate_then_extend_reads_zeros(tmp_path: Path) -> None:
    """ftruncate(2) down then up: the bytes between read as zeros (not the old synced
    ones), before and after the next fsync; the page cache alone, without FUSE."""
    cache = PageCache(tmp_path)
    inode = cache.make("/f", Kind.FILE, 0o644, 0, 0)
    cache.sync_directory(cache.lookup("/"))
    cache.write(inode, 0, b"a" * (3 * PAGE))
    cache.sync_file(inode, data_only=True)
    cache.truncate(inode, 100)
    cache.truncate(inode, 3 * PAGE)
    expected = b"a" * 100 + bytes(3 * PAGE - 100)
    assert cache.read(inode, 0, 3 * PAGE) == expected
    cache.sync_file(inode, data_only=False)
    cache.lose_power()
    assert cache.read(cache.lookup("/f"), 0, 3 * PAGE) == expected
    cache.close(sync=False)
    assert (tmp_path / "f").read_bytes() == expected


def test_page_cache_writes_back_past_its_dirty_bound(tmp_path: Path) -> None:
    """Past `dirty_bytes_max` the file with most dirty pages is written back, as the
    kernel's background writeback would: its data then survives a power loss."""
    cache = PageCache(tmp_path, dirty_bytes_max=4 * PAGE)
    inode = cache.make("/f", Kind.FILE, 0o644, 0, 0)
    cache.sync_directory(cache.lookup("/"))
    cache.write(inode, 0, b"w" * (5 * PAGE))
    assert cache.counters.writebacks == 1 and cache.dirty_bytes() == 0
    cache.lose_power()
    assert cache.read(cache.lookup("/f"), 0, 5 * PAGE) == b"w" * (5 * PAGE)
    cache.close(sync=False)


def test_page_cache_unmount_survives_a_durable_directory_cycle(tmp_path: Path) -> None:
    """Renames across directories fsynced one at a time can leave X inside Y and Y inside
    X durably; writing the tree back must still end (each directory once per path)."""
    cache = PageCache(tmp_path)
    root = cache.lookup("/")
    for name in ("x", "y"):
        cache.make(f"/{name}", Kind.DIRECTORY, 0o755, 0, 0)
    cache.sync_directory(root)
    cache.rename("/x", "/y/x")
    cache.sync_directory(cache.lookup("/y"))
    cache.rename("/y/x", "/x")
    cache.rename("/y", "/x/y")
    cache.sync_directory(cache.lookup("/x"))
    cache.close(sync=False)
    assert (tmp_path / "x" / "y").is_dir() and (tmp_path / "y" / "x").is_dir()


def test_the_cli_never_loads_libfuse() -> None:
    """Only the mount's own process loads libfuse3 (through mfusepy): `mqmeta` and the
    FaultFs handle work on a machine without FUSE."""
    probe = (
        "import sys, mqmeta.cli; mqmeta.cli.build_parser(); "
        "from mqmeta.chaos.faultfs import FaultFs; print('mfusepy' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip() == "False", loaded.stderr
