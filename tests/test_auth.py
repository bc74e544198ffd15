"""Reads that need a credential (the default with an allow list; `--anonymous-reads` opts
out, see tests/test_tls.py), on a real `mqmeta local up --tls --auth --clusters 2
--replicate` (two clusters of one controller, a nameserver and a broker set of two
replicas, and a replicator a -> b), and on a plaintext `local up --auth` where tokens are
the only credentials (one broker).

Properties checked:
- every service every process serves (listed by its own reflection) has every method in
  mqmeta.auth's access table, so a new RPC cannot slip through unclassified;
- reads on every process (controller, nameserver, broker, the RocketMQ 5 endpoint, the
  Watch stream, reflection) without a credential are UNAUTHENTICATED with one sentence,
  also for a certificate of the cluster's CA that no allow list names; with the client
  certificate (a `read` identity) or the read token they answer; health checks stay open;
- every client still works: brokers register, the slave replicates from its master
  (HaFetch), the nameservers route, the CLI creates topics with the admin certificate
  and lists them with the client one, produces at a, and the replicator copies to b where
  the CLI consumes them; a CLI without a credential exits 2 with the sentence;
- a refused write changes nothing: a Send without a credential leaves the broker's offsets
  alone, and a CreateTopic by a `read` identity leaves the controller's state digest alone;
- RocketMQ 5 clients' own credentials (the official client's MQv2-HMAC-SHA1 signature,
  AccessKey = identity name, SecretKey = its token) are an identity; a wrong SecretKey is
  UNAUTHENTICATED; the unchanged official client sends with them and fails without;
- tokens alone: brokers register with the admin token, the CLI produces with the read
  token and is refused without one;
- settings that cannot work exit 2 with one sentence; the commented TLS and authorization
  keys of every deploy/ sample are known keys.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from mqmeta.cluster.certs import issue_certificate

from mqmeta import auth
from mqmeta.pb import broker_pb2, broker_pb2_grpc, controller_pb2_grpc, namesrv_pb2
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for
from tests.support.local_up import local_up

pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster]
MQMETA = [sys.executable, "-m", "mqmeta.cli"]
LOCAL_UP_READY_TIMEOUT_S = 90.0
REPLICATE_TIMEOUT_S = 60.0
IN_SYNC_TIMEOUT_S = 30.0
SENT = 20
CALL_TIMEOUT_S = 2.0  # long polls (Watch, HaFetch, ReceiveMessage) hold a call this long
RMQ_SERVICE = "apache.rocketmq.v2.MessagingService"
RMQ_PROTO = Path(__file__).resolve().parent.parent / "proto/apache/rocketmq/v2/service.proto"
NEEDS = "needs a credential (reads are not anonymous here)"


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*MQMETA, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("auth") / "local"
    flags = ["--tls", "--auth", "--controllers", "1", "--replicas", "2", "--clusters", "2", "--replicate"]
    with local_up(data_dir, *flags, timeout_s=LOCAL_UP_READY_TIMEOUT_S) as document:
        yield data_dir, document


def _cert(document: dict, which: str) -> tuple[str, str]:
    return document["tls"][f"{which}_cert"], document["tls"][f"{which}_key"]


def _stranger(data_dir: Path) -> tuple[str, str]:
    """A certificate of the cluster's CA whose CN no allow list names."""
    cert, key = issue_certificate(data_dir / "tls", "stranger", "mqmeta stranger")
    return str(cert), str(key)


def _channel(document: dict, address: str, cert: tuple[str, str]) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(document["tls"]["ca"]).read_bytes(),
        private_key=Path(cert[1]).read_bytes(),
        certificate_chain=Path(cert[0]).read_bytes(),
    )
    return grpc.secure_channel(address, credentials)


def _flags(document: dict, which: str) -> list[str]:
    cert, key = _cert(document, which)
    return ["--tls-ca", document["tls"]["ca"], "--tls-cert", cert, "--tls-key", key]


def _addresses(document: dict) -> dict[str, str]:
    return {
        "controller": document["controllers"][0]["grpc"],
        "namesrv": document["namesrv"][0]["grpc"],
        "broker": document["brokers"][0]["grpc"],
    }


def _reads(document: dict) -> list[tuple[str, str, object]]:
    """(process, method path, request bytes) of a read or fetch on each process."""
    controller = "/mqmeta.v1.ControllerService/"
    request = broker_pb2.QueryOriginRequest(cluster="a", broker_name="broker-a", topic="Guarded")
    return [
        ("controller", controller + "ListTopics", pb.ListTopicsRequest()),
        ("controller", controller + "GetMetadata", pb.GetMetadataRequest()),
        ("controller", controller + "GetSyncStateData", pb.BrokerSetRef(broker_name="broker-a")),
        ("namesrv", "/mqmeta.v1.NameServer/QueryRoute", namesrv_pb2.QueryRouteRequest(topic="Guarded")),
        ("broker", "/mqmeta.v1.BrokerService/GetHaStatus", broker_pb2.HaStatusRequest()),
        ("broker", "/mqmeta.v1.BrokerService/Pull", broker_pb2.PullRequest(topic="Guarded", max_count=1)),
        ("broker", "/mqmeta.v1.BrokerService/QueryOrigin", request),
    ]


def _call(channel: grpc.Channel, method: str, request, metadata=()) -> grpc.RpcError | None:
    try:
        channel.unary_unary(method, request_serializer=lambda m: m.SerializeToString())(
            request, metadata=list(metadata), timeout=5
        )
    except grpc.RpcError as error:
        if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return error
    return None  # answered (a domain refusal such as NOT_FOUND is an answer)


RPC_PATTERN = re.compile(r"^\s*rpc (\w+)\((stream )?[\w.]+\) returns \((stream )?[\w.]+\)", re.MULTILINE)


def _served(document: dict) -> list[tuple[str, str, bool, bool]]:
    """(address, method path, client streams, server streams) of every method of every
    service each process serves, as its own reflection lists them."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    found = []
    for address in _addresses(document).values():
        with _channel(document, address, _cert(document, "admin")) as channel:
            answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            names = [s.name for answer in answers for s in answer.list_services_response.service]
        assert names, address
        for name in names:
            if name == RMQ_SERVICE:  # its stubs stay out of this process: the rpcs from the proto
                rpcs = [(m, bool(c), bool(r)) for m, c, r in RPC_PATTERN.findall(RMQ_PROTO.read_text())]
            else:
                methods = pool.FindServiceByName(name).methods
                rpcs = [(m.name, m.client_streaming, m.server_streaming) for m in methods]
            found += [(address, f"/{name}/{m}", client, server) for m, client, server in rpcs]
    return found


def test_every_served_method_has_an_access_class(guarded):
    _, document = guarded
    served = _served(document)
    assert len({method for _, method, _, _ in served}) >= 60  # 4 services and health, reflection
    unlisted = sorted({method for _, method, _, _ in served if method not in auth.METHOD_ACCESS})
    assert not unlisted, f"add these to mqmeta.auth's access table: {unlisted}"


def _raw_call(channel: grpc.Channel, method: str, client: bool, server: bool, metadata=()) -> grpc.StatusCode:
    """The status of `method` called with empty requests (OK when it answered)."""
    kind = {(False, False): "unary_unary", (False, True): "unary_stream"}
    kind |= {(True, False): "stream_unary", (True, True): "stream_stream"}
    call = getattr(channel, kind[(client, server)])(method)
    request = iter([b""]) if client else b""
    try:
        answer = call(request, metadata=list(metadata), timeout=CALL_TIMEOUT_S)
        if server:
            for _ in answer:
                break
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_every_method_refuses_whom_its_access_class_refuses(guarded):
    """Each method of each process, of every handler shape (sync or async, streams both
    ways): a caller without an identity is UNAUTHENTICATED unless the method is OPEN; a
    `read` identity is PERMISSION_DENIED exactly on the ADMIN methods (and runs the rest)."""
    data_dir, document = guarded
    stranger, wrong = [], []
    for address, method, client, server in _served(document):
        access = auth.METHOD_ACCESS[method]
        with _channel(document, address, _stranger(data_dir)) as channel:
            code = _raw_call(channel, method, client, server)
        if (code == grpc.StatusCode.UNAUTHENTICATED) == (access is auth.Access.OPEN):
            stranger.append((method, code))
        with _channel(document, address, _cert(document, "client")) as channel:
            code = _raw_call(channel, method, client, server)
        if code == grpc.StatusCode.UNAUTHENTICATED or (
            (code == grpc.StatusCode.PERMISSION_DENIED) != (access is auth.Access.ADMIN)
        ):
            wrong.append((method, code))
    assert not stranger, stranger
    assert not wrong, wrong


def test_reads_need_a_credential_on_every_process(guarded):
    data_dir, document = guarded
    addresses, stranger = _addresses(document), _stranger(data_dir)
    read_token = [
        ("authorization", f"Bearer {Path(document['auth']['read_token_file']).read_text().strip()}")
    ]
    for process, method, request in _reads(document):
        with _channel(document, addresses[process], stranger) as channel:
            refused = _call(channel, method, request)
            assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED, method
            name = method.rsplit("/", 1)[-1]
            assert refused.details() == (
                f"{name} {NEEDS}: pass --token-file "
                "(certificate CN 'mqmeta stranger' is not on this server's allow list)"
            )
            assert _call(channel, method, request, read_token) is None, method
        with _channel(document, addresses[process], _cert(document, "client")) as channel:
            assert _call(channel, method, request) is None, method
    for address in addresses.values():  # health stays open; reflection is a read
        with _channel(document, address, stranger) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            with pytest.raises(grpc.RpcError) as refused:
                list(answers)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with _channel(document, addresses["controller"], stranger) as channel:  # a stream too
        watch = controller_pb2_grpc.ControllerServiceStub(channel).Watch(pb.WatchRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(watch))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_rocketmq_endpoint_needs_a_credential_too(guarded):
    """QueryRoute of apache.rocketmq.v2 on the nameserver and the broker: refused without a
    credential; answered with the official client's signature of the `viewer` identity."""
    data_dir, document = guarded
    stranger = _stranger(data_dir)
    read_token = Path(document["auth"]["read_token_file"]).read_text().strip()
    signed = _official_signature("viewer", read_token)
    wrong = _official_signature("viewer", read_token + "x")
    method = "/apache.rocketmq.v2.MessagingService/QueryRoute"
    for process in ("namesrv", "broker"):
        with _channel(document, _addresses(document)[process], stranger) as channel:
            call = channel.unary_unary(method)
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", metadata=wrong, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert (
                "the RocketMQ credentials (AccessKey, SecretKey) match no identity" in refused.value.details()
            )
            assert isinstance(call(b"", metadata=signed, timeout=5), bytes)  # its own status inside


def _official_signature(access_key: str, secret_key: str) -> list[tuple[str, str]]:
    """The metadata the official RocketMQ 5 Python client signs its calls with (computed by
    its own code, in a child process: it must not share a process with mqmeta's stubs)."""
    script = (
        "import json, sys, types\n"
        "from tests.support.rmq_client import client\n"
        "client()\n"
        "from rocketmq.v5.util.signature import Signature\n"
        "credentials = types.SimpleNamespace(ak=sys.argv[1], sk=sys.argv[2])\n"
        "config = types.SimpleNamespace(credentials=credentials, namespace='')\n"
        "print(json.dumps(Signature.metadata(config, 'auth-test-client')))\n"
    )
    made = subprocess.run(
        [sys.executable, "-c", script, access_key, secret_key], capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0, made.stderr
    return [tuple(pair) for pair in json.loads(made.stdout)]


def test_every_client_works_when_reads_need_a_credential(guarded, tmp_path):
    data_dir, document = guarded
    sites = document["clusters"]
    for site in sites:  # brokers registered with node.pem, and each slave fetches from its master
        controllers = site["controllers"][0]["grpc"]

        def in_sync(controllers: str = controllers, site: dict = site) -> bool:
            shown = run(
                "admin", "--controllers", controllers, "sync-state", "--cluster", site["name"],
                "--broker-name", "broker-a", "--json", *_flags(document, "client"),
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            return len(json.loads(shown.stdout)["sync_state_set"]) == 2

        wait_for(
            in_sync, IN_SYNC_TIMEOUT_S, f"both replicas of cluster {site['name']} in sync", interval_s=0.3
        )
        created = run(
            "admin", "--controllers", controllers, "topic", "create", "Guarded", "--cluster", site["name"],
            "--queues", "2", *_flags(document, "admin"),
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        listed = run(
            "admin", "--controllers", controllers, "topic", "list", "--json", *_flags(document, "client")
        )
        assert listed.returncode == 0 and "Guarded" in listed.stdout, listed.stderr
    source, target = (site["namesrv"][0]["grpc"] for site in sites)
    sent = run(
        "produce",
        "--namesrv",
        source,
        "--topic",
        "Guarded",
        "--count",
        str(SENT),
        *_flags(document, "client"),
    )
    assert sent.returncode == 0 and f"acknowledged {SENT}, failed 0" in sent.stdout, sent.stderr
    record = tmp_path / "received.jsonl"

    def received() -> int:  # copied by the replicator (node.pem), consumed with client.pem
        consume = [
            "consume",
            "--namesrv",
            target,
            "--topic",
            "Guarded",
            "--group",
            "g",
            "--until-idle",
            "0.5",
        ]
        done = run(*consume, "--record", str(record), *_flags(document, "client"))
        assert done.returncode == 0, done.stderr
        return len(record.read_text().splitlines()) if record.exists() else 0

    wait_for(received, REPLICATE_TIMEOUT_S, f"{SENT} copies at b", until=lambda n: n >= SENT, interval_s=0.5)
    stranger = _stranger(data_dir)
    anonymous = ["--tls-ca", document["tls"]["ca"], "--tls-cert", stranger[0], "--tls-key", stranger[1]]
    refused = run("admin", "--controllers", sites[0]["controllers"][0]["grpc"], "topic", "list", *anonymous)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("mqmeta: error: ListTopics " + NEEDS)


def test_a_refused_write_changes_nothing(guarded):
    data_dir, document = guarded
    addresses, stranger = _addresses(document), _stranger(data_dir)
    with _channel(document, addresses["broker"], _cert(document, "client")) as channel:
        status = broker_pb2_grpc.BrokerServiceStub(channel).GetHaStatus(
            broker_pb2.HaStatusRequest(), timeout=5
        )
    master = next(b["grpc"] for b in document["brokers"] if b["broker_id"] == status.master_broker_id)
    message = broker_pb2.Message(topic="Guarded", queue_id=0, body=b"refused")

    def offsets(address: str) -> tuple[int, int]:
        with _channel(document, address, _cert(document, "client")) as channel:
            found = broker_pb2_grpc.BrokerServiceStub(channel).GetHaStatus(
                broker_pb2.HaStatusRequest(), timeout=5
            )
        return found.max_offset, found.confirm_offset

    before = offsets(master)
    with _channel(document, master, stranger) as channel:
        refused = _call(channel, "/mqmeta.v1.BrokerService/Send", broker_pb2.SendRequest(messages=[message]))
    assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert offsets(master) == before
    with _channel(document, addresses["controller"], _cert(document, "client")) as channel:
        stub = controller_pb2_grpc.ControllerServiceStub(channel)
        digest = stub.GetMetadata(pb.GetMetadataRequest(), timeout=5).state_digest
        with pytest.raises(grpc.RpcError) as denied:
            stub.CreateTopic(pb.TopicSpec(name="NotByReaders", queue_count=1), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert stub.GetMetadata(pb.GetMetadataRequest(), timeout=5).state_digest == digest


def test_bad_authorization_settings_exit_2_with_one_sentence(tmp_path):
    """Settings that cannot work are refused at startup, as flags or as --config keys:
    --anonymous-reads without an allow list, certificate lines without mutual TLS, a
    malformed line; `local up --anonymous-reads` without --auth."""
    allow = tmp_path / "allow"
    allow.write_text("nodes admin cn:mqmeta node\n")
    bad = tmp_path / "bad"
    bad.write_text("viewer reader tok\n")
    config = tmp_path / "c1.toml"
    config.write_text("anonymous_reads = true\n")
    node = ["controller", "--id", "c1", "--grpc", "127.0.0.1:0", "--raft", "127.0.0.1:0"]
    node += ["--data-dir", str(tmp_path / "c1")]
    cases = [
        ([*node, "--config", str(config)], "--anonymous-reads needs --auth-file"),
        ([*node, "--auth-file", str(allow)], "lists certificate identities (cn:), which need mutual TLS"),
        ([*node, "--auth-file", str(bad)], "line 1: expected NAME ROLE TOKEN or NAME ROLE cn:CN"),
        (
            ["local", "up", "--data-dir", str(tmp_path / "local"), "--anonymous-reads"],
            "--anonymous-reads needs --auth",
        ),
    ]
    for args, why in cases:
        done = run(*args)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_the_commented_security_keys_of_the_deploy_samples_are_known_keys(tmp_path):
    """Uncommented, the TLS and authorization keys of every sample in deploy/ load (a typo
    there would only show on the day an operator turns them on)."""
    from mqmeta import cli
    from mqmeta.config_file import apply_config_file

    deploy = Path(__file__).resolve().parent.parent / "deploy"
    commented = re.compile(r"^# ((?:tls|auth|token|anonymous)_\w+ = .*)$", re.MULTILINE)
    samples = sorted(deploy.glob("*/*.toml")) + [deploy / "replicator.toml"]
    for path in samples:
        text, count = commented.subn(r"\1", path.read_text())
        assert count >= 4, path
        command = next(c for c in ("controller", "namesrv", "broker", "replicator") if c in path.name)
        sample = tmp_path / path.name
        sample.write_text(text)
        args = apply_config_file(cli.build_parser().parse_args([command, "--config", str(sample)]))
        assert args.tls_ca == Path("/etc/mqmeta/ca.pem"), path
        if command != "replicator":
            assert args.anonymous_reads is False and args.auth_file == Path("/etc/mqmeta/allow"), path


# --- tokens only (plaintext), with the official RocketMQ 5 client ------------------------

OFFICIAL_SEND = """
import sys
from tests.support.rmq_client import client
rmq = client()
namesrv, access_key, secret_key, topic = sys.argv[1:]
config = rmq.ClientConfiguration(namesrv, rmq.Credentials(access_key, secret_key), request_timeout=3)
producer = rmq.Producer(config, (topic,))
producer.startup()
try:
    message = rmq.Message()
    message.topic, message.body = topic, b"signed"
    print("sent", producer.send(message).message_id)
finally:
    producer.shutdown()
"""


@pytest.fixture(scope="module")
def tokens_only(tmp_path_factory):
    """`local up --auth` without TLS: every process sends the admin token."""
    data_dir = tmp_path_factory.mktemp("auth-plain") / "local"
    flags = ["--auth", "--controllers", "1", "--replicas", "1"]
    with local_up(data_dir, *flags, timeout_s=LOCAL_UP_READY_TIMEOUT_S) as document:
        yield document


def test_tokens_alone_and_the_official_client_with_credentials(tokens_only):
    """Without TLS the tokens are the credentials: the brokers registered with the admin
    token, the CLI produces with the read token and is refused without one, and the
    official RocketMQ 5 client sends with Credentials(identity name, its token) and fails
    with a wrong SecretKey or none."""
    document = tokens_only
    auth_files = document["auth"]
    controllers, namesrv = document["controllers"][0]["grpc"], document["namesrv"][0]["grpc"]
    assert all(b["broker_id"] for b in document["brokers"])  # registered with the admin token
    created = run(
        "admin", "--controllers", controllers, "topic", "create", "Signed", "--message-type", "NORMAL",
        "--token-file", auth_files["admin_token_file"],
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    produce = ["produce", "--namesrv", namesrv, "--topic", "Signed", "--count", "3"]
    sent = run(*produce, "--token-file", auth_files["read_token_file"])
    assert sent.returncode == 0 and "acknowledged 3, failed 0" in sent.stdout, sent.stderr
    refused = run(*produce)
    assert refused.returncode != 0 and "QueryRoute " + NEEDS in refused.stderr, refused.stderr
    read_token = Path(auth_files["read_token_file"]).read_text().strip()
    for access_key, secret_key, works in [
        ("viewer", read_token, True),
        ("viewer", "wrong", False),
        ("", "", False),
    ]:
        official = subprocess.run(
            [sys.executable, "-c", OFFICIAL_SEND, namesrv, access_key, secret_key, "Signed"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (official.returncode == 0 and "sent " in official.stdout) == works, (
            access_key,
            official.stderr,
        )


def test_admin_writes_on_messages_need_the_admin_role(tokens_only):
    """The brokers' admin writes (ResendMessage, ResetOffsets) refuse a `read` identity
    with PERMISSION_DENIED and a sentence; the reads beside them (GetGroupLag) answer it."""
    document = tokens_only
    auth_files = document["auth"]
    controllers = document["controllers"][0]["grpc"]
    read_token = ["--token-file", auth_files["read_token_file"]]
    lag = run("admin", "--controllers", controllers, "group", "lag", "g-auth", "--json", *read_token)
    assert lag.returncode == 0 and json.loads(lag.stdout)["backlog"] == 0, lag.stderr
    reset = run(
        "admin", "--controllers", controllers, "group", "reset-offsets", "g-auth", "--earliest", *read_token
    )
    assert reset.returncode == 2 and "ResetOffsets refused" in reset.stderr, reset.stderr
    assert "may only read" in reset.stderr, reset.stderr
    assert len(reset.stderr.strip().splitlines()) == 1, reset.stderr
