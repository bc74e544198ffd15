"""The audit's inputs wherever they are: local paths, file:// URLs, or object-store and
distributed-file-system URLs through fsspec (s3a:// and s3:// with s3fs, which the dev
extra installs; gs://, abfs://, hdfs:// ... where their fsspec driver is installed).

A remote INPUT is listed once (one recursive listing) into a tree that `RemotePath`
walks the way the layout scanner walks local directories with pathlib, so the same
rules find the nodes. Files are read whole, on the driver (small files) or on the
executors (segments, logs), through `read_bytes`; credentials and endpoints come from
the environment the way fsspec's drivers read them (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL; on a cluster, pass them to the executors too).
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

from mqmeta.spark.errors import BadInput

LISTED_FILES_MAX = 1_000_000


def is_remote(value: str) -> bool:
    return "://" in value and not value.startswith("file://")


def read_bytes(path: str) -> bytes:
    """A whole file, local or remote (the readers run this on the executors)."""
    if is_remote(path):
        import fsspec

        with fsspec.open(path, "rb") as f:
            return bytes(f.read())
    with open(path, "rb") as f:
        return f.read()


def open_path(path: str) -> Any:
    """`path` as a Path, or a RemotePath for a URL (read_bytes, exists, name, str)."""
    if not is_remote(path):
        return Path(path)
    import fsspec

    fs, key = fsspec.core.url_to_fs(path)
    return RemotePath(_Tree(fs, path.split("://", 1)[0], key), key)


class _Tree:
    """One recursive listing of a remote prefix: directories, their children, file sizes."""

    def __init__(self, fs: Any, protocol: str, root: str, listing: dict[str, Any] | None = None) -> None:
        self.fs, self.protocol, self.root = fs, protocol, root.rstrip("/")
        self.listed = listing is not None
        self.sizes: dict[str, int] = {}
        self.children: dict[str, set[str]] = {}
        for key, info in (listing or {}).items():
            key = key.rstrip("/")
            if info.get("type") == "directory":
                self._add_dir(key)
                continue
            self.sizes[key] = int(info.get("size") or 0)
            self._add_dir(posixpath.dirname(key), key)

    def _add_dir(self, key: str, child: str | None = None) -> None:
        while True:
            known = key in self.children
            self.children.setdefault(key, set())
            if child is not None:
                self.children[key].add(child)
            if known or key == self.root or len(key) <= len(self.root) or "/" not in key:
                return
            key, child = posixpath.dirname(key), key


class RemotePath:
    """The part of pathlib.Path the layout scanner and the epoch-file loader use."""

    def __init__(self, tree: _Tree, key: str) -> None:
        self.tree, self.key = tree, key.rstrip("/")

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.tree, f"{self.key}/{name}")

    def __str__(self) -> str:
        return f"{self.tree.protocol}://{self.key}"

    def __lt__(self, other: RemotePath) -> bool:
        return self.key < other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and (self.tree, self.key) == (other.tree, other.key)

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def parts(self) -> tuple[str, ...]:
        return PurePosixPath(self.key).parts

    def is_dir(self) -> bool:
        return self.key in self.tree.children if self.tree.listed else bool(self.tree.fs.isdir(self.key))

    def is_file(self) -> bool:
        return self.key in self.tree.sizes if self.tree.listed else bool(self.tree.fs.isfile(self.key))

    def exists(self) -> bool:
        return self.is_dir() or self.is_file()

    def iterdir(self) -> list[RemotePath]:
        return [RemotePath(self.tree, key) for key in sorted(self.tree.children.get(self.key, ()))]

    def glob(self, pattern: str) -> list[RemotePath]:
        return [p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)]

    def stat(self) -> SimpleNamespace:
        return SimpleNamespace(st_size=self.tree.sizes[self.key])

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    def resolve(self) -> RemotePath:
        return self

    def read_bytes(self) -> bytes:
        return bytes(self.tree.fs.cat_file(self.key))

    def read_text(self) -> str:
        return self.read_bytes().decode()


def remote_root(value: str) -> RemotePath:
    """An INPUT URL, listed; BadInput (one sentence) when it cannot be or holds nothing."""
    try:
        import fsspec

        fs, key = fsspec.core.url_to_fs(value)
    except (ImportError, ValueError) as exc:
        raise BadInput(
            f"input {value}: no file system for this URL here ({exc}); install its "
            "fsspec driver (s3a:// and s3:// need s3fs) or copy the data dirs locally"
        ) from None
    try:
        listing = fs.find(key, detail=True, withdirs=True, maxdepth=None)
    except Exception as exc:  # the driver's own errors (credentials, network, no bucket)
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise BadInput(f"cannot list {value}: {type(exc).__name__}: {first}") from None
    if not listing:
        raise BadInput(
            f"input {value} does not exist or holds nothing; give a data dir, a chaos output dir or node dirs"
        )
    if len(listing) > LISTED_FILES_MAX:
        raise BadInput(
            f"input {value} holds more than {LISTED_FILES_MAX} objects; give the data dirs themselves"
        )
    return RemotePath(_Tree(fs, value.split("://", 1)[0], key, listing), key)


def walk(root: Any) -> Iterator[tuple[Any, list[str], list[str]]]:
    """os.walk over a RemotePath tree (top-down: pruning `dirnames` in place is honoured)."""
    pending = [root]
    while pending:
        here = pending.pop()
        entries = here.iterdir()
        dirnames = [p.name for p in entries if p.is_dir()]
        filenames = [p.name for p in entries if p.is_file()]
        yield here, dirnames, filenames
        pending += [here / name for name in reversed(dirnames)]
