"""Finding what to audit in the INPUTs, by the directory layout alone.

Any directory holding `applied.jsonl` is a controller node (named by its directory);
any holding `store/commitlog` is a broker replica (named by its directory; cluster and
broker name from its `identity.json` when present); any holding
`{cluster}/{broker}/commitlog/*.seg` is a tiered store. Absolute paths recorded inside
the files are never used, so a data dir copied or moved elsewhere audits the same.
Labels of files are relative to the INPUT they were found in.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqmeta.spark.errors import BadInput
from mqmeta.spark.fs import RemotePath, is_remote, remote_root
from mqmeta.spark.fs import walk as remote_walk

SCAN_DEPTH_MAX = 8
SCAN_DIRS_MAX = 100_000
_SEGMENT = re.compile(r"(\d{20})\.log")
_TIERED_SEGMENT = re.compile(r"(\d{20})-(\d{20})\.seg")


@dataclass
class Replica:
    name: str
    broker_set: str  # "{cluster}/{broker_name}"
    path: str  # the replica's data dir
    label: str  # the same, relative to its INPUT


@dataclass
class Inventory:
    controllers: list[dict[str, Any]] = field(default_factory=list)  # {"node", "path", "file"}
    replicas: list[Replica] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)  # record-source file specs
    tiered_segments: list[dict[str, Any]] = field(default_factory=list)
    tiered_lineages: list[dict[str, Any]] = field(default_factory=list)  # {"broker_set","path","file"}
    confirm_logs: list[dict[str, Any]] = field(default_factory=list)
    histories: list[dict[str, Any]] = field(default_factory=list)  # chaos history.tsv: {"path", "file"}

    @property
    def empty(self) -> bool:
        return not (self.controllers or self.replicas or self.tiered_segments)

    def summary(self) -> str:
        return (
            f"{len(self.controllers)} controller nodes, {len(self.replicas)} broker replicas "
            f"({len(self.segments)} segments), {len(self.tiered_segments)} tiered segments, "
            f"{len(self.confirm_logs)} confirm logs, {len(self.histories)} chaos histories"
        )


def _local_root(value: str) -> Path:
    path = Path(value[len("file://") :] if value.startswith("file://") else value)
    if not path.exists():
        raise BadInput(f"input {value} does not exist; give a data dir, a chaos output dir or node dirs")
    if not path.is_dir():
        raise BadInput(f"input {value} is not a directory; give a data dir, a chaos output dir or node dirs")
    if not os.access(path, os.R_OK | os.X_OK):
        raise BadInput(f"input {value} is not readable by this user")
    return path


def _relative(path: Any, root: Any) -> str:  # Path or RemotePath
    rel = path.relative_to(root).as_posix() if path != root else ""
    return f"{root.name}/{rel}" if rel else root.name


def discover(inputs: list[str]) -> Inventory:
    """Every node found under the INPUTs (local paths, file:// URLs, or fsspec URLs such
    as s3a://bucket/dir, listed through spark.fs)."""
    inventory = Inventory()
    for value in inputs:
        if is_remote(value):
            _scan(remote_root(value), inventory)
            continue
        root = _local_root(value).resolve()
        try:
            _scan(root, inventory)
        except OSError as exc:  # e.g. a commitlog dir this user may not list
            raise BadInput(f"cannot read {exc.filename or value}: {exc.strerror}") from None
    return inventory


def _raise(error: OSError) -> None:
    """os.walk's default skips a directory it cannot list; the audit says so instead."""
    raise error


def _scan(root: Any, inventory: Inventory) -> None:
    """`root` a local Path, or a RemotePath (the same rules over its listing)."""
    tree = remote_walk(root) if isinstance(root, RemotePath) else os.walk(root, onerror=_raise)
    for seen, (dirpath, dirnames, filenames) in enumerate(tree, start=1):
        if seen > SCAN_DIRS_MAX:  # an audit that silently skipped directories could pass
            raise BadInput(
                f"input {root} holds more than {SCAN_DIRS_MAX} directories; give the data dirs themselves"
            )
        here = dirpath if isinstance(dirpath, RemotePath) else Path(dirpath)
        if len(here.relative_to(root).parts) > SCAN_DEPTH_MAX:
            dirnames[:] = []
            continue
        if "applied.jsonl" in filenames:
            inventory.controllers.append(
                {
                    "node": here.name,
                    "path": str(here / "applied.jsonl"),
                    "file": _relative(here / "applied.jsonl", root),
                }
            )
        if "history.tsv" in filenames:
            inventory.histories.append(
                {"path": str(here / "history.tsv"), "file": _relative(here / "history.tsv", root)}
            )
        if (here / "store" / "commitlog").is_dir():
            _add_replica(here, root, inventory)
            dirnames[:] = []
            continue
        if _add_tiered(here, root, dirnames, inventory):
            dirnames[:] = []
        dirnames.sort()


def _identity(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / "identity.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _add_replica(here: Any, root: Any, inventory: Inventory) -> None:
    identity = _identity(here)
    broker_name = identity.get("broker_name") or re.sub(r"-\d+$", "", here.name)
    cluster = identity.get("cluster") or "DefaultCluster"
    broker_set = f"{cluster}/{broker_name}"
    replica = Replica(here.name, broker_set, str(here), _relative(here, root))
    inventory.replicas.append(replica)
    commitlog = here / "store" / "commitlog"
    files = sorted((int(m[1]), p) for p in commitlog.iterdir() if (m := _SEGMENT.fullmatch(p.name)))
    for i, (base, path) in enumerate(files):
        inventory.segments.append(
            {
                "path": str(path),
                "file": _relative(path, root),
                "broker_set": broker_set,
                "replica": here.name,
                "base_offset": base,
                "size": _size_before_zeros(path) if i == len(files) - 1 else path.stat().st_size,
                "last": i == len(files) - 1,
            }
        )
    confirm = here / "confirm.log"
    if confirm.is_file():
        inventory.confirm_logs.append(
            {
                "node": here.name,
                "replica": here.name,
                "broker_set": broker_set,
                "path": str(confirm),
                "file": _relative(confirm, root),
            }
        )


ZERO_TAIL_READ_BYTES = 64 << 10


def _size_before_zeros(path: Any) -> int:
    """A broker's last segment file ends in the zeros it writes ahead of its records: the
    size up to its last nonzero byte (a bound the last record may pass by its trailing zero
    bytes; the readers scan to the file's end anyway). A remote file keeps its size."""
    size = path.stat().st_size
    if isinstance(path, RemotePath):
        return size
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - ZERO_TAIL_READ_BYTES)
            f.seek(start)
            chunk = f.read(end - start)
            kept = len(chunk.rstrip(b"\0"))
            if kept or len(chunk) < end - start:
                return start + kept
            end = start
    return 0


def _add_tiered(here: Any, root: Any, dirnames: list[str], inventory: Inventory) -> bool:
    """`here` is a tiered store root when some {cluster}/{broker}/commitlog holds .seg objects."""
    found = False
    for cluster_dir in (here / name for name in sorted(dirnames)):
        for broker_dir in sorted(p for p in cluster_dir.iterdir() if p.is_dir()):
            commitlog = broker_dir / "commitlog"
            if not commitlog.is_dir():
                continue
            segments = [
                (p, m) for p in sorted(commitlog.iterdir()) if (m := _TIERED_SEGMENT.fullmatch(p.name))
            ]
            if not segments:
                continue
            found = True
            broker_set = f"{cluster_dir.name}/{broker_dir.name}"
            for path, match in segments:
                inventory.tiered_segments.append(
                    {
                        "path": str(path),
                        "file": _relative(path, root),
                        "broker_set": broker_set,
                        "replica": "tiered",
                        "base_offset": int(match[1]),
                        "size": path.stat().st_size,
                        "key": f"{broker_set}/commitlog/{path.name}",
                        "last": False,
                    }
                )
            epochs = broker_dir / "epochs"
            for path in sorted(epochs.glob("*.json")) if epochs.is_dir() else []:
                inventory.tiered_lineages.append(
                    {"broker_set": broker_set, "path": str(path), "file": _relative(path, root)}
                )
    return found
