"""RocketMQ 4.x ACL on the remoting listeners: the AccessKey/Signature extFields checked
against the server's --auth-file (AccessKey = identity name, SecretKey = its token).

Properties checked:
- the signature the real C++ client (rocketmq-client-python 2.0.0, set_session_credentials)
  puts on a request is accepted for its identity, and refused when the secret differs;
- a server with --auth-file (one `mqmeta namesrv --embed-controller` process) answers an
  unsigned or wrongly signed request NO_PERMISSION with a remark naming why, a rightly
  signed one normally; a route is anonymous with --anonymous-reads.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import threading

import pytest

from mqmeta import auth
from mqmeta.codec import remoting as codec
from tests.support import wait_for
from tests.support.remoting_clients import client
from tests.support.remoting_namesrv import remoting_namesrv

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cret-token"


def _read(sock: socket.socket) -> codec.Command:
    prefix = sock.recv(4, socket.MSG_WAITALL)
    return codec.decode_frame(sock.recv(codec.frame_length(prefix), socket.MSG_WAITALL))


def _signed(command: codec.Command, access_key: str, secret: str) -> codec.Command:
    ext = {**command.ext, "AccessKey": access_key, "OnsChannel": "ALIYUN"}
    content = "".join(v for _, v in sorted(ext.items())).encode() + command.body
    ext["Signature"] = base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()
    return codec.Command(command.code, command.opaque, command.flag, "", ext, command.body)


def test_the_cpp_clients_signature_is_checked(tmp_path):
    captured: list[codec.Command] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:  # a nameserver that only listens
        address = f"127.0.0.1:{listener.getsockname()[1]}"

        def capture() -> None:
            connection, _ = listener.accept()
            with connection:
                captured.append(_read(connection))

        thread = threading.Thread(target=capture, daemon=True)
        thread.start()
        rocketmq = client("rocketmq-client-python", tmp_path / "home")
        producer = rocketmq.stream(
            tmp_path / "out.jsonl", "produce-signed", address, "AclTopic", "app", SECRET
        )
        try:
            wait_for(lambda: captured, 30, "the client's first request")
        finally:
            producer.kill()
            producer.wait()
    (request,) = captured
    assert request.ext["AccessKey"] == "app" and request.ext["Signature"]
    try:
        auth.configure({SECRET: auth.Identity("app", "read")})
        assert auth.remoting_refusal(request.ext, request.body, read_only=False) is None
        auth.configure({"other-secret": auth.Identity("app", "read")})
        refused = auth.remoting_refusal(request.ext, request.body, read_only=False)
        assert refused is not None and "matches no identity" in refused
    finally:
        auth.configure(None)


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl")
    allow = root / "allow"
    allow.write_text(f"app read {SECRET}\n")
    with remoting_namesrv(root, ["--auth-file", str(allow)]) as remoting:
        yield remoting


def _call(address: str, command: codec.Command) -> codec.Command:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(codec.encode(command))
        return _read(sock)


def test_unsigned_and_wrongly_signed_requests_are_refused(namesrv):
    route = codec.Command(codec.GET_ROUTEINFO_BY_TOPIC, 7, ext={"topic": "Nope"})
    unsigned = _call(namesrv, route)
    assert unsigned.code == codec.NO_PERMISSION and unsigned.opaque == 7
    assert "AccessKey" in unsigned.remark
    wrong = _call(namesrv, _signed(route, "app", "not-the-secret"))
    assert wrong.code == codec.NO_PERMISSION and "matches no identity" in wrong.remark
    stranger = _call(namesrv, _signed(route, "nobody", SECRET))
    assert stranger.code == codec.NO_PERMISSION
    signed = _call(namesrv, _signed(route, "app", SECRET))
    assert signed.code == codec.TOPIC_NOT_EXIST  # past the check: the topic is unknown
