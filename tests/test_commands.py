"""The controller's typed commands and their one Raft encoding: every command type has a
handler and survives its JSON round trip; a log written before typed commands (encoding
version 1, tests/fixtures/raft_log_v1) still applies to the same results and state
digests, both entry by entry and when a real node replays its journal; an entry in an
unknown encoding is refused; `apply` asserts invariants M1, M3 and M4."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from mqmeta.cluster.wait import wait_for
from mqmeta.controller import commands, state_machine
from mqmeta.controller.commands import (
    COMMAND_TYPES,
    Applied,
    DeleteTopic,
    ElectMaster,
    PutTopic,
    RegisterBroker,
    Undecodable,
    UnknownEncoding,
    command_from_json,
    command_json,
    decode_entry,
    encode_entry,
)
from mqmeta.controller.raft_node import ControllerRaft, Peer, RaftSettings
from mqmeta.controller.service import register_command
from mqmeta.controller.state_machine import ControllerState, apply

from mqmeta.pb import controller_pb2 as cpb

FIXTURE = Path(__file__).parent / "fixtures" / "raft_log_v1"


def fixture_entries() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURE / "entries.jsonl").read_text().splitlines()]


def test_every_command_type_has_a_handler_and_a_distinct_type_name():
    assert set(state_machine.HANDLERS) == {*COMMAND_TYPES.values(), Undecodable}
    assert len(COMMAND_TYPES) == len({kind.TYPE for kind in COMMAND_TYPES.values()})


def test_the_fixture_covers_every_command_type():
    seen = {c.TYPE for entry in fixture_entries() for c in decode_entry(entry["payload"])}
    assert seen == set(COMMAND_TYPES), set(COMMAND_TYPES) - seen


def test_a_command_survives_its_json_round_trip_and_none_fields_are_left_out():
    for entry in fixture_entries():
        for command in decode_entry(entry["payload"]):
            assert command_from_json(json.loads(json.dumps(command_json(command)))) == command
    document = command_json(RegisterBroker(cluster="c", broker_name="b", address="h:1", check_code="x"))
    assert "now_ms" not in document and document["type"] == "register_broker"


def test_a_version_1_log_applies_to_the_results_and_digests_it_had():
    state = ControllerState()
    for entry in fixture_entries():
        assert json.loads(entry["payload"]).__class__ is list, "the fixture must hold version-1 payloads"
        results = [
            apply(state, c, entry["index"], entry["term"]).result for c in decode_entry(entry["payload"])
        ]
        assert results == entry["results"], f"entry {entry['index']}"
        assert state.digest == entry["state_digest"], f"entry {entry['index']}"


def test_an_entry_encoded_now_decodes_to_the_same_commands_with_its_version():
    batch = [
        DeleteTopic(name="t"),
        PutTopic(name="t", queue_count=4, broker_names=["b"]),
        ElectMaster(
            cluster="c", broker_name="b", trigger="controller", alive={"1": {"epoch": 1}}, leader_term=2
        ),
    ]
    payload = encode_entry(batch)
    assert json.loads(payload)["version"] == commands.ENCODING_VERSION
    assert decode_entry(payload) == batch


def test_a_registration_as_a_new_process_is_written_in_version_4():
    """A node of an earlier version cannot decode `new_process` and would refuse the
    registration that newer nodes apply (their states would part): the entry is written in
    version 4, which such a node refuses to read at all (UnknownEncoding: it stops)."""
    first = RegisterBroker("c", "b", "10.0.0.1:10911", "k", 1, new_process=True)
    again = RegisterBroker("c", "b", "10.0.0.1:10911", "k", 1)
    assert json.loads(encode_entry([again]))["version"] == commands.ENCODING_VERSION
    payload = encode_entry([again, first])
    assert json.loads(payload)["version"] == commands.ENCODING_VERSION_NEW_PROCESS == 4
    assert decode_entry(payload) == [again, first]


def test_a_request_says_new_process_only_when_it_is_true():
    """proto3 cannot tell false from unset: false (an older broker, or not its first
    registration) leaves the field out of the command, so the entry stays version 2."""
    fields = dict(cluster="c", broker_name="b", check_code="k", address="10.0.0.1:10911")
    assert register_command(cpb.RegisterBrokerRequest(**fields)).new_process is None
    assert register_command(cpb.RegisterBrokerRequest(**fields, new_process=False)).new_process is None
    first = register_command(cpb.RegisterBrokerRequest(**fields, new_process=True))
    assert first.new_process is True
    assert json.loads(encode_entry([first]))["version"] == commands.ENCODING_VERSION_NEW_PROCESS


@pytest.mark.parametrize("payload", ['{"version": 99, "commands": []}', '{"commands": []}', '"text"'])
def test_an_entry_in_an_unknown_encoding_is_refused(payload):
    with pytest.raises(UnknownEncoding, match="encoding version"):
        decode_entry(payload)


@pytest.mark.parametrize(
    "document, reason",
    [
        ({"type": "delete_topic", "name": "t", "nmae": "u"}, "no field nmae"),
        ({"type": "register_broker", "cluster": "c"}, "lacks address, broker_name, check_code"),
        ({"type": "frobnicate"}, "unknown command type 'frobnicate'"),
        ([1, 2], "a command is a JSON object"),
    ],
)
def test_a_command_that_cannot_be_decoded_is_refused_by_every_node_alike(document, reason):
    command = command_from_json(document)
    assert isinstance(command, Undecodable) and reason in command.reason
    state = ControllerState()
    result, events, changes = apply(state, command, 1)
    assert result == {"ok": False, "code": "INVALID_ARGUMENT", "message": command.reason}
    assert (events, changes, state.entries) == ([], {}, {})
    with pytest.raises(TypeError):
        command_json(command)


def test_commands_are_frozen():
    command = DeleteTopic(name="t")
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.name = "u"  # type: ignore[misc]


def _free_port() -> int:
    with socket.socket() as probe:  # one node on loopback, started at once
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.timeout(60)
def test_a_node_replays_a_journal_written_before_typed_commands(tmp_path):
    """The journal of a node that ran the version-1 code, replayed by a node of today:
    it applies every entry to the digest the old node had."""
    for name in ("raft.journal", "raft.journal.meta"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    last = fixture_entries()[-1]
    address = f"127.0.0.1:{_free_port()}"
    events: list[Any] = []
    settings = RaftSettings(journal_fsync=False)
    peers = [Peer("n1", address, "127.0.0.1:1")]
    node = ControllerRaft("n1", address, peers, tmp_path, settings, lambda index, found: events.append(index))
    try:
        wait_for(
            lambda: node.raftLastApplied >= last["index"], 30, f"the node to apply index {last['index']}"
        )
        assert node.state.digest == last["state_digest"]
        assert events, "the replayed entries published no watch event"
    finally:
        node.close()
    applied = [json.loads(line) for line in (tmp_path / "applied.jsonl").read_text().splitlines()]
    assert [r["state_digest"] for r in applied if r["index"] == last["index"]] == [last["state_digest"]]


def _with_master() -> ControllerState:
    state = ControllerState()
    for n in (1, 2):
        register = RegisterBroker(cluster="c", broker_name="b", address=f"10.0.0.{n}:1", check_code=f"x{n}")
        assert apply(state, register, n).result["ok"]
    elect = ElectMaster(cluster="c", broker_name="b", trigger="controller", alive={"1": {}, "2": {}})
    assert apply(state, elect, 3).result["ok"]
    return state


@pytest.mark.parametrize(
    "change, invariant",
    [
        ({"master_broker_id": 2, "sync_state_set": [2]}, "M1"),  # a new master at the same epoch
        ({"master_epoch": 0}, "M1"),  # the epoch moved back
        ({"sync_state_set": [1, 2]}, "M4"),  # the set changed, its epoch did not
        ({"sync_state_set_epoch": 0}, "M4"),  # the set's epoch moved back
        ({"sync_state_set": [2]}, "M3"),  # the master left its set (epoch bumped: M4 holds)
    ],
)
def test_apply_crashes_on_a_handler_that_breaks_an_invariant(monkeypatch, change, invariant):
    state = _with_master()
    key = "brokerset/c/b"
    broken = dict(state.get(key) or {}, **change)
    if invariant == "M3":
        broken["sync_state_set_epoch"] += 1

    def buggy(state: ControllerState, command: Any, index: int) -> Applied:
        return Applied({"ok": True}, [], {key: broken})

    monkeypatch.setitem(state_machine.HANDLERS, DeleteTopic, buggy)
    with pytest.raises(AssertionError) as crashed:
        apply(state, DeleteTopic(name="t"), 4)
    assert crashed.value.args[0][0] == invariant
