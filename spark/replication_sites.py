"""X1's inputs on the driver: the two clusters' data dirs and the replicator's rules.

- Each dir is walked by spark.layout's rules; a replica found under the other dir (a
  `local up --clusters 2` keeps cluster b in DIR/cluster-b) belongs to the other dir.
- Each dir must hold broker replicas of exactly one cluster (its brokers' identity.json),
  and the two clusters must differ.
- The rules file is read by mqmeta.formats.replication_rules, the worker's own parser.
  A rule names nameservers, not clusters: when both dirs say which nameservers they ran
  (`layout.json` of the test harness, `cluster.json` of `local up`), X1 applies the rules
  going from the source's nameserver to the target's and ignores the others (a ⇄ b's
  reverse rule); when neither rule goes that way the input is bad (exit 2). When a dir
  does not say, every rule of the file is taken to go from SRC_DIR to TARGET_DIR.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mqmeta.spark.errors import BadInput
from mqmeta.spark.layout import Inventory, discover

from mqmeta.errors import InvalidArgument
from mqmeta.formats.replication_rules import Rule, load_config


@dataclass
class Site:
    """One cluster's data dir: its inventory (replicas of this cluster only)."""

    role: str  # "source" or "target"
    root: str
    cluster: str
    inventory: Inventory
    namesrv: set[str] = field(default_factory=set)  # addresses it ran, when the dir says


@dataclass
class Sites:
    source: Site
    target: Site
    rules: list[Rule]
    settings: dict[str, int]
    notes: list[str]


def _under(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def _only_outside(inventory: Inventory, other: Path, own: Path) -> Inventory:
    """The inventory without what lies under `other` (unless `own` itself is under it).
    Every kind of file is filtered, none dropped: the summary of a `local up --clusters 2`
    dir said cluster a had 0 controllers and 0 tiered segments when only some were kept."""
    if own.is_relative_to(other):
        return inventory
    kept = Inventory()
    for kind in fields(Inventory):
        items = getattr(inventory, kind.name)
        setattr(kept, kind.name, [i for i in items if not _under(_path_of(i), other)])
    return kept


def _path_of(item: Any) -> str:
    return str(item["path"] if isinstance(item, dict) else item.path)


def _namesrv_of(root: Path) -> set[str]:
    """The nameserver addresses a data dir records at its top (empty when it does not)."""
    found: set[str] = set()
    for name in ("layout.json", "cluster.json"):
        try:
            document = json.loads((root / name).read_text())
        except (OSError, ValueError):
            continue
        for item in document.get("namesrv") or [] if isinstance(document, dict) else []:
            address = item.get("grpc") if isinstance(item, dict) else item
            if isinstance(address, str) and address:
                found.add(address)
    return found


def _site(role: str, value: str, other: str) -> Site:
    label = "SRC_DIR" if role == "source" else "TARGET_DIR"
    root, other_root = Path(value).resolve(), Path(other).resolve()
    inventory = _only_outside(discover([value]), other_root, root)
    clusters = sorted({r.broker_set.split("/", 1)[0] for r in inventory.replicas})
    if not clusters:
        raise BadInput(f"{label} {value} holds no broker replica (no store/commitlog found)")
    if len(clusters) > 1:
        raise BadInput(
            f"{label} {value} holds replicas of several clusters ({', '.join(clusters)}); "
            "give one cluster's data dir"
        )
    return Site(role, value, clusters[0], inventory, _namesrv_of(root))


def _rules_for(
    source: Site, target: Site, rules: list[Rule], rules_path: Path, notes: list[str]
) -> list[Rule]:
    if not (source.namesrv and target.namesrv):
        notes.append(
            "the data dirs do not record their nameservers: every rule of the file is taken to "
            f"replicate {source.cluster} -> {target.cluster}"
        )
        return rules
    applied = []
    for rule in rules:
        if set(rule.source_namesrv) & source.namesrv and set(rule.target_namesrv) & target.namesrv:
            applied.append(rule)
        else:
            notes.append(f"rule {rule.name} does not replicate {source.cluster} -> {target.cluster}: ignored")
    if not applied:
        raise BadInput(
            f"no rule of {rules_path} replicates from SRC_DIR's cluster {source.cluster} "
            f"(nameserver {','.join(sorted(source.namesrv))}) to TARGET_DIR's cluster {target.cluster} "
            f"(nameserver {','.join(sorted(target.namesrv))}); are the dirs in the right order?"
        )
    return applied


def load_sites(source_dir: str, target_dir: str, rules_path: Path) -> Sites:
    """Both sites and the rules that apply; BadInput (one sentence) when they do not fit."""
    try:
        config = load_config(Path(rules_path))
    except InvalidArgument as exc:
        raise BadInput(f"rules file {rules_path}: {exc.message}") from None
    source = _site("source", source_dir, target_dir)
    target = _site("target", target_dir, source_dir)
    if source.cluster == target.cluster:
        raise BadInput(f"SRC_DIR and TARGET_DIR are both cluster {source.cluster}; give two clusters' dirs")
    notes: list[str] = []
    rules = _rules_for(source, target, list(config.rules), rules_path, notes)
    return Sites(source, target, rules, dict(config.settings), notes)


def chosen_specs(
    inventory: Inventory, masters: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The segment files of one replica per broker set: the one whose confirm.log says it
    was master last (`masters`), else the one whose log reaches furthest. Below the confirm
    offset every replica holds the same records (B1); above it the last master's log is
    what the brokers serve."""
    ends: dict[tuple[str, str], int] = {}
    for spec in inventory.segments:
        key = (spec["broker_set"], spec["replica"])
        ends[key] = max(ends.get(key, 0), int(spec["base_offset"]) + int(spec["size"]))
    chosen: dict[str, str] = {}
    for replica in sorted(inventory.replicas, key=lambda r: (r.broker_set, r.name)):
        if replica.broker_set in masters:
            chosen[replica.broker_set] = masters[replica.broker_set]
            continue
        best = chosen.get(replica.broker_set)
        if best is None or ends.get((replica.broker_set, replica.name), 0) > ends.get(
            (replica.broker_set, best), 0
        ):
            chosen[replica.broker_set] = replica.name
    specs = [s for s in inventory.segments if chosen.get(s["broker_set"]) == s["replica"]]
    return specs, chosen
