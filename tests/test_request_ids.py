"""Request ids of admin writes (P16): a retried non-idempotent write is applied once.

Properties checked:
- the state machine applies a write with a request id once; a second command with the
  same id (a retry) changes nothing and answers the first answer, refusals included;
  the same id for another kind of write is refused; the remembered ids are bounded
  (the oldest forgotten first) and live in the state, so its digest covers them;
- commands without a request id (every entry written before P16) apply as before, and
  an entry whose commands carry one is encoded as version 3, which an older reader
  refuses rather than applying it differently;
- end to end, with a real 3-node controller cluster and the real ControllerClient: a
  CreateTopic whose answer is lost after the write applied is retried by the client
  and answers the topic it created (not ALREADY_EXISTS), once; so does a batch Write.
"""

from __future__ import annotations

import json
import threading

import grpc
import pytest
from mqmeta.cluster.harness import Cluster
from mqmeta.controller import state_machine
from mqmeta.controller.commands import (
    ENCODING_VERSION,
    ENCODING_VERSION_REQUEST_IDS,
    DeleteTopic,
    PutTopic,
    UpdateConfig,
    decode_entry,
    encode_entry,
)
from mqmeta.controller.state_machine import ControllerState, apply

from mqmeta import client as client_module
from mqmeta.pb import controller_pb2 as pb
from mqmeta.rpc import REQUEST_ID_HEADER

pytestmark = pytest.mark.timeout(90)


def create(name: str, request_id: str | None) -> PutTopic:
    return PutTopic(name=name, queue_count=4, request_id=request_id)


# The state machine ---------------------------------------------------------------------
def test_a_retried_create_answers_its_first_result_and_applies_once():
    state = ControllerState()
    first = apply(state, create("orders", "r1"), 1)
    assert first.result["ok"] and first.changes["topic/orders"]["queue_count"] == 4
    digest = state.digest
    retry = apply(state, create("orders", "r1"), 2)
    assert retry.result == first.result and retry.changes == {} and state.digest == digest
    other = apply(state, create("orders", "r2"), 3)
    assert other.result["code"] == "TOPIC_EXISTS", "another logical create of it is refused"


def test_a_refusal_is_remembered_and_an_id_is_not_reused_for_another_write():
    state = ControllerState()
    apply(state, create("orders", None), 1)
    refused = apply(state, create("orders", "r1"), 2)
    assert not refused.result["ok"]
    apply(state, DeleteTopic(name="orders"), 3)
    assert apply(state, create("orders", "r1"), 4).result == refused.result, "the first answer"
    assert state.get("topic/orders") is None, "the retry was not applied"
    reused = apply(state, UpdateConfig(values={"lease_ms": "1000"}, request_id="r1"), 5)
    assert reused.result["code"] == "INVALID_ARGUMENT" and "used for a put_topic" in reused.result["message"]


def test_the_remembered_ids_are_bounded(monkeypatch):
    monkeypatch.setattr(state_machine, "REQUEST_IDS_REMEMBERED_MAX", 3)
    state = ControllerState()
    for i in range(5):
        apply(state, create(f"t{i}", f"r{i}"), i + 1)
    remembered = {key for key, _ in state.with_prefix("request/")}
    assert remembered == {"request/r2", "request/r3", "request/r4"}
    assert state.recompute_digest() == state.digest
    again = apply(state, create("t0", "r0"), 9)
    assert not again.result["ok"], "r0 was forgotten: applied anew, and t0 exists"


def test_entries_without_ids_stay_version_2_and_ids_make_version_3():
    plain = encode_entry([create("a", None)])
    assert json.loads(plain)["version"] == ENCODING_VERSION and "request_id" not in plain
    with_id = encode_entry([create("a", "r1"), create("b", None)])
    assert json.loads(with_id)["version"] == ENCODING_VERSION_REQUEST_IDS
    assert decode_entry(with_id) == [create("a", "r1"), create("b", None)]
    assert decode_entry(plain) == [create("a", None)]


# A real cluster, a real client, an answer lost after the write applied --------------------
class LoseFirstAnswer(grpc.UnaryUnaryClientInterceptor):
    """Lets the first call of `method` reach the server and apply, then reports it
    UNAVAILABLE as if the connection broke before the answer came back."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.lost = 0
        self.request_ids: list[str] = []
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        if not client_call_details.method.endswith("/" + self.method):
            return continuation(client_call_details, request)
        metadata = dict(client_call_details.metadata or ())
        self.request_ids.append(metadata.get(REQUEST_ID_HEADER, ""))
        outcome = continuation(client_call_details, request)
        with self._lock:
            lose, self.lost = self.lost == 0, self.lost + 1
        if lose:
            outcome.result()  # the write was applied and answered; the answer is dropped
            return AnswerLost()
        return outcome


class AnswerLost(grpc.RpcError, grpc.Call, grpc.Future):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the connection broke before the answer arrived (test)"

    def trailing_metadata(self):
        return ()

    def initial_metadata(self):
        return ()

    def result(self, timeout=None):
        raise self

    def exception(self, timeout=None):
        return self

    def traceback(self, timeout=None):
        return None

    def add_done_callback(self, fn):
        fn(self)

    def cancel(self):
        return False

    def cancelled(self):
        return False

    def running(self):
        return False

    def done(self):
        return True

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def add_callback(self, callback):
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 3-node controller cluster for this module's end-to-end tests."""
    started = Cluster(tmp_path_factory.mktemp("request_ids") / "cluster").start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def losing_client(cluster, monkeypatch):
    """The real ControllerClient whose channels lose the first answer of a method."""
    interceptors: dict[str, LoseFirstAnswer] = {}
    real_channel = client_module.tls.channel

    def channel(*args, **kwargs):
        return grpc.intercept_channel(real_channel(*args, **kwargs), *interceptors.values())

    monkeypatch.setattr(client_module.tls, "channel", channel)

    def make(method: str) -> tuple[client_module.ControllerClient, LoseFirstAnswer]:
        interceptors.clear()
        interceptors[method] = LoseFirstAnswer(method)
        # gRPC calls only: the interceptor loses a gRPC call's answer (test_call_stream.py
        # checks that the call stream carries the request id)
        return client_module.ControllerClient(cluster.addresses, call_stream=False), interceptors[method]

    return make


def test_a_create_topic_whose_answer_was_lost_is_retried_and_answers_the_topic(cluster, losing_client):
    client, lose = losing_client("CreateTopic")
    with client:
        topic = client.create_topic(pb.TopicSpec(name="orders", queue_count=4))
        assert topic.name == "orders" and topic.queue_count == 4
        assert lose.lost >= 2, "the client retried after the lost answer"
        assert len(set(lose.request_ids)) == 1 and lose.request_ids[0], "one id for every attempt"
        listed = client.list_topics(pb.ListTopicsRequest())
        assert [t.name for t in listed.topics].count("orders") == 1


def test_a_write_batch_whose_answer_was_lost_answers_its_first_results(cluster, losing_client):
    client, lose = losing_client("Write")
    ops = [pb.WriteOp(create_topic=pb.TopicSpec(name=f"batch{i}", queue_count=2)) for i in range(3)]
    with client:
        results = client.write(pb.WriteBatch(writes=ops))
    assert lose.lost >= 2
    assert [r.WhichOneof("value") for r in results.results] == ["topic"] * 3, results
    assert [r.topic.name for r in results.results] == ["batch0", "batch1", "batch2"]
