"""The controller's replicated state and the pure function that changes it.

`apply(state, command, index)` is the only way state changes. It uses no clock, no
I/O and no randomness: everything it needs (the time, which brokers the leader sees
alive) arrives inside the command, so every node that applies the same log reaches
the same state, and a test can drive it without a network.

State is a flat map of keys to JSON values:
  brokerset/{cluster}/{broker_name}, topic/{name}, group/{name}, config,
  tiered/..., replworker/..., repltask/... (controller.replicator_leases)
The state digest is the sum (mod 2**256) of sha256(key, canonical value) over all
keys, so it is kept up to date per changed key instead of re-hashing everything.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mqmeta.controller import replicator_leases
from mqmeta.controller.commands import (
    AlterSyncStateSet,
    Applied,
    Barrier,
    CleanBrokerData,
    Command,
    DeleteGroup,
    DeleteTopic,
    ElectMaster,
    PutGroup,
    PutTopic,
    RegisterBroker,
    ReplicatorCommit,
    ReplicatorExpire,
    ReplicatorHeartbeat,
    TieredCommit,
    TieredForgetAbandoned,
    TieredUploadStart,
    Undecodable,
    UpdateConfig,
    command_json,
    unchanged,
)
from mqmeta.controller.state_chunks import EncodedChunk

from mqmeta.errors import MqmetaError, error_from_code
from mqmeta.formats.checksummed import canonical_json
from mqmeta.timing import (
    BROKER_DEAD_AFTER_MS_DEFAULT,
    BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT,
    LEASE_MARGIN_MS_DEFAULT,
    LEASE_MS_DEFAULT,
)
from mqmeta.validate import (
    QUEUE_COUNT_MAX,
    REQUEST_INT_MAX,
    validate_address,
    validate_choice,
    validate_int,
    validate_name,
)

Json = dict[str, Any]

DIGEST_MODULUS = 2**256
PERMS = ("RW", "R", "W")
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
CONSUME_FROM = ("LAST_OFFSET", "FIRST_OFFSET", "TIMESTAMP")
RETRY_POLICIES = ("EXPONENTIAL", "FIXED")
RETRY_MAX_TIMES_MAX = 64

# name -> (type, default, minimum, maximum); bool entries ignore min/max.
CONFIG_SCHEMA: dict[str, tuple[type, Any, int, int]] = {
    "enable_unclean_master_election": (bool, False, 0, 0),
    # Defaults chosen for failover within 1.5 s (kill) / 3 s (stop) on a loaded 2-core machine;
    # the reasoning is in broker_agent/ha.py (the lease) and docs/operate.md, "Fast failover with
    # the default settings" (the measurements: docs/benchmarks.md).
    "broker_heartbeat_interval_ms": (int, BROKER_HEARTBEAT_INTERVAL_MS_DEFAULT, 50, 60_000),
    "broker_dead_after_ms": (int, BROKER_DEAD_AFTER_MS_DEFAULT, 200, 600_000),
    "lease_ms": (int, LEASE_MS_DEFAULT, 100, 600_000),
    "lease_margin_ms": (int, LEASE_MARGIN_MS_DEFAULT, 0, 600_000),
    "default_cluster": (str, "DefaultCluster", 0, 0),
    "default_queue_count": (int, 8, 1, QUEUE_COUNT_MAX),
}


def _entry_hash(key: str, value: Json) -> int:
    data = key.encode() + b"\0" + canonical_json(value).encode()
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def json_copy(value: Any) -> Any:
    """A copy of a JSON value, every dict and list of it copied (what copy.deepcopy gives
    for JSON, at a ninth of its cost: deepcopy's memo and dispatch are for shared and
    cyclic objects, which JSON values never hold). Handlers copy what they change with it."""
    kind = type(value)
    if kind is dict:
        return {key: json_copy(item) for key, item in value.items()}
    if kind is list:
        return [json_copy(item) for item in value]
    return value


def command_digest(command: Command) -> str:
    return hashlib.sha256(canonical_json(command_json(command)).encode()).hexdigest()


@dataclass(frozen=True)
class FrozenState:
    """A ControllerState's data at one Raft index (see ControllerState.freeze)."""

    values: dict[str, Json]
    hashes: dict[str, int]
    encoded: dict[str, EncodedChunk]  # keys whose value is still encoded (a snapshot's chunk)
    digest_sum: int

    @property
    def digest(self) -> str:
        return format(self.digest_sum, "064x")

    @property
    def key_count(self) -> int:
        return len(self.values) + len(self.encoded)

    def items(self) -> Iterator[tuple[str, Json, int]]:
        """(key, value, hash) of every key: the decoded ones in the live state's insertion
        order (not sorted: one sort of 100,000 keys would hold the GIL for tens of
        milliseconds), then the encoded ones a chunk at a time (decoded for the caller,
        not kept)."""
        hashes = self.hashes
        for key, value in self.values.items():
            yield key, value, hashes[key]
        encoded = self.encoded
        chunks = {id(chunk): chunk for chunk in encoded.values()}
        for chunk in chunks.values():
            for key, value, entry_hash in chunk.items():
                if encoded.get(key) is chunk:  # not replaced or deleted before the freeze
                    yield key, value, entry_hash


class ControllerState:
    """The replicated data plus its running digest. Picklable for snapshots.

    A key's value is either decoded (`_values`, with its hash in `_hashes`) or, in a
    state loaded from a snapshot, still encoded in the snapshot's chunk (`_encoded`:
    key -> chunk, decoded on first read: controller/state_chunks.py); never both. A
    change always lands decoded."""

    def __init__(self) -> None:
        self._values: dict[str, Json] = {}
        self._hashes: dict[str, int] = {}
        self._encoded: dict[str, EncodedChunk] = {}
        self._digest_sum = 0
        # keys by their first segment (brokerset, topic, ...): scans of one kind must not
        # walk every topic (the liveness scan lists broker sets ten times a second)
        self._keys_by_kind: dict[str, set[str]] = {}

    @property
    def digest(self) -> str:
        return format(self._digest_sum, "064x")

    @property
    def key_count(self) -> int:
        return len(self._values) + len(self._encoded)

    @property
    def entries(self) -> dict[str, Json]:
        """Every key and its value, decoded, as a new dict (tests and tools; the service
        reads single keys with `get` and kinds with `with_prefix`)."""
        return {key: value for key, value, _ in self.freeze().items()}

    def get(self, key: str) -> Json | None:
        value = self._values.get(key)
        if value is None:
            chunk = self._encoded.get(key)
            if chunk is not None:
                return chunk.value_of(key)
            # commit() stores a key's new value before it drops the key's chunk, and a key
            # never goes back into a chunk: one found in neither dict, looked up one after
            # the other, moved in between (no shortcut on an empty _encoded: the last key
            # leaving it may be this one)
            value = self._values.get(key)
        return value

    def _hash_of(self, key: str) -> int:
        """The hash of `key`'s current value (0: no such key)."""
        found = self._hashes.get(key)
        if found is not None:
            return found
        chunk = self._encoded.get(key)
        return 0 if chunk is None else chunk.hash_of(key)

    def commit(self, changes: dict[str, Json | None]) -> None:
        """Applies `changes` (None deletes). Called on the Raft thread while the service's
        threads read this same object (a read confirmed at index i reads the live state,
        at i or later), so every key moves from its old value to its new one in one dict
        store: a reader never finds a key that exists missing (deleting it and adding it
        back after hashing the new value left a gap, which sha256, releasing the GIL on a
        large value, held open long enough for reads to fall into). A key still encoded
        is dropped from its chunk only after its new value is in place."""
        for key, value in changes.items():
            kind_keys = self._keys_by_kind.setdefault(key.split("/", 1)[0], set())
            old_hash = self._hash_of(key)
            new_hash = 0
            if value is not None:
                new_hash = _entry_hash(key, value)  # before the swap, not inside a gap
                self._values[key] = value  # old value, then new: never neither
                self._hashes[key] = new_hash
                self._encoded.pop(key, None)
                kind_keys.add(key)
            elif key in self._hashes or key in self._encoded:
                kind_keys.discard(key)  # before the value: a listing never names a gone key
                self._hashes.pop(key, None)
                self._encoded.pop(key, None)
                self._values.pop(key, None)
            self._digest_sum = (self._digest_sum - old_hash + new_hash) % DIGEST_MODULUS

    def recompute_digest(self) -> str:
        """Full re-hash; the audit and tests compare it with the running digest."""
        total = sum(_entry_hash(k, v) for k, v, _ in self.freeze().items()) % DIGEST_MODULUS
        return format(total, "064x")

    def freeze(self) -> FrozenState:
        """This state as it is now, for a snapshot written beside the Raft thread.

        Shallow copies (milliseconds at 100,000 keys), not a deep one: `apply` never
        changes a stored value in place (handlers copy what they change and `commit`
        swaps in the new value), so the values shared with the live state stay as they
        are here; an encoded chunk never changes once made."""
        return FrozenState(dict(self._values), dict(self._hashes), dict(self._encoded), self._digest_sum)

    @classmethod
    def from_items(cls, items: Iterable[tuple[str, Json, int]]) -> ControllerState:
        """A state rebuilt from (key, value, hash) triples (a snapshot's chunks): the hashes
        are taken as stored (the file's checksum guards them; the caller compares the sum
        with the digest the snapshot recorded)."""
        return cls.from_chunks([list(items)])

    @classmethod
    def from_chunks(cls, chunks: Iterable[list[tuple[str, Json, int]]]) -> ControllerState:
        """from_items, a chunk at a time: dict.update and sum over each chunk's columns cost
        about 60 % of a loop over the triples (0.13 s of CPU against 0.20 s at 120,000 keys)."""
        state = cls()
        entries, hashes, by_kind = state._values, state._hashes, state._keys_by_kind
        total = 0
        for chunk in chunks:
            if not chunk:
                continue
            keys, values, chunk_hashes = zip(*chunk, strict=True)
            entries.update(zip(keys, values, strict=True))
            hashes.update(zip(keys, chunk_hashes, strict=True))
            total += sum(chunk_hashes)
            for key in keys:
                kind = key.partition("/")[0]
                kind_keys = by_kind.get(kind)
                if kind_keys is None:
                    kind_keys = by_kind[kind] = set()
                kind_keys.add(key)
        state._digest_sum = total % DIGEST_MODULUS
        return state

    @classmethod
    def from_encoded(cls, chunks: Iterable[tuple[str, EncodedChunk]]) -> ControllerState:
        """A state whose values stay encoded until read: (kind, chunk) pairs, every key of
        a chunk of that kind (a snapshot of format 2). Only the key maps are built here."""
        state = cls()
        encoded, by_kind = state._encoded, state._keys_by_kind
        total = 0
        for kind, chunk in chunks:
            encoded.update(dict.fromkeys(chunk.keys, chunk))
            kind_keys = by_kind.get(kind)
            if kind_keys is None:
                kind_keys = by_kind[kind] = set()
            kind_keys.update(chunk.keys)
            total += chunk.hash_sum
        state._digest_sum = total % DIGEST_MODULUS
        return state

    def with_prefix(self, prefix: str) -> Iterable[tuple[str, Json]]:
        """Every (key, value) under `prefix`, sorted. Safe beside commit() on the Raft
        thread: the key set is copied in one step (iterating the live set could fail when a
        key is added meanwhile), and a key deleted since is skipped."""
        keys = list(self._keys_by_kind.get(prefix.split("/", 1)[0], ()))
        found = ((k, self.get(k)) for k in sorted(k for k in keys if k.startswith(prefix)))
        return ((k, v) for k, v in found if v is not None)

    # Reads used by the service ------------------------------------------------
    def config(self) -> Json:
        stored = self.get("config") or {}
        return {name: stored.get(name, spec[1]) for name, spec in CONFIG_SCHEMA.items()}

    def config_value(self, name: str) -> Any:
        """One configuration value, without building the whole map (every heartbeat and
        every liveness scan of every broker set reads one)."""
        return (self.get("config") or {}).get(name, CONFIG_SCHEMA[name][1])

    def broker_set(self, cluster: str, broker_name: str) -> Json | None:
        return self.get(broker_set_key(cluster, broker_name))

    def broker_sets(self, cluster: str = "") -> list[Json]:
        prefix = f"brokerset/{cluster}/" if cluster else "brokerset/"
        return [v for _, v in self.with_prefix(prefix) if v["replicas"]]

    def topics(self) -> list[Json]:
        return [v for _, v in self.with_prefix("topic/")]

    def groups(self) -> list[Json]:
        return [v for _, v in self.with_prefix("group/")]


def broker_set_key(cluster: str, broker_name: str) -> str:
    return f"brokerset/{cluster}/{broker_name}"


def parse_config_value(name: str, raw: Any) -> Any:
    spec = CONFIG_SCHEMA.get(name)
    if spec is None:
        known = ", ".join(sorted(CONFIG_SCHEMA))
        raise error_from_code("INVALID_ARGUMENT", f"unknown configuration key {name!r}; known: {known}")
    kind, _, minimum, maximum = spec
    text = str(raw).strip().lower() if not isinstance(raw, (bool, int)) else raw
    if kind is bool:
        if text in (True, "true", "1", "yes"):
            return True
        if text in (False, "false", "0", "no"):
            return False
        raise error_from_code("INVALID_ARGUMENT", f"{name} must be true or false, not {raw!r}")
    if kind is int:
        if isinstance(raw, bool):
            raise error_from_code("INVALID_ARGUMENT", f"{name} must be a whole number, not {raw!r}")
        try:
            number = int(text)
        except (TypeError, ValueError):
            raise error_from_code("INVALID_ARGUMENT", f"{name} must be a whole number, not {raw!r}") from None
        return validate_int(name, number, minimum, maximum)
    return validate_name(name, str(raw))


def validate_config_relations(config: Json) -> None:
    if config["broker_dead_after_ms"] < 3 * config["broker_heartbeat_interval_ms"]:
        raise error_from_code(
            "INVALID_ARGUMENT",
            "broker_dead_after_ms must be at least 3 x broker_heartbeat_interval_ms, "
            "or one lost heartbeat would declare a broker dead",
        )
    if config["lease_ms"] + config["lease_margin_ms"] >= config["broker_dead_after_ms"]:
        raise error_from_code(
            "INVALID_ARGUMENT",
            "lease_ms + lease_margin_ms must be below broker_dead_after_ms, so that an "
            "isolated master's lease expires before a replacement can be elected",
        )


# Command handlers ---------------------------------------------------------------
# Each takes (state, command, index) and returns an Applied (result, events, changes),
# the order `apply` returns too. They must not mutate state: they copy what they change
# and return it in `changes`.

Handler = Callable[[ControllerState, Any, int], Applied]


def _require_broker_set(state: ControllerState, command: Any) -> Json:
    """The broker set a command names (its `cluster` and `broker_name`), as a copy."""
    cluster = validate_name("cluster", command.cluster)
    broker_name = validate_name("broker name", command.broker_name)
    bs = state.broker_set(cluster, broker_name)
    if bs is None or not bs["replicas"]:
        raise error_from_code(
            "BROKER_SET_NOT_FOUND",
            f"broker set {cluster}/{broker_name} is not registered; check the cluster and broker name",
        )
    return json_copy(bs)


def replica_view(bs: Json) -> Json:
    """The replica info a broker or admin sees for a broker set."""
    master = bs["master_broker_id"]
    master_replica = bs["replicas"].get(str(master)) if master else None
    return {
        "cluster": bs["cluster"],
        "broker_name": bs["broker_name"],
        "master_broker_id": master,
        "master_address": master_replica["address"] if master_replica else "",
        "master_epoch": bs["master_epoch"],
        "sync_state_set": list(bs["sync_state_set"]),
        "sync_state_set_epoch": bs["sync_state_set_epoch"],
        "replicas": {k: dict(v) for k, v in bs["replicas"].items()},
    }


def _broker_set_event(kind: str, bs: Json) -> Json:
    return {
        "kind": kind,
        "cluster": bs["cluster"],
        "broker_name": bs["broker_name"],
        "replica_info": replica_view(bs),
    }


def _alive_ids(command: ElectMaster | AlterSyncStateSet | CleanBrokerData) -> dict[int, Json]:
    return {int(k): v for k, v in (command.alive or {}).items()}


def _barrier(state: ControllerState, command: Barrier, index: int) -> Applied:
    return unchanged({"ok": True})


def _register_broker(state: ControllerState, command: RegisterBroker, index: int) -> Applied:
    cluster = validate_name("cluster", command.cluster)
    broker_name = validate_name("broker name", command.broker_name)
    address = validate_address(command.address)
    check_code = command.check_code
    if not isinstance(check_code, str) or not 1 <= len(check_code) <= 128:
        raise error_from_code(
            "INVALID_ARGUMENT", "check_code must be 1-128 characters identifying the broker"
        )
    priority = validate_int("election_priority", command.election_priority, 0, 1_000_000)
    requested = validate_int("broker_id", command.broker_id, 0, REQUEST_INT_MAX)
    if command.new_process is not None and not isinstance(command.new_process, bool):
        raise error_from_code(
            "INVALID_ARGUMENT", f"new_process must be true or false, not {command.new_process!r}"
        )
    key = broker_set_key(cluster, broker_name)
    bs = json_copy(state.get(key)) or {
        "cluster": cluster,
        "broker_name": broker_name,
        "next_broker_id": 1,
        "replicas": {},
        "master_broker_id": 0,
        "master_epoch": 0,
        "sync_state_set": [],
        "sync_state_set_epoch": 0,
    }
    replicas = bs["replicas"]
    if requested == 0:
        same = [int(i) for i, r in replicas.items() if r["check_code"] == check_code]
        broker_id = same[0] if same else bs["next_broker_id"]
    else:
        broker_id = requested
        held = replicas.get(str(broker_id))
        if held is not None and held["check_code"] != check_code:
            raise error_from_code(
                "BROKER_ID_INVALID",
                f"broker id {broker_id} of {cluster}/{broker_name} belongs to another broker "
                "(check code differs); register with broker id 0 to get a new one",
            )
    before = replicas.get(str(broker_id))
    replicas[str(broker_id)] = {"address": address, "check_code": check_code, "election_priority": priority}
    bs["next_broker_id"] = max(bs["next_broker_id"], broker_id + 1)
    events = []
    if command.new_process and bs["master_broker_id"] == broker_id and bs["master_epoch"] > 0:
        # The master's process restarted before another was elected: it stays master, in a
        # new epoch. A power loss may have taken bytes its earlier process served to slaves;
        # in the old epoch it would write other bytes at those offsets, a divergence no epoch
        # comparison finds once a later epoch has begun (a slave away all that time).
        bs["master_epoch"] += 1
        events.append(_broker_set_event("role", bs))
    elif before != replicas[str(broker_id)]:
        events.append(_broker_set_event("broker", bs))
    result = {"ok": True, "broker_id": broker_id, "replica_info": replica_view(bs)}
    return Applied(result, events, {key: bs})


def _first_election(bs: Json) -> bool:
    """No replica can hold acknowledged data yet: never elected, or every replica cleaned.

    An empty SyncStateSet alone is not enough: cleaning its members leaves out-of-sync
    replicas whose election would lose acknowledged messages.
    """
    return bs["master_epoch"] == 0 or bool(bs.get("all_replicas_cleaned"))


def _election_candidates(bs: Json, command: ElectMaster, unclean: bool) -> list[int]:
    alive = _alive_ids(command)
    registered = {int(i) for i in bs["replicas"]}
    in_set = [i for i in bs["sync_state_set"] if i in alive and i in registered]
    if _first_election(bs) or (not in_set and unclean):
        return sorted(i for i in registered if i in alive)
    return in_set


def _election_order(bs: Json, command: ElectMaster, pool: list[int]) -> list[int]:
    alive = _alive_ids(command)

    def rank(broker_id: int) -> tuple[int, int, int, int]:
        info = alive.get(broker_id, {})
        priority = info.get("priority", bs["replicas"][str(broker_id)]["election_priority"])
        return (-int(info.get("epoch", -1)), -int(info.get("max_offset", -1)), int(priority), broker_id)

    return sorted(pool, key=rank)


def _elect_master(state: ControllerState, command: ElectMaster, index: int) -> Applied:
    bs = _require_broker_set(state, command)
    key = broker_set_key(bs["cluster"], bs["broker_name"])
    unclean = bool(state.config()["enable_unclean_master_election"])
    alive = _alive_ids(command)
    current = bs["master_broker_id"]
    preferred = validate_int("preferred_broker_id", command.preferred_broker_id, 0, REQUEST_INT_MAX)
    if command.trigger == "handoff":
        new_master = _handoff_successor(bs, command, preferred, alive)
    elif preferred:
        _check_preferred(bs, preferred, alive, unclean)
        if preferred == current:
            return unchanged({"ok": True, "changed": False, "replica_info": replica_view(bs)})
        new_master = preferred
    elif current and current in alive:
        return unchanged({"ok": True, "changed": False, "replica_info": replica_view(bs)})
    else:
        pool = _election_candidates(bs, command, unclean)
        requester = command.requester_broker_id
        if _first_election(bs) and command.trigger == "broker" and requester in pool:
            new_master = requester  # first election: the requester wins
        elif pool:
            new_master = _election_order(bs, command, pool)[0]
        else:
            return _no_master(bs, key, current)
    bs["master_broker_id"] = new_master
    bs["master_epoch"] += 1
    bs.pop("all_replicas_cleaned", None)
    bs["sync_state_set"] = [new_master]
    bs["sync_state_set_epoch"] += 1
    result = {"ok": True, "changed": True, "replica_info": replica_view(bs)}
    return Applied(result, [_broker_set_event("role", bs)], {key: bs})


def _handoff_successor(bs: Json, command: ElectMaster, preferred: int, alive: dict[int, Json]) -> int:
    """The master itself hands off (it has stopped taking writes and its successor holds
    everything it appended): the alive master is replaced, by an alive SyncStateSet member
    only (never an unclean election), the preferred one when given."""
    name = f"{bs['cluster']}/{bs['broker_name']}"
    requester = validate_int("requester_broker_id", command.requester_broker_id, 0, REQUEST_INT_MAX)
    epoch = validate_int("master_epoch", command.master_epoch, 0, REQUEST_INT_MAX)
    if not requester or requester != bs["master_broker_id"] or epoch != bs["master_epoch"]:
        raise error_from_code(
            "FENCED_MASTER_EPOCH",
            f"broker {requester} at master epoch {epoch} is not the master of {name} (master "
            f"{bs['master_broker_id']} at epoch {bs['master_epoch']}); only the master hands off",
        )
    pool = [i for i in bs["sync_state_set"] if i != requester and i in alive and str(i) in bs["replicas"]]
    if preferred:
        pool = [i for i in pool if i == preferred]
    if not pool:
        which = f"broker {preferred}" if preferred else "slave"
        raise error_from_code(
            "NO_IN_SYNC_SLAVE",
            f"no alive in-sync {which} of {name} can take over from master {requester} "
            f"(SyncStateSet {bs['sync_state_set']}); wait until a slave has caught up",
        )
    return _election_order(bs, command, pool)[0]


def _check_preferred(bs: Json, preferred: int, alive: dict[int, Json], unclean: bool) -> None:
    name = f"{bs['cluster']}/{bs['broker_name']}"
    if str(preferred) not in bs["replicas"]:
        raise error_from_code("INVALID_ARGUMENT", f"broker id {preferred} is not registered in {name}")
    if preferred not in alive:
        raise error_from_code("MASTER_NOT_AVAILABLE", f"broker id {preferred} of {name} is not alive")
    if bs["sync_state_set"] and preferred not in bs["sync_state_set"] and not unclean:
        raise error_from_code(
            "MASTER_NOT_AVAILABLE",
            f"broker id {preferred} is not in the SyncStateSet {bs['sync_state_set']} of {name}; "
            "electing it could lose acknowledged messages (enable_unclean_master_election)",
        )


def _no_master(bs: Json, key: str, current: int) -> Applied:
    """No eligible replica: clear a dead master and bump the epoch to fence it."""
    changes: dict[str, Json | None] = {}
    events = []
    if current:
        bs["master_broker_id"] = 0
        bs["master_epoch"] += 1
        changes[key] = bs
        events.append(_broker_set_event("role", bs))
    result = {
        "ok": False,
        "code": "MASTER_NOT_AVAILABLE",
        "message": f"no alive in-sync replica can become master of {bs['cluster']}/{bs['broker_name']}",
        "replica_info": replica_view(bs),
    }
    return Applied(result, events, changes)


def _alter_sync_state_set(state: ControllerState, command: AlterSyncStateSet, index: int) -> Applied:
    bs = _require_broker_set(state, command)
    key = broker_set_key(bs["cluster"], bs["broker_name"])
    name = f"{bs['cluster']}/{bs['broker_name']}"
    master = command.master_broker_id
    if master != bs["master_broker_id"] or command.master_epoch != bs["master_epoch"]:
        raise error_from_code(
            "FENCED_MASTER_EPOCH",
            f"master {master} at epoch {command.master_epoch} is not the current master "
            f"of {name} (master {bs['master_broker_id']} at epoch {bs['master_epoch']})",
        )
    if command.sync_state_set_epoch != bs["sync_state_set_epoch"]:
        raise error_from_code(
            "FENCED_SYNC_STATE_SET_EPOCH",
            f"SyncStateSet epoch {command.sync_state_set_epoch} is stale for {name} "
            f"(current {bs['sync_state_set_epoch']}); re-read the replica info and retry",
        )
    new_set = sorted({int(i) for i in command.new_sync_state_set or []})
    if master not in new_set:
        raise error_from_code("INVALID_ARGUMENT", f"the master {master} must stay in the SyncStateSet")
    alive = _alive_ids(command)
    for member in new_set:
        if str(member) not in bs["replicas"]:
            raise error_from_code("INVALID_ARGUMENT", f"broker id {member} is not registered in {name}")
        if member not in alive:
            raise error_from_code("MASTER_NOT_AVAILABLE", f"broker id {member} of {name} is not alive")
    if new_set == sorted(bs["sync_state_set"]):
        return unchanged({"ok": True, "changed": False, "replica_info": replica_view(bs)})
    bs["sync_state_set"] = new_set
    bs["sync_state_set_epoch"] += 1
    result = {"ok": True, "changed": True, "replica_info": replica_view(bs)}
    return Applied(result, [_broker_set_event("sync_state_set", bs)], {key: bs})


def _clean_broker_data(state: ControllerState, command: CleanBrokerData, index: int) -> Applied:
    bs = _require_broker_set(state, command)
    key = broker_set_key(bs["cluster"], bs["broker_name"])
    registered = sorted(int(i) for i in bs["replicas"])
    targets = sorted({int(i) for i in command.broker_ids or []}) or registered
    unknown = [t for t in targets if t not in registered]
    if unknown:
        raise error_from_code(
            "INVALID_ARGUMENT",
            f"broker ids {unknown} are not registered in {bs['cluster']}/{bs['broker_name']}",
        )
    alive = [t for t in targets if t in _alive_ids(command)]
    if alive and not command.force:
        raise error_from_code(
            "BROKER_ALIVE",
            f"broker ids {alive} are alive; stop them first or pass force to clean them anyway",
        )
    for target in targets:
        del bs["replicas"][str(target)]
    new_set = [i for i in bs["sync_state_set"] if i not in targets]
    if new_set != bs["sync_state_set"]:
        bs["sync_state_set"] = new_set
        bs["sync_state_set_epoch"] += 1
    if bs["master_broker_id"] in targets:
        bs["master_broker_id"] = 0
        bs["master_epoch"] += 1  # a cleaned master that comes back is fenced
    if not bs["replicas"]:
        bs["all_replicas_cleaned"] = True  # fresh replicas may then elect from scratch
    # The record stays (with no replicas) so epochs never move backwards.
    result = {"ok": True, "cleaned_broker_ids": targets, "broker_set_removed": not bs["replicas"]}
    return Applied(result, [_broker_set_event("role", bs)], {key: bs})


def _topic_spec(state: ControllerState, command: PutTopic) -> Json:
    cluster = validate_name("cluster", command.cluster or state.config_value("default_cluster"))
    queue_count = command.queue_count or state.config_value("default_queue_count")
    broker_names = sorted(set(command.broker_names or []))
    for broker_name in broker_names:
        validate_name("broker name", broker_name)
        bs = state.broker_set(cluster, broker_name)
        if bs is None or not bs["replicas"]:
            raise error_from_code(
                "BROKER_SET_NOT_FOUND", f"broker set {cluster}/{broker_name} is not registered"
            )
    return {
        "name": validate_name("topic name", command.name),
        "cluster": cluster,
        "queue_count": validate_int("queue count", queue_count, 1, QUEUE_COUNT_MAX),
        "broker_names": broker_names,
        "perm": validate_choice("perm", command.perm, PERMS, "RW"),
        "message_type": validate_choice("message type", command.message_type, MESSAGE_TYPES, "NORMAL"),
    }


def _put_topic(state: ControllerState, command: PutTopic, index: int) -> Applied:
    existing = state.get(f"topic/{command.name}")
    expected = command.if_queue_count or 0
    if expected and command.mode != "update":
        raise error_from_code("INVALID_ARGUMENT", "if_queue_count is a condition of updates only")
    if expected and existing is not None and existing["queue_count"] != expected:
        raise error_from_code(
            "TOPIC_CHANGED",
            f"topic {existing['name']} has queue_count "
            f"{existing['queue_count']}, not {expected}; read it again",
        )
    if command.mode == "update" and existing is not None:
        # proto3 cannot tell "unset" from empty: an update keeps what it leaves empty.
        fields = ("cluster", "queue_count", "broker_names", "perm", "message_type")
        kept = {f: existing[f] for f in fields if getattr(command, f) in ("", 0, [], None)}
        command = dataclasses.replace(command, **kept)
    topic = _topic_spec(state, command)
    return _put_named(state, "topic", topic, command.mode, index)


def _put_named(state: ControllerState, kind: str, value: Json, mode: str, index: int) -> Applied:
    key = f"{kind}/{value['name']}"
    exists = state.get(key) is not None
    if mode == "create" and exists:
        raise error_from_code(
            f"{kind.upper()}_EXISTS", f"{kind} {value['name']} already exists; use update to change it"
        )
    if mode == "update" and not exists:
        raise error_from_code(f"{kind.upper()}_NOT_FOUND", f"{kind} {value['name']} does not exist")
    if mode not in ("create", "update"):
        raise error_from_code("INVALID_ARGUMENT", f"mode {mode!r} is not create or update")
    value["version"] = index
    event = {"kind": kind, "name": value["name"], "cluster": value.get("cluster", "")}
    return Applied({"ok": True, kind: json_copy(value)}, [event], {key: value})


def _delete_named(kind: str) -> Handler:
    def handler(state: ControllerState, command: DeleteTopic | DeleteGroup, index: int) -> Applied:
        name = validate_name(f"{kind} name", command.name)
        key = f"{kind}/{name}"
        existing = state.get(key)
        if existing is None:
            raise error_from_code(f"{kind.upper()}_NOT_FOUND", f"{kind} {name} does not exist")
        event = {"kind": kind, "name": name, "cluster": existing.get("cluster", "")}
        return Applied({"ok": True, "name": name}, [event], {key: None})

    return handler


def _put_group(state: ControllerState, command: PutGroup, index: int) -> Applied:
    subscriptions = []
    for sub in command.subscriptions or []:
        expression = sub.get("expression") or "*"
        if not isinstance(expression, str) or len(expression) > 1024:
            raise error_from_code("INVALID_ARGUMENT", "a tag expression must be at most 1024 characters")
        subscriptions.append(
            {"topic": validate_name("topic name", sub.get("topic")), "expression": expression}
        )
    consume_from = validate_choice("consume_from", command.consume_from, CONSUME_FROM, "LAST_OFFSET")
    timestamp = command.consume_timestamp_ms
    if consume_from == "TIMESTAMP":
        validate_int("consume_timestamp_ms", timestamp, 1, REQUEST_INT_MAX)
    retry = command.retry_max_times
    group = {
        "name": validate_name("group name", command.name),
        "subscriptions": sorted(subscriptions, key=lambda s: (s["topic"], s["expression"])),
        "consume_from": consume_from,
        "consume_timestamp_ms": timestamp if consume_from == "TIMESTAMP" else 0,
        "retry_max_times": 16
        if retry in (None, 0)
        else validate_int("retry_max_times", retry, 0, RETRY_MAX_TIMES_MAX),
        "retry_policy": validate_choice("retry_policy", command.retry_policy, RETRY_POLICIES, "EXPONENTIAL"),
    }
    return _put_named(state, "group", group, command.mode, index)


def _update_config(state: ControllerState, command: UpdateConfig, index: int) -> Applied:
    values = command.values
    if not isinstance(values, dict) or not values:
        raise error_from_code("INVALID_ARGUMENT", "give at least one KEY=VALUE to change")
    merged = state.config()
    for name, raw in sorted(values.items()):
        merged[name] = parse_config_value(name, raw)
    validate_config_relations(merged)
    return Applied({"ok": True, "config": dict(merged)}, [{"kind": "config"}], {"config": merged})


# Tiered storage checkpoints ------------------------------------------------------------
# One record per broker set: what is durably in the tiered store (uploaded_offset and the
# segment list, contiguous from the first upload), and the upload in flight. Uploads are
# two-phase (start, then commit) and fenced by the master epoch; the checkpoint only
# moves forward (T4), and abandoned uploads are listed for garbage collection.

ABANDONED_UPLOADS_MAX = 256
SEGMENTS_PER_COMMIT_MAX = 1024


def tiered_key(cluster: str, broker_name: str) -> str:
    return f"tiered/{cluster}/{broker_name}"


def _tiered_fenced(
    state: ControllerState, command: TieredUploadStart | TieredCommit | TieredForgetAbandoned
) -> tuple[Json, str, Json]:
    bs = _require_broker_set(state, command)
    master = command.master_broker_id
    epoch = command.master_epoch
    if master != bs["master_broker_id"] or epoch != bs["master_epoch"] or not master:
        raise error_from_code(
            "FENCED_MASTER_EPOCH",
            f"broker {master} at epoch {epoch} is not the master of "
            f"{bs['cluster']}/{bs['broker_name']} (master {bs['master_broker_id']} at epoch "
            f"{bs['master_epoch']}); only the current master uploads",
        )
    key = tiered_key(bs["cluster"], bs["broker_name"])
    checkpoint = json_copy(state.get(key)) or {
        "cluster": bs["cluster"],
        "broker_name": bs["broker_name"],
        "uploaded_offset": 0,
        "checkpoint_epoch": 0,
        "segments": [],
        "epochs": [],
        "inflight": None,
        "abandoned": [],
    }
    return bs, key, checkpoint


def _tiered_upload_start(state: ControllerState, command: TieredUploadStart, index: int) -> Applied:
    bs, key, checkpoint = _tiered_fenced(state, command)
    upload_id = validate_name("upload id", command.upload_id)
    base = validate_int("base_offset", command.base_offset, 0, REQUEST_INT_MAX)
    end = validate_int("end_offset", command.end_offset, 1, REQUEST_INT_MAX)
    if base != checkpoint["uploaded_offset"] or end <= base:
        raise error_from_code(
            "TIERED_RANGE_INVALID",
            f"an upload must start at the checkpoint {checkpoint['uploaded_offset']} "
            f"and end after it, not [{base}, {end})",
        )
    previous = checkpoint["inflight"]
    if previous and previous["upload_id"] != upload_id:
        checkpoint["abandoned"] = (checkpoint["abandoned"] + [previous["upload_id"]])[-ABANDONED_UPLOADS_MAX:]
    checkpoint["inflight"] = {
        "upload_id": upload_id,
        "master_epoch": bs["master_epoch"],
        "base_offset": base,
        "end_offset": end,
    }
    return Applied({"ok": True, "checkpoint": json_copy(checkpoint)}, [], {key: checkpoint})


def _tiered_commit(state: ControllerState, command: TieredCommit, index: int) -> Applied:
    bs, key, checkpoint = _tiered_fenced(state, command)
    inflight = checkpoint["inflight"]
    upload_id = command.upload_id
    if not inflight or inflight["upload_id"] != upload_id or inflight["master_epoch"] != bs["master_epoch"]:
        raise error_from_code(
            "TIERED_UPLOAD_UNKNOWN",
            f"upload {upload_id!r} is not the upload in flight of this master epoch; start it again",
        )
    segments = command.segments or []
    if not 1 <= len(segments) <= SEGMENTS_PER_COMMIT_MAX:
        raise error_from_code("INVALID_ARGUMENT", f"a commit lists 1 to {SEGMENTS_PER_COMMIT_MAX} segments")
    position = inflight["base_offset"]
    for segment in segments:
        if segment.get("base_offset") != position or segment.get("end_offset", 0) <= position:
            raise error_from_code(
                "TIERED_RANGE_INVALID",
                f"segments must cover [{inflight['base_offset']}, "
                f"{inflight['end_offset']}) without gaps or overlaps",
            )
        position = segment["end_offset"]
    if position != inflight["end_offset"]:
        raise error_from_code(
            "TIERED_RANGE_INVALID", f"segments end at {position}, the upload at {inflight['end_offset']}"
        )
    checkpoint["segments"] = checkpoint["segments"] + [dict(s) for s in segments]
    checkpoint["uploaded_offset"] = position
    checkpoint["checkpoint_epoch"] = bs["master_epoch"]
    checkpoint["epochs"] = [list(e) for e in command.epochs or []]
    checkpoint["inflight"] = None
    event = {"kind": "tiered", "cluster": bs["cluster"], "broker_name": bs["broker_name"]}
    return Applied({"ok": True, "checkpoint": json_copy(checkpoint)}, [event], {key: checkpoint})


def _tiered_forget_abandoned(state: ControllerState, command: TieredForgetAbandoned, index: int) -> Applied:
    _bs, key, checkpoint = _tiered_fenced(state, command)
    done = set(command.upload_ids or [])
    checkpoint["abandoned"] = [u for u in checkpoint["abandoned"] if u not in done]
    return Applied({"ok": True, "checkpoint": json_copy(checkpoint)}, [], {key: checkpoint})


def _undecodable(state: ControllerState, command: Undecodable, index: int) -> Applied:
    raise error_from_code("INVALID_ARGUMENT", command.reason)


# One handler per command class (tests/test_commands.py checks that none is missing).
HANDLERS: dict[type, Handler] = {
    TieredUploadStart: _tiered_upload_start,
    TieredCommit: _tiered_commit,
    TieredForgetAbandoned: _tiered_forget_abandoned,
    Barrier: _barrier,
    RegisterBroker: _register_broker,
    ElectMaster: _elect_master,
    AlterSyncStateSet: _alter_sync_state_set,
    CleanBrokerData: _clean_broker_data,
    PutTopic: _put_topic,
    DeleteTopic: _delete_named("topic"),
    PutGroup: _put_group,
    DeleteGroup: _delete_named("group"),
    UpdateConfig: _update_config,
    ReplicatorHeartbeat: replicator_leases.heartbeat_handler,
    ReplicatorExpire: replicator_leases.expire_handler,
    ReplicatorCommit: replicator_leases.commit_handler,
    Undecodable: _undecodable,
}


def stale_view(command: Command, term: int | None) -> Json | None:
    """The refusal of a command decided on a view this entry's leader does not vouch for.

    Commands built from a leader's in-memory liveness view (who is alive, which workers are
    silent) carry `leader_term`, the term in which their proposer was leader when it read
    that view. Raft appends an entry in the term of the leader that appended it, so an
    entry whose term differs was built by a node that was not the leader of that term: a
    former leader stopped (SIGSTOP) for longer than dead-after, resumed, whose scan ran on
    its 15-s-old view before it heard of the new term and whose proposal was forwarded to
    the new leader. Applying it would depose a healthy master. The term of an entry is the
    same on every node, so every node refuses it alike."""
    leader_term = getattr(command, "leader_term", None)
    if term is None or term < 0 or leader_term is None or leader_term == term:
        return None
    return {
        "ok": False,
        "code": "NOT_LEADER",
        "message": f"decided on the view of the leader of term {leader_term}, "
        f"committed in term {term}: refused (ask the current leader)",
    }


def apply(state: ControllerState, command: Command, index: int, term: int | None = None) -> Applied:
    """Applies one command. Returns (result, events, changes); state is updated in place.

    A rejected command changes nothing and returns {"ok": False, "code", "message"}.
    `term` is the Raft term of the entry (None: not checked, e.g. in unit tests).
    """
    stale = stale_view(command, term)
    if stale is not None:
        return unchanged(stale)
    request_id = getattr(command, "request_id", None)
    if request_id is not None:
        first = _first_answer(state, command.TYPE, request_id)
        if first is not None:
            return unchanged(first)  # a retry of a write already applied: its first answer
    handler = HANDLERS[type(command)]
    try:
        applied = handler(state, command, index)
    except MqmetaError as rejected:
        applied = unchanged({"ok": False, "code": rejected.code, "message": rejected.message})
    if request_id is not None:
        remembered = _remember_answer(state, command.TYPE, request_id, applied.result)
        applied = Applied(applied.result, applied.events, {**applied.changes, **remembered})
    before = {key: state.get(key) for key in applied.changes if key.startswith("brokerset/")}
    state.commit(applied.changes)
    _assert_invariants(before, applied.changes)
    return applied


# Request ids of admin writes (P16) -----------------------------------------------------
# A client sends one id with every attempt of one logical write; the first attempt to be
# applied is remembered with its answer (refusals too), so a retry after a lost answer
# gets that answer instead of being applied again (AlreadyExists for a create). The
# newest REQUEST_IDS_REMEMBERED_MAX are kept, in the state (replicated, in snapshots,
# in the digest): "requests" counts them, "requestslot/<n mod max>" names the id in each
# slot of the ring, "request/<id>" holds the write's type and answer.
REQUEST_IDS_REMEMBERED_MAX = 10_000


def _first_answer(state: ControllerState, command_type: str, request_id: str) -> Json | None:
    first = state.get(f"request/{request_id}")
    if first is None:
        return None
    if first["type"] != command_type:
        return {
            "ok": False,
            "code": "INVALID_ARGUMENT",
            "message": f"request id {request_id} was used for a {first['type']} write already; "
            "use a new id for each logical write",
        }
    return first["result"]


def _remember_answer(
    state: ControllerState, command_type: str, request_id: str, result: Json
) -> dict[str, Json | None]:
    count = (state.get("requests") or {"count": 0})["count"]
    slot = f"requestslot/{count % REQUEST_IDS_REMEMBERED_MAX}"
    changes: dict[str, Json | None] = {}
    evicted = state.get(slot)
    if evicted is not None:
        changes[f"request/{evicted['id']}"] = None
    changes.update(
        {
            "requests": {"count": count + 1},
            slot: {"id": request_id},
            f"request/{request_id}": {"type": command_type, "result": result},
        }
    )
    return changes


def _assert_invariants(before: dict[str, Json | None], changes: dict[str, Json | None]) -> None:
    """M1: a broker set's master epoch never moves back, and moves on whenever its master
    changes. M3: a master is always in its SyncStateSet. M4: the SyncStateSet epoch never
    moves back, and moves on whenever the set changes. A violation is a bug: crash."""
    for key, value in changes.items():
        if value is None or not key.startswith("brokerset/"):
            continue
        master = value["master_broker_id"]
        assert not master or master in value["sync_state_set"], ("M3", key, value)
        old = before.get(key)
        if old is None:
            continue
        assert value["master_epoch"] >= old["master_epoch"], ("M1", key, old, value)
        if master != old["master_broker_id"]:
            assert value["master_epoch"] > old["master_epoch"], ("M1", key, old, value)
        assert value["sync_state_set_epoch"] >= old["sync_state_set_epoch"], ("M4", key, old, value)
        if sorted(value["sync_state_set"]) != sorted(old["sync_state_set"]):
            assert value["sync_state_set_epoch"] > old["sync_state_set_epoch"], ("M4", key, old, value)


# Derived reads ----------------------------------------------------------------------


def topic_route(state: ControllerState, name: str) -> Json:
    """The route of a topic: its queues per broker set and each set's addresses."""
    topic = state.get(f"topic/{validate_name('topic name', name)}")
    if topic is None:
        raise error_from_code("TOPIC_NOT_FOUND", f"topic {name} does not exist")
    names = topic["broker_names"] or [bs["broker_name"] for bs in state.broker_sets(topic["cluster"])]
    queues, brokers = [], []
    for broker_name in names:
        bs = state.broker_set(topic["cluster"], broker_name)
        if bs is None or not bs["replicas"]:
            continue
        queues.append(
            {
                "broker_name": broker_name,
                "read_queue_count": topic["queue_count"],
                "write_queue_count": topic["queue_count"],
                "perm": topic["perm"],
            }
        )
        brokers.append(broker_route(bs))
    return {
        "topic": topic["name"],
        "message_type": topic["message_type"],
        "queues": queues,
        "brokers": brokers,
    }


def broker_route(bs: Json) -> Json:
    view = replica_view(bs)
    return {
        "cluster": bs["cluster"],
        "broker_name": bs["broker_name"],
        "master_broker_id": view["master_broker_id"],
        "master_address": view["master_address"],
        "master_epoch": bs["master_epoch"],
        "addresses": {int(i): r["address"] for i, r in bs["replicas"].items()},
    }
