"""TLS on every gRPC port, and admin writes behind a bearer token, on a real
`mqmeta local up --tls --auth` cluster (one for the module).

Properties checked:
- a TLS cluster (mutual TLS) elects a broker master, its slave replicates over TLS (the
  SyncStateSet holds both), and the CLI creates a topic and sends with --tls-ca and the
  client certificate; the controller client library works in-process over TLS;
- refusals: a plaintext client, a client trusting another CA, and (mutual TLS) a client
  without a certificate are refused as UNAVAILABLE, with a sentence that says why;
- grpc health and reflection still answer over TLS;
- key files are mode 0600 and cluster.json lists paths, never a key's contents;
- bad certificate files (missing, not PEM, key not matching) exit 2 with one sentence,
  for a client and for a server, given as flags or as keys of a --config file;
- no server or channel of the product skips mqmeta/tls.py;
- (`--auth`) admin writes without a bearer token or with an unknown one are
  UNAUTHENTICATED, with a read-only identity's token PERMISSION_DENIED, with the admin
  token done; reads stay anonymous (`--anonymous-reads`: opt-in); no token reaches a log or cluster.json;
- mTLS identities on the allow list: the admin certificate writes without a token, the
  client certificate (a `read` identity) is PERMISSION_DENIED, a certificate of the same CA
  that the list does not name is UNAUTHENTICATED, each naming the CN; a refused write
  changes nothing; a token sent with a certificate decides alone; metadata cannot claim a
  certificate identity; a certificate of another CA is refused at the handshake;
- the brokers (and every other process) run with no token file: they register and are
  elected on node.pem's identity.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from mqmeta.cluster.certs import LocalCerts, ensure_local_certs, issue_certificate

from mqmeta import tls
from mqmeta.client import ControllerClient
from mqmeta.pb import controller_pb2 as pb
from tests.support import wait_for
from tests.support.local_up import local_up

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]
MQMETA = [sys.executable, "-m", "mqmeta.cli"]
LOCAL_UP_READY_TIMEOUT_S = 45.0
REPO = Path(__file__).resolve().parent.parent


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*MQMETA, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tls") / "local"
    flags = ["--tls", "--auth", "--anonymous-reads", "--replicas", "2"]
    with local_up(data_dir, *flags, timeout_s=LOCAL_UP_READY_TIMEOUT_S) as document:
        yield data_dir, document


def _client_flags(document: dict) -> list[str]:
    paths = document["tls"]
    return ["--tls-ca", paths["ca"], "--tls-cert", paths["client_cert"], "--tls-key", paths["client_key"]]


def _controllers(document: dict) -> str:
    return ",".join(c["grpc"] for c in document["controllers"])


def test_tls_cluster_elects_replicates_and_takes_sends(tls_cluster):
    _, document = tls_cluster
    flags, controllers = _client_flags(document), _controllers(document)
    assert sorted(b["broker_id"] for b in document["brokers"]) == [1, 2]

    def in_sync() -> dict | None:
        shown = run(
            "admin", "--controllers", controllers, "sync-state", "--broker-name", "broker-a", "--json", *flags
        )
        assert shown.returncode == 0, shown.stderr
        state = json.loads(shown.stdout)
        return state if state["master_broker_id"] and len(state["sync_state_set"]) == 2 else None

    # the slave replicates from the master over mutual TLS, or it never joins the set
    state = wait_for(in_sync, 30.0, "a master and its slave in the SyncStateSet", interval_s=0.3)
    assert state["master_epoch"] >= 1
    token = ["--token-file", document["auth"]["admin_token_file"]]
    created = run(
        "admin", "--controllers", controllers, "topic", "create", "Secure", "--json", *flags, *token
    )
    assert created.returncode == 0, created.stderr
    namesrv = document["namesrv"][0]["grpc"]
    sent = run("produce", "--namesrv", namesrv, "--topic", "Secure", "--count", "20", *flags)
    assert sent.returncode == 0, sent.stderr
    assert "acknowledged 20, failed 0" in sent.stdout


def test_controller_client_library_over_tls(tls_cluster):
    _, document = tls_cluster
    paths = document["tls"]
    tls.configure(
        tls.load(cert=Path(paths["client_cert"]), key=Path(paths["client_key"]), ca=Path(paths["ca"]))
    )
    try:
        with ControllerClient(_controllers(document)) as client:
            meta = client.call("GetMetadata", pb.GetMetadataRequest())
        assert meta.leader_id in {c["id"] for c in document["controllers"]}
    finally:
        tls.configure(None)


@pytest.mark.parametrize(
    ("who", "why"),
    [
        ("plaintext", "the server may want TLS: pass --tls-ca"),
        ("other-ca", "not signed by the CA of --tls-ca"),
        ("no-client-cert", "the server may want a client certificate"),
    ],
)
def test_clients_without_the_right_credentials_are_refused(tls_cluster, tmp_path, who, why):
    data_dir, document = tls_cluster
    other = ensure_local_certs(tmp_path / "other", "another CA")
    flags = {
        "plaintext": [],
        "other-ca": ["--tls-ca", str(other.ca), "--tls-cert", str(other.client_cert)]
        + ["--tls-key", str(other.client_key)],
        "no-client-cert": ["--tls-ca", document["tls"]["ca"]],
    }[who]
    controller = document["controllers"][0]["grpc"]  # one node: the refusal comes fast
    refused = run("admin", "--controllers", controller, "--timeout", "1.5", "topic", "list", *flags)
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("mqmeta: error: ") and why in last, refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_plaintext_producer_is_told_why(tls_cluster):
    _, document = tls_cluster
    sent = run("produce", "--namesrv", document["namesrv"][0]["grpc"], "--topic", "Secure", "--count", "1")
    assert sent.returncode != 0 and "acknowledged" not in sent.stdout  # it stops at its first send
    assert "the server may want TLS: pass --tls-ca" in sent.stderr, sent.stderr


def test_a_plaintext_channel_gets_unavailable(tls_cluster):
    _, document = tls_cluster
    with grpc.insecure_channel(document["controllers"][0]["grpc"]) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def _secure_channel(document: dict, address: str, cert: tuple[str, str] | None = None) -> grpc.Channel:
    """A mutual TLS channel with the client certificate (or `cert`: (cert path, key path))."""
    paths = document["tls"]
    cert_path, key_path = cert or (paths["client_cert"], paths["client_key"])
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(paths["ca"]).read_bytes(),
        private_key=Path(key_path).read_bytes(),
        certificate_chain=Path(cert_path).read_bytes(),
    )
    return grpc.secure_channel(address, credentials)


def test_health_and_reflection_answer_over_tls(tls_cluster):
    _, document = tls_cluster
    for address in [
        document["controllers"][0]["grpc"],
        document["namesrv"][0]["grpc"],
        document["brokers"][0]["grpc"],
    ]:
        with _secure_channel(document, address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
            names = {s.name for answer in answers for s in answer.list_services_response.service}
            assert "grpc.health.v1.Health" in names, names


def test_key_files_are_private_and_cluster_json_holds_paths_only(tls_cluster):
    data_dir, document = tls_cluster
    for key in (data_dir / "tls").glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    text = (data_dir / "cluster.json").read_text()
    assert "PRIVATE KEY" not in text and "BEGIN" not in text
    assert Path(document["tls"]["ca"]) == data_dir / "tls" / "ca.pem"


def test_bad_certificate_files_exit_2_with_one_sentence(tmp_path):
    certs: LocalCerts = ensure_local_certs(tmp_path / "a")
    other = ensure_local_certs(tmp_path / "b")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    missing = tmp_path / "missing.pem"
    cases = [
        (["--tls-ca", str(missing)], "cannot read it"),
        (["--tls-ca", str(not_pem)], "is not a PEM certificate"),
        (["--tls-cert", str(certs.client_cert), "--tls-key", str(not_pem)], "is not an unencrypted PEM"),
        (["--tls-cert", str(certs.client_cert), "--tls-key", str(other.client_key)], "does not match"),
        (["--tls-cert", str(certs.client_cert)], "go together"),
    ]
    for flags, why in cases:
        client = run("admin", "--controllers", "127.0.0.1:1", "topic", "list", *flags)
        assert client.returncode == 2 and why in client.stderr, (flags, client.stderr)
        assert client.stderr.count("\n") == 1 and "Traceback" not in client.stderr
    server = run(
        "controller", "--id", "c1", "--grpc", "127.0.0.1:0", "--raft", "127.0.0.1:0",
        "--data-dir", str(tmp_path / "c1"),
        "--tls-cert", str(certs.node_cert), "--tls-key", str(other.node_key),
    )  # fmt: skip
    assert server.returncode == 2 and "does not match" in server.stderr, server.stderr
    config = tmp_path / "replicator.toml"  # a --config file gives the TLS flags as keys too
    config.write_text(f'[replicator]\ntls_ca = "{missing}"\n')
    from_file = run("replicator", "--config", str(config))
    assert from_file.returncode == 2 and f"--tls-ca {missing}: cannot read it" in from_file.stderr, (
        from_file.stderr
    )


def test_server_tls_without_client_certificates(tmp_path):
    """Without --tls-client-ca a TLS server takes any client that trusts its CA, with a
    certificate or without; a plaintext client is still refused."""
    from concurrent.futures import ThreadPoolExecutor

    from mqmeta.rpc import add_health_and_reflection

    certs = ensure_local_certs(tmp_path / "ca")
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    tls.configure(tls.load(cert=certs.node_cert, key=certs.node_key))
    try:
        port = tls.add_port(server, "127.0.0.1:0")
    finally:
        tls.configure(None)
    add_health_and_reflection(server, [])
    server.start()
    request = health_pb2.HealthCheckRequest()
    try:
        for config in (
            tls.load(ca=certs.ca),
            tls.load(ca=certs.ca, cert=certs.client_cert, key=certs.client_key),
        ):
            tls.configure(config)
            with tls.channel(f"127.0.0.1:{port}") as channel:
                answer = health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        tls.configure(None)
        with tls.channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        tls.configure(None)
        server.stop(0)


def test_every_server_and_channel_goes_through_the_tls_module():
    pattern = re.compile(r"insecure_channel\(|add_insecure_port\(|secure_channel\(|add_secure_port\(")
    offenders = []
    for package in ("mqmeta", "controller", "broker_agent", "cluster", "replicator", "chaos", "spark"):
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "mqmeta" / "tls.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert not offenders, f"use mqmeta.tls.channel / add_port instead: {offenders}"


def _token_metadata(path: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {Path(path).read_text().strip()}")]


def _stranger(data_dir: Path) -> tuple[str, str]:
    """A client certificate of the cluster's CA whose CN no allow list names."""
    cert, key = issue_certificate(data_dir / "tls", "stranger", "mqmeta stranger")
    return str(cert), str(key)


def _leader(document: dict) -> str:
    from mqmeta.pb import controller_pb2_grpc

    with _secure_channel(document, document["controllers"][0]["grpc"]) as channel:
        meta = controller_pb2_grpc.ControllerServiceStub(channel).GetMetadata(
            pb.GetMetadataRequest(), timeout=5
        )
    return next(c["grpc"] for c in document["controllers"] if c["id"] == meta.leader_id)


def test_admin_writes_need_a_bearer_token_of_an_admin(tls_cluster):
    data_dir, document = tls_cluster
    from mqmeta.pb import broker_pb2, broker_pb2_grpc, controller_pb2_grpc

    leader = _leader(document)
    read, admin = document["auth"]["read_token_file"], document["auth"]["admin_token_file"]
    expected = [  # on a channel whose certificate no allow list names: the token decides
        ([], grpc.StatusCode.UNAUTHENTICATED),
        ([("authorization", "Bearer not-a-known-token")], grpc.StatusCode.UNAUTHENTICATED),
        (_token_metadata(read), grpc.StatusCode.PERMISSION_DENIED),
    ]
    stranger = _stranger(data_dir)
    with _secure_channel(document, leader, stranger) as channel:
        stub = controller_pb2_grpc.ControllerServiceStub(channel)
        for metadata, code in expected:
            with pytest.raises(grpc.RpcError) as refused:
                stub.CreateTopic(pb.TopicSpec(name="Guarded", queue_count=1), metadata=metadata, timeout=5)
            assert refused.value.code() == code and refused.value.details(), metadata
        listed = stub.ListTopics(pb.ListTopicsRequest(), timeout=5)  # anonymous: --anonymous-reads
        assert "Guarded" not in {t.name for t in listed.topics}  # a refused write changed nothing
        stub.CreateTopic(
            pb.TopicSpec(name="Guarded", queue_count=1), metadata=_token_metadata(admin), timeout=5
        )
    with _secure_channel(document, document["brokers"][0]["grpc"]) as channel:  # handoff too
        with pytest.raises(grpc.RpcError) as refused:
            broker_pb2_grpc.BrokerServiceStub(channel).Handoff(
                broker_pb2.HandoffRequest(), metadata=_token_metadata(read), timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    flags = ["--tls-ca", document["tls"]["ca"], "--tls-cert", stranger[0], "--tls-key", stranger[1]]
    refused_cli = run("admin", "--controllers", leader, "topic", "delete", "Guarded", *flags)
    assert refused_cli.returncode == 2 and "needs a bearer token: pass --token-file" in refused_cli.stderr
    assert "certificate CN 'mqmeta stranger' is not on this server's allow list" in refused_cli.stderr
    secrets_ = [Path(p).read_text().strip() for p in (read, admin)]
    for path in [data_dir / "cluster.json", *(data_dir / "logs").glob("*.log")]:
        text = path.read_text(errors="replace")
        assert not any(secret in text for secret in secrets_), path


def _create(
    document: dict, leader: str, name: str, cert: tuple[str, str], metadata=()
) -> grpc.RpcError | None:
    """CreateTopic `name` over a channel with client certificate `cert`: the error, or None."""
    from mqmeta.pb import controller_pb2_grpc

    with _secure_channel(document, leader, cert) as channel:
        try:
            controller_pb2_grpc.ControllerServiceStub(channel).CreateTopic(
                pb.TopicSpec(name=name, queue_count=1), metadata=list(metadata), timeout=5
            )
        except grpc.RpcError as error:
            return error
    return None


def _topics(document: dict, leader: str) -> set[str]:
    from mqmeta.pb import controller_pb2_grpc

    with _secure_channel(document, leader) as channel:
        listed = controller_pb2_grpc.ControllerServiceStub(channel).ListTopics(
            pb.ListTopicsRequest(), timeout=5
        )
    return {t.name for t in listed.topics}


def test_a_client_certificate_on_the_allow_list_is_an_identity(tls_cluster):
    """mTLS identities: the admin certificate writes without a token, the client
    certificate (a `read` identity) is PERMISSION_DENIED, a certificate of the same CA that
    the allow list does not name is UNAUTHENTICATED, each refusal naming the CN; a refused
    write changes nothing."""
    data_dir, document = tls_cluster
    leader, paths = _leader(document), document["tls"]
    admin_cert = (paths["admin_cert"], paths["admin_key"])
    client_cert = (paths["client_cert"], paths["client_key"])
    assert _create(document, leader, "ByAdminCert", admin_cert) is None
    denied = _create(document, leader, "ByClientCert", client_cert)
    assert denied is not None and denied.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (
        denied.details()
        == "CreateTopic refused: identity clients (certificate CN 'mqmeta client') may only read"
    )
    unknown = _create(document, leader, "ByStranger", _stranger(data_dir))
    assert unknown is not None and unknown.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "certificate CN 'mqmeta stranger' is not on this server's allow list" in unknown.details()
    topics = _topics(document, leader)
    assert "ByAdminCert" in topics and not {"ByClientCert", "ByStranger"} & topics
    # the CLI: the admin certificate alone is enough
    flags = ["--tls-ca", paths["ca"], "--tls-cert", paths["admin_cert"], "--tls-key", paths["admin_key"]]
    deleted = run("admin", "--controllers", leader, "topic", "delete", "ByAdminCert", *flags)
    assert deleted.returncode == 0, deleted.stderr


def test_a_token_wins_over_the_certificate_and_metadata_cannot_claim_one(tls_cluster):
    """A token sent with an admin certificate decides alone (a read token: PERMISSION_DENIED;
    an unknown one: UNAUTHENTICATED, no fallback to the certificate); metadata that names a
    certificate identity is not one (only the TLS handshake's verified peer certificate is)."""
    data_dir, document = tls_cluster
    leader, paths = _leader(document), document["tls"]
    admin_cert = (paths["admin_cert"], paths["admin_key"])
    read = _token_metadata(document["auth"]["read_token_file"])
    with_read_token = _create(document, leader, "TokenWins", admin_cert, read)
    assert with_read_token is not None and with_read_token.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "identity viewer may only read" in with_read_token.details()
    unknown = _create(document, leader, "TokenWins", admin_cert, [("authorization", "Bearer nope")])
    assert unknown is not None and unknown.code() == grpc.StatusCode.UNAUTHENTICATED
    spoofed = [("x509_common_name", "mqmeta admin"), ("x-client-cert-cn", "mqmeta admin")]
    claimed = _create(document, leader, "TokenWins", _stranger(data_dir), spoofed)
    assert claimed is not None and claimed.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "TokenWins" not in _topics(document, leader)


def test_a_certificate_of_another_ca_is_refused_at_the_handshake(tls_cluster, tmp_path):
    """A client that trusts the cluster's CA but presents a certificate another CA signed
    (even with an admin CN) never reaches the servicer: UNAVAILABLE, no status of ours."""
    _, document = tls_cluster
    other = ensure_local_certs(tmp_path / "other", "another CA")  # its admin.pem: CN "mqmeta admin"
    error = _create(document, _leader(document), "OtherCa", (str(other.admin_cert), str(other.admin_key)))
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE


def test_brokers_register_by_certificate_without_a_token_file(tls_cluster):
    """`local up --tls --auth` gives its processes no token: the brokers registered, were
    elected and replicate (test_tls_cluster_elects_replicates_and_takes_sends) on the
    strength of node.pem (CN `mqmeta node`, an admin on the allow list)."""
    data_dir, document = tls_cluster
    for process in [*document["brokers"], *document["controllers"], *document["namesrv"]]:
        command = Path(f"/proc/{process['pid']}/cmdline").read_bytes().split(b"\0")
        assert b"--token-file" not in command and b"--auth-file" in command, command
    assert "cn:mqmeta node" in Path(document["auth"]["auth_file"]).read_text()
    assert all(b["broker_id"] for b in document["brokers"])  # registered: the controller gave ids
