"""Checks of the broker's and the proxy's RocketMQ 5 plumbing without gRPC, run in a
process of their own by tests/test_rmq_plumbing.py (a pytest process may hold the official
client's stubs, which clash with ours: see tests/support/rmq_client.py).

`python -m tests.support.rmq_plumbing_checks NAME...` runs the named checks and prints one
JSON object: check name -> "ok" or the traceback.
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

from mqmeta.broker_agent.pop import Candidate, LeaseGrant, Verdict
from mqmeta.broker_agent.rmq_metadata import CLIENT_EXPIRY_MS, Members
from mqmeta.broker_agent.rmq_pop import READ_CHUNK_MIN, PopShell
from mqmeta.controller.rmq_proxy import (
    SEND_MERGED_REQUEST_BYTES_MAX,
    RocketMQProxy,
    RouteSource,
    coalescing_key,
    mergeable_send,
    split_ack_answer,
    split_send_answer,
)

from mqmeta.pb.apache.rocketmq.v2 import definition_pb2 as rdef
from mqmeta.pb.apache.rocketmq.v2 import service_pb2 as rsvc
from mqmeta.rocketmq import status
from tests.support.checks_process import run_named


class _CountingStore:
    """get_messages over queue offsets 0..size-1, answering at most `answer_max` records
    per call (as MessageStore does at its byte limit); counts the records it decoded."""

    def __init__(self, size: int, answer_max: int = 1024) -> None:
        self.size = size
        self.answer_max = answer_max
        self.decoded = 0

    def get_messages(self, topic: str, queue_id: int, offset: int, count: int, confirm: int) -> list:
        got = [SimpleNamespace(queue_offset=o) for o in range(offset, min(offset + count, self.size))]
        got = got[: self.answer_max]
        self.decoded += len(got)
        return got


def _shell(store: _CountingStore) -> PopShell:
    return PopShell(SimpleNamespace(agent=None, store=store))  # type: ignore[arg-type]


def a_receive_of_32_decodes_about_32_records() -> None:
    store = _CountingStore(1_000)
    reads = _shell(store)._read("T", 0, list(range(1_000)), 10**9, READ_CHUNK_MIN)
    taken = [next(reads).queue_offset for _ in range(33)]  # a batch of 32 looks at 33
    assert taken == list(range(33))
    assert store.decoded <= 2 * READ_CHUNK_MIN, f"decoded {store.decoded} records for a batch of 32"


def a_short_answer_goes_on_from_the_last_record() -> None:
    store = _CountingStore(100, answer_max=5)
    got = [r.queue_offset for r in _shell(store)._read("T", 0, list(range(100)), 10**9, 32)]
    assert got == list(range(100))


def runs_with_gaps_are_read_run_by_run() -> None:
    store = _CountingStore(200)
    offsets = [3, 4, 9, *range(50, 120)]
    got = [r.queue_offset for r in _shell(store)._read("T", 0, offsets, 10**9, 32)]
    assert got == offsets
    assert store.decoded == len(offsets)


class _Agent:
    """append and wait_acknowledged as BrokerAgent's, counted."""

    def __init__(self) -> None:
        self.appends = 0
        self.waits: list[tuple[int, int]] = []

    def append(self, put) -> tuple[None, int, int]:
        put(7)
        self.appends += 1
        return None, self.appends * 100, 7

    def wait_acknowledged(self, end: int, epoch: int) -> None:
        self.waits.append((end, epoch))


class _ProgressStore:
    def consumer_progress(self, group: str, topic: str, queue_id: int) -> tuple[int, tuple]:
        return 0, ()

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        return 0

    def commit_consumer_progress(self, entries: list, epoch: int, now_ms: int) -> None:
        pass


def _delivered(shell: PopShell, key: tuple[str, str, int], count: int) -> list[int]:
    """Leases of offsets 0..count-1 of `key`, delivered as a receive does."""
    slot = shell.slot(key, 0)
    grant = LeaseGrant(0, 30_000, "client", False, 0)
    return [slot.cursor.apply(Candidate(o, "", ""), Verdict.DELIVER, grant).lease for o in range(count)]


def a_batch_of_acks_appends_once_per_queue_and_waits_once() -> None:
    agent = _Agent()
    shell = PopShell(
        SimpleNamespace(agent=agent, store=_ProgressStore(), master_epoch=lambda: 7)  # type: ignore[arg-type]
    )
    a, b = ("g", "T", 0), ("g", "T", 1)
    leases_a, leases_b = _delivered(shell, a, 10), _delivered(shell, b, 6)
    acks = [(a, o, lease) for o, lease in enumerate(leases_a[:9])] + [
        (b, o, lease) for o, lease in enumerate(leases_b)
    ]
    acks.append((a, 9, leases_a[9] + 999))  # a stale lease: refused on its own
    outcomes = shell.ack_many(acks)
    assert outcomes == [True] * 15 + [False]
    assert agent.appends == 2, "one progress record per queue"
    assert len(agent.waits) <= 2 and agent.waits[0] == (200, 7), "the latest record awaited first"


def _entry(handle: str, code: int = rdef.OK, message: str = "OK") -> rsvc.AckMessageResultEntry:
    return rsvc.AckMessageResultEntry(message_id=handle, receipt_handle=handle, status=status(code, message))


def a_merged_ack_answer_is_split_back_per_caller() -> None:
    stale = (rdef.INVALID_RECEIPT_HANDLE, "the receipt handle is stale")
    answer = rsvc.AckMessageResponse(
        status=status(rdef.MULTIPLE_RESULTS, ""),
        entries=[_entry("a"), _entry("b"), _entry("c", *stale), _entry("d", *stale)],
    )
    parts = [
        rsvc.AckMessageResponse.FromString(raw)
        for raw in split_ack_answer(answer.SerializeToString(), [1, 2, 1])
    ]
    assert [[e.receipt_handle for e in p.entries] for p in parts] == [["a"], ["b", "c"], ["d"]]
    assert parts[0].status.code == rdef.OK
    assert parts[1].status.code == rdef.MULTIPLE_RESULTS
    # a caller whose one handle is stale gets exactly what the master answers a lone ack
    assert (parts[2].status.code, parts[2].status.message) == stale
    assert (parts[2].entries[0].status.code, parts[2].entries[0].status.message) == stale


def a_refused_merged_ack_is_everyones_answer() -> None:
    refused = rsvc.AckMessageResponse(status=status(rdef.HA_NOT_AVAILABLE, "no master")).SerializeToString()
    assert split_ack_answer(refused, [1, 3]) == [refused, refused]


def calls_merge_only_with_the_same_identity() -> None:
    signed = "MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature="
    one = [
        ("x-mq-client-id", "c1"),
        ("x-mq-request-id", "r1"),
        ("x-mq-date-time", "t1"),
        ("authorization", signed + "a"),
    ]
    two = [
        ("x-mq-client-id", "c1"),
        ("x-mq-request-id", "r2"),
        ("x-mq-date-time", "t1"),
        ("authorization", signed + "a"),
    ]
    later = [
        ("x-mq-client-id", "c1"),
        ("x-mq-request-id", "r3"),
        ("x-mq-date-time", "t2"),
        ("authorization", signed + "b"),
    ]
    other = [
        ("x-mq-client-id", "c2"),
        ("x-mq-request-id", "r2"),
        ("x-mq-date-time", "t1"),
        ("authorization", signed + "a"),
    ]
    assert coalescing_key(one) == coalescing_key(two)
    assert coalescing_key(one) != coalescing_key(later)
    assert coalescing_key(one) != coalescing_key(other)


def _send_request(**system) -> rsvc.SendMessageRequest:
    body = system.pop("body", b"x")
    m = rdef.Message(topic=rdef.Resource(name="T"), body=body)
    m.system_properties.message_id = "id"
    m.system_properties.message_type = system.pop("message_type", rdef.NORMAL)
    for name, value in system.items():
        setattr(m.system_properties, name, value)
    return rsvc.SendMessageRequest(messages=[m])


def only_plain_small_sends_are_merged() -> None:
    assert mergeable_send(_send_request())
    assert not mergeable_send(_send_request(message_type=rdef.FIFO, message_group="g"))
    assert not mergeable_send(_send_request(message_group="g"))
    assert not mergeable_send(_send_request(message_type=rdef.TRANSACTION))
    assert not mergeable_send(_send_request(message_type=rdef.DELAY))
    delayed = _send_request()
    delayed.messages[0].system_properties.delivery_timestamp.seconds = 1
    assert not mergeable_send(delayed)
    assert not mergeable_send(_send_request(body=b"x" * (64 * 1024 + 1)))
    two = _send_request()
    two.messages.append(two.messages[0])
    assert not mergeable_send(two)


def a_merged_send_answer_is_split_back_per_caller() -> None:
    entries = [
        rsvc.SendResultEntry(status=status(), message_id="a", offset=1),
        rsvc.SendResultEntry(status=status(rdef.MESSAGE_BODY_EMPTY, "empty"), message_id="b"),
    ]
    answer = rsvc.SendMessageResponse(status=status(rdef.MULTIPLE_RESULTS, ""), entries=entries)
    parts = [
        rsvc.SendMessageResponse.FromString(raw) for raw in split_send_answer(answer.SerializeToString(), 2)
    ]
    assert [(p.status.code, p.entries[0].message_id) for p in parts] == [
        (rdef.OK, "a"),
        (rdef.MESSAGE_BODY_EMPTY, "b"),
    ]
    refused = rsvc.SendMessageResponse(status=status(rdef.HA_NOT_AVAILABLE, "no master")).SerializeToString()
    assert split_send_answer(refused, 3) == [refused] * 3


def _ack_request(i: int) -> bytes:
    return rsvc.AckMessageRequest(
        group=rdef.Resource(name="g"),
        topic=rdef.Resource(name="T"),
        entries=[rsvc.AckMessageEntry(message_id=f"m{i}", receipt_handle=f"h{i}")],
    ).SerializeToString()


def _three_acks_through_the_proxy(merge_calls: bool) -> tuple[list[int], list[rsvc.AckMessageResponse]]:
    """Three one-entry AckMessages at once through RocketMQProxy.upstream, its upstream
    call replaced by one that records how many entries each call carried."""
    source = RouteSource(lambda topic: None, lambda topic: None, lambda: None)
    proxy = RocketMQProxy(source, ["p:1"], lambda: None, merge_calls=merge_calls)
    calls: list[int] = []

    async def upstream_call(request: bytes, timeout: float, metadata: list) -> bytes:
        parsed = rsvc.AckMessageRequest.FromString(request)
        calls.append(len(parsed.entries))
        await asyncio.sleep(0.01)
        entries = [
            rsvc.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=status()
            )
            for e in parsed.entries
        ]
        return rsvc.AckMessageResponse(status=status(), entries=entries).SerializeToString()

    proxy.unary = lambda address, method: upstream_call  # type: ignore[method-assign]

    async def acks() -> list[bytes]:
        headers = [[("x-mq-client-id", "c"), ("x-mq-request-id", str(i))] for i in range(3)]
        return await asyncio.gather(
            *(proxy.upstream("b:1", "AckMessage", _ack_request(i), 5.0, headers[i]) for i in range(3))
        )

    return calls, [rsvc.AckMessageResponse.FromString(raw) for raw in asyncio.run(acks())]


def the_proxy_merges_waiting_acks_unless_told_not_to() -> None:
    for merge_calls, calls_expected in ((True, [3]), (False, [1, 1, 1])):
        calls, answers = _three_acks_through_the_proxy(merge_calls)
        assert calls == calls_expected, (merge_calls, calls)
        assert [[e.message_id for e in a.entries] for a in answers] == [["m0"], ["m1"], ["m2"]]
        assert all(a.status.code == rdef.OK for a in answers)


def a_terminated_client_is_not_brought_back_by_its_late_requests() -> None:
    members, now = Members(), 1_000_000
    for client in ("first", "second"):
        members.seen(client, now, rdef.PUSH_CONSUMER, "g")
    members.remove("second", now + 1)
    # a receive, heartbeat, assignment query or settings of "second" still in flight
    members.seen("second", now + 2, rdef.PUSH_CONSUMER, "g")
    members.settings("second", rdef.Settings(client_type=rdef.PUSH_CONSUMER), now + 3)
    assert members.alive(now + 4) == {"first"}
    assert [c for c, _, _ in members.of_group("g", now + 4)] == ["first"]
    # the memory of terminated clients is bounded in time: a later id is a new client
    members.remove("third", now + 5 + CLIENT_EXPIRY_MS)
    assert "second" not in members._terminated and "third" in members._terminated


def _send_bytes(i: int, unknown_bytes: int = 0) -> bytes:
    """A plain one-message SendMessageRequest of body `body-i`, with a field we do not know
    (number 15) of `unknown_bytes` appended when that is not 0."""
    raw = _send_request(body=f"body-{i}".encode(), message_id=f"id-{i}").SerializeToString()
    if not unknown_bytes:
        return raw
    length = bytearray()
    size = unknown_bytes
    while size > 0x7F:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return raw + bytes([15 << 3 | 2]) + bytes(length) + b"u" * unknown_bytes


def _sends_through_the_proxy(
    later: list[bytes],
) -> tuple[list[list[bytes]], int, list[rsvc.SendMessageResponse]]:
    """One plain send through RocketMQProxy.upstream, then the requests `later` while it is
    upstream, its upstream call replaced by one that records the bodies of each call it
    was given (decoded from the bytes it got) and how many calls it held at once."""
    source = RouteSource(lambda topic: None, lambda topic: None, lambda: None)
    proxy = RocketMQProxy(source, ["p:1"], lambda: None)
    calls: list[list[bytes]] = []
    held = [0, 0]  # now, most

    async def upstream_call(request: bytes, timeout: float, metadata: list) -> bytes:
        parsed = rsvc.SendMessageRequest.FromString(request)
        calls.append([m.body for m in parsed.messages])
        held[0] += 1
        held[1] = max(held)
        await asyncio.sleep(0.05)
        held[0] -= 1
        entries = [
            rsvc.SendResultEntry(status=status(), message_id=m.system_properties.message_id, offset=i)
            for i, m in enumerate(parsed.messages)
        ]
        return rsvc.SendMessageResponse(status=status(), entries=entries).SerializeToString()

    proxy.unary = lambda address, method: upstream_call  # type: ignore[method-assign]

    def send(i: int, request: bytes):
        headers = [("x-mq-client-id", "c"), ("x-mq-request-id", str(i))]
        return proxy.upstream("b:1", "SendMessage", request, 5.0, headers)

    async def sends() -> list[bytes]:
        first = asyncio.ensure_future(send(0, _send_bytes(0)))
        await asyncio.sleep(0.01)  # the first is upstream now
        return await asyncio.gather(first, *(send(i, r) for i, r in enumerate(later, 1)))

    answers = [rsvc.SendMessageResponse.FromString(raw) for raw in asyncio.run(sends())]
    return calls, held[1], answers


def one_merged_send_per_client_is_in_flight() -> None:
    calls, held_most, answers = _sends_through_the_proxy([_send_bytes(i) for i in range(1, 6)])
    assert held_most == 1, held_most
    assert calls == [[b"body-0"], [f"body-{i}".encode() for i in range(1, 6)]], calls
    assert [[e.message_id for e in a.entries] for a in answers] == [[f"id-{i}"] for i in range(6)]
    assert all(a.status.code == rdef.OK for a in answers)


def a_large_send_request_goes_alone() -> None:
    """A request over SEND_MERGED_REQUEST_BYTES_MAX (here: a small body, a large field we do
    not know) is not merged, so a merged request stays under the master's limit."""
    big = _send_bytes(2, unknown_bytes=SEND_MERGED_REQUEST_BYTES_MAX)
    assert rsvc.SendMessageRequest.FromString(big).messages[0].body == b"body-2"
    calls, _, answers = _sends_through_the_proxy([_send_bytes(1), big, _send_bytes(3)])
    assert sorted(calls) == sorted([[b"body-0"], [b"body-2"], [b"body-1", b"body-3"]]), calls
    assert [[e.message_id for e in a.entries] for a in answers] == [[f"id-{i}"] for i in range(4)]


CHECKS = {
    name: fn
    for name, fn in list(globals().items())
    if callable(fn) and not name.startswith("_") and fn.__module__ == __name__
}


if __name__ == "__main__":
    run_named(CHECKS, sys.argv[1:])
