"""Fuzzed requests to every method of every gRPC service we serve, on live processes.

Properties, for each method (one test each; requests drawn from the message descriptors,
half arbitrary, half "nearly valid": real topic/group/broker names with one field broken):
- no answer is INTERNAL, UNKNOWN or any status outside the documented ones
  (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, ALREADY_EXISTS, OUT_OF_RANGE; OK;
  UNAVAILABLE / DEADLINE_EXCEEDED only on the long polls LONG_POLLS), and a refusal has a
  message;
- apache.rocketmq.v2 answers carry their own Status: never INTERNAL_SERVER_ERROR, always
  with a message;
- a refused controller write changes nothing: the state digest after it is the one
  before it;
- every process is alive and healthy after the method's cases (a writable master too).

One cluster for the module: 1 controller (speed), a standalone nameserver, broker set
broker-a of 2 replicas. The services come from proto/ compiled into a private descriptor
pool (tests/support/pb_fuzz.py), so this module holds neither mqmeta's apache.rocketmq.v2
stubs nor the official client. Hypothesis runs derandomized (the same cases every run);
the `slow` variant draws EXAMPLES_LONG per method. Cases per method are printed at the
end (pytest -s).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqmeta.cluster.harness import Cluster
from mqmeta.cluster.wait import wait_for

from mqmeta.errors import AlreadyExists
from mqmeta.pb import controller_pb2 as cpb
from tests.support.fuzz_calls import CASES, Outcome, call, check_status, serving
from tests.support.pb_fuzz import message_class, requests, services

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(300),
    # A failing case with a 1 MiB field is still worth printing.
    pytest.mark.filterwarnings("ignore:Generating overly large repr"),
]

EXAMPLES = 12
EXAMPLES_LONG = int(os.environ.get("MQMETA_FUZZ_EXAMPLES", "300"))  # per method, `slow` only
CLIENT_ID = "fuzz-client"
RMQ_INTERNAL_SERVER_ERROR = 50001  # apache.rocketmq.v2.Code
RMQ_UNSUPPORTED = 50500
RMQ_SERVICE = "apache.rocketmq.v2.MessagingService"
HEALTHY_TIMEOUT_S = 30.0

SERVICES = services()
# Where each service is served: process kinds of the cluster.
TARGETS = {
    "mqmeta.v1.ControllerService": ["controller"],
    "mqmeta.v1.NameServer": ["namesrv"],
    "mqmeta.v1.BrokerService": ["broker"],
    RMQ_SERVICE: ["namesrv", "broker"],
    "mqmeta.v1.CallStream": ["controller", "broker"],
}
# Methods that wait by design, where UNAVAILABLE / DEADLINE_EXCEEDED are documented.
LONG_POLLS = {"Watch", "WatchBatched", "HaFetch", "ReceiveMessage", "Telemetry"}
# Real names, so that "nearly valid" requests pass the first checks. The topic and the group
# share a name: the rmq Resource message names both.
NAME = "Fuzz"
SCRATCH = "FuzzScratch"  # the topic and group the controller's writes may change or delete
SCRATCH_SET = "broker-fuzz"  # a broker set registered for the controller's writes (not broker-a)
KNOWN = {
    "name": NAME,
    "topic": NAME,
    "group": NAME,
    "broker_name": "broker-a",
    "Broker.name": "broker-a",
    "queue_count": 2,
    "max_count": 8,
    "batch_size": 4,
    "check_code": "fuzz",
}
# Controller methods that do not write (the rest must leave the digest alone when refused).
CONTROLLER_READS = {"GetNextBrokerId", "GetReplicaInfo", "GetSyncStateData", "GetMetadata", "ListBrokerSets"}
CONTROLLER_READS |= {"ListTopics", "GetTopicRoute", "ListGroups", "GetConfig", "GetTieredCheckpoint", "Watch"}
CONTROLLER_READS |= {"GetReplicatorStatus", "GetCommandHistory", "WatchBatched"}

# A replicator worker's heartbeats and commits (nearly valid: a worker with one rule).
REPLICATOR_KNOWN = {
    "rule": "fuzz-rule",
    "rules": ["fuzz-rule"],
    "worker_id": "fuzz-worker",
    "incarnation": "fuzz",
    "lease_ms": 1500,
    "dead_after_ms": 2500,
    "epoch": 1,
    "start_offset": -1,
    "acked_offset": -1,
}
# Writes the controller makes by itself, at any moment: the leader expires replicator workers
# that the fuzzed heartbeats registered once they fall silent.
BACKGROUND_COMMANDS = {"replicator_expire"}

SKIPPED = {
    # Admin is the vendored file's other service: no process of ours serves it.
    "apache.rocketmq.v2.Admin": "not served by any mqmeta process",
}


def _method_ids() -> list[tuple[str, str, str]]:
    found = []
    for service_name, service in SERVICES.items():
        if service_name in SKIPPED:
            continue
        for kind in TARGETS[service_name]:
            found += [(service_name, method.name, kind) for method in service.methods]
    return found


METHODS = _method_ids()


def test_every_service_is_fuzzed_or_listed_as_skipped():
    """Nothing is skipped silently: each service of proto/ is fuzzed or named in SKIPPED."""
    assert set(SERVICES) == set(TARGETS) | set(SKIPPED)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("fuzz"), count=1, broker_sets=1, replicas=2)
    c.start()
    try:
        c.master_of("broker-a")
        cluster_name = c.broker_status(c.layout.brokers[0].name).cluster
        with c.client() as admin:
            for method, spec in (
                ("CreateTopic", cpb.TopicSpec(name=NAME, queue_count=2)),
                ("CreateGroup", cpb.GroupSpec(name=NAME)),
                ("CreateTopic", cpb.TopicSpec(name=SCRATCH, queue_count=2)),
                ("CreateGroup", cpb.GroupSpec(name=SCRATCH)),
            ):
                try:
                    admin.call(method, spec)
                except AlreadyExists:
                    pass  # a retried call that had gone through
            admin.call(
                "RegisterBroker",
                cpb.RegisterBrokerRequest(
                    cluster=cluster_name,
                    broker_name=SCRATCH_SET,
                    broker_id=1,
                    check_code="fuzz",
                    address="127.0.0.1:9",
                ),
            )
        yield c, cluster_name
        counts = "\n".join(f"  {name}: {count}" for name, count in sorted(CASES.items()))
        print(f"\nfuzzed cases per method ({sum(CASES.values())} in all):\n{counts}")
    finally:
        c.stop()


def _addresses(cluster: Cluster, kind: str) -> list[str]:
    if kind == "controller":
        return [n.grpc for n in cluster.layout.controllers]
    if kind == "namesrv":
        return list(cluster.layout.namesrv)
    return [b.grpc for b in cluster.layout.brokers]


def _known(service_name: str, cluster_name: str) -> dict:
    known = dict(KNOWN, cluster=cluster_name)
    if service_name == "mqmeta.v1.ControllerService":
        # Never elect, clean or fence broker-a, nor delete the topic the rest fuzz with.
        known.update(name=SCRATCH, topic=SCRATCH, group=SCRATCH, broker_name=SCRATCH_SET)
        known["broker_id"] = 1
        known.update(REPLICATOR_KNOWN)
    return known


def _check_rmq_answers(outcome: Outcome, where: str) -> None:
    for answer in outcome.answers:
        if not answer.DESCRIPTOR.fields_by_name.get("status") or not answer.HasField("status"):
            continue  # a stream's message or delivery-time part
        code, message = answer.status.code, answer.status.message
        assert code != RMQ_INTERNAL_SERVER_ERROR, f"{where}: INTERNAL_SERVER_ERROR: {message!r}"
        assert message.strip(), f"{where}: status {code} without a message"


def _background(entry: dict) -> bool:
    """An entry the leader wrote on its own: BACKGROUND_COMMANDS, or elections it started
    because a broker's heartbeats stopped (the scratch set's broker never runs, so its
    master is found dead and elected again whenever its liveness lapses)."""
    if entry["command_type"] in BACKGROUND_COMMANDS:
        return True
    commands = entry.get("commands") or []
    return bool(commands) and all(
        c.get("type") == "elect_master" and c.get("trigger") == "controller" for c in commands
    )


def _foreign_changes(cluster: Cluster, after_index: int, last_index: int) -> list[str]:
    """The entries applied in (after_index, last_index] that changed the state of something
    other than broker-a: broker-a's own processes write in the background (elections, their
    SyncStateSet, tiered uploads), and so does the leader (BACKGROUND_COMMANDS); the fuzzed
    controller writes never name broker-a."""
    path = cluster.applied_log("c1")

    def entries() -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    found = wait_for(
        entries,
        HEALTHY_TIMEOUT_S,
        f"{path} to reach index {last_index}",
        until=lambda es: bool(es) and es[-1]["index"] >= last_index,
    )
    changes, previous = [], None
    for entry in found:
        if previous is not None and after_index < entry["index"] <= last_index:
            foreign = [key for key in entry["effects"] if not key.endswith("/broker-a")]
            if _background(entry):
                foreign = []
            if entry["state_digest"] != previous and foreign:
                changes.append(f"{entry['command_type']} at {entry['index']} changed {foreign}")
        previous = entry["state_digest"]
    return changes


def _healthy(cluster: Cluster) -> None:
    """Every process alive, SERVING, and broker-a with a writable master."""
    dead = [name for name, proc in cluster.supervisor.children.items() if proc.poll() is not None]
    assert not dead, f"processes died: {dead}"
    for kind in ("controller", "namesrv", "broker"):
        for address in _addresses(cluster, kind):
            assert serving(address), f"{kind} at {address} is not SERVING"
    cluster.master_of("broker-a", timeout_s=HEALTHY_TIMEOUT_S)


def _fuzz(live, service_name: str, method_name: str, kind: str, examples: int) -> None:
    import grpc

    cluster, cluster_name = live
    method = SERVICES[service_name].methods_by_name[method_name]
    rmq = service_name == RMQ_SERVICE
    digested = service_name == "mqmeta.v1.ControllerService" and method_name not in CONTROLLER_READS
    strategy = requests(method.input_type, _known(service_name, cluster_name))
    addresses = _addresses(cluster, kind)
    channels = {a: grpc.insecure_channel(a) for a in addresses}
    digest = [cluster.metadata("c1")]

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        request=strategy,
        more=st.lists(strategy, max_size=2) if method.client_streaming else st.just([]),
        address=st.sampled_from(addresses),
        with_client_id=st.booleans() if rmq else st.just(False),
    )
    def case(request, more, address, with_client_id):
        metadata = (
            [("x-mq-client-id", CLIENT_ID)] if with_client_id or (rmq and request.ByteSize() % 5) else []
        )
        outcome = call(channels[address], method, request, metadata, more)
        where = f"{service_name}/{method_name} at {kind} {address} with {str(request)[:200]!r}"
        check_status(outcome, where, long_poll=method_name in LONG_POLLS)
        if rmq:
            _check_rmq_answers(outcome, where)
        if digested:
            after = cluster.metadata("c1")
            if outcome.code != grpc.StatusCode.OK and after.state_digest != digest[0].state_digest:
                changes = _foreign_changes(cluster, digest[0].last_applied, after.last_applied)
                assert not changes, f"refused ({outcome.code.name}) but the state changed: {where}: {changes}"
            digest[0] = after

    try:
        case()
    finally:
        for channel in channels.values():
            channel.close()
    _healthy(cluster)


@pytest.mark.parametrize(("service_name", "method_name", "kind"), METHODS, ids=["/".join(m) for m in METHODS])
def test_fuzz(live, service_name, method_name, kind):
    _fuzz(live, service_name, method_name, kind, EXAMPLES)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("service_name", "method_name", "kind"), METHODS, ids=["/".join(m) for m in METHODS])
def test_fuzz_long(live, service_name, method_name, kind):
    _fuzz(live, service_name, method_name, kind, EXAMPLES_LONG)


def test_waits_cluster_healthy_at_end(live):
    """After every method's cases the cluster still answers (the digest converges)."""
    cluster, _ = live
    wait_for(lambda: cluster.metadata("c1").state_digest, HEALTHY_TIMEOUT_S, "the controller's digest")


# Bugs the fuzzing found, each pinned by its input -----------------------------------------
LONG_NAME = "y" * 70_000


@pytest.mark.parametrize(
    ("service_name", "method_name", "kind", "request_text"),
    [
        ("mqmeta.v1.ControllerService", "GetTopicRoute", "controller", f'name: "{LONG_NAME}"'),
        ("mqmeta.v1.ControllerService", "ListBrokerSets", "controller", f'cluster: "{LONG_NAME}"'),
        ("mqmeta.v1.NameServer", "QueryRoute", "namesrv", f'topic: "{LONG_NAME}"'),
    ],
    ids=["GetTopicRoute", "ListBrokerSets", "NameServer.QueryRoute"],
)
def test_a_70000_character_name_is_refused_with_a_short_sentence(
    live, service_name, method_name, kind, request_text
):
    """A name of 70,000 characters is INVALID_ARGUMENT with a sentence quoting a cut value.
    (It was RESOURCE_EXHAUSTED 'received metadata size exceeds hard limit': the message
    quoted the whole name into the grpc-message header, which the client dropped.)"""
    import grpc
    from google.protobuf import text_format

    cluster, _ = live
    method = SERVICES[service_name].methods_by_name[method_name]
    request = text_format.Parse(request_text, message_class(method.input_type)())
    with grpc.insecure_channel(_addresses(cluster, kind)[0]) as channel:
        outcome = call(channel, method, request)
    assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, (outcome.code, outcome.details[:200])
    assert "is malformed" in outcome.details and "70000 characters" in outcome.details
    assert len(outcome.details) < 400


def test_nameserver_answers_sync_lite_subscription_with_a_status(live):
    """SyncLiteSubscription on the nameserver is answered in its Status (it was gRPC
    UNIMPLEMENTED, outside the protocol). The nameserver is the clients' proxy by default
    (--rocketmq-routes proxy), so it answers as a broker does: UNSUPPORTED, naming lite topics."""
    import grpc

    cluster, _ = live
    method = SERVICES[RMQ_SERVICE].methods_by_name["SyncLiteSubscription"]
    with grpc.insecure_channel(cluster.layout.namesrv[0]) as channel:
        outcome = call(channel, method, message_class(method.input_type)(), [("x-mq-client-id", CLIENT_ID)])
    assert outcome.code == grpc.StatusCode.OK, (outcome.code, outcome.details)
    assert outcome.answers[0].status.code == RMQ_UNSUPPORTED
    assert "lite topics" in outcome.answers[0].status.message


def test_an_error_message_is_cut_for_its_header():
    """mqmeta.rpc.bounded keeps a status message under the client's header limit and
    validate.shown cuts a quoted value (units: characters)."""
    from mqmeta.rpc import MESSAGE_CHARS_MAX, bounded
    from mqmeta.validate import SHOWN_CHARS_MAX, shown

    assert bounded("short") == "short"
    assert len(bounded("x" * 100_000)) <= MESSAGE_CHARS_MAX
    assert bounded("x" * 100_000).endswith("(100000 characters)")
    assert shown("abc") == "'abc'"
    assert len(shown("z" * 5000)) < SHOWN_CHARS_MAX + 40
