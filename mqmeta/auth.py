"""Who may call what: bearer tokens and client certificates, checked by a server interceptor.

Servers started with `--auth-file FILE` read one identity a line (`#` starts a comment):

    NAME ROLE TOKEN           a bearer token (`authorization: Bearer TOKEN`)
    NAME ROLE cn:COMMON NAME  a client certificate whose subject CN is exactly COMMON NAME
                              (the rest of the line; mutual TLS only: --tls-client-ca)

ROLE is `admin` or `read`. Every method has an access class in METHOD_ACCESS (the one
table: add a new RPC there): ADMIN needs an admin identity; READ and DATA need any listed
identity, unless the server takes `--anonymous-reads` (anonymous reads are opt-in); OPEN
(health checks) is never checked. A method missing from the table is ADMIN (fail closed).

A call's identity: the bearer token when the call carries an `authorization` header (a
token the file does not list is refused, never replaced by the certificate: an explicit
credential that is wrong is an error); otherwise, on a mutual TLS port, the verified peer
certificate's CN, read from gRPC's auth context (the TLS handshake, never from metadata);
otherwise none. RocketMQ 5 clients' own signature (`MQv2-HMAC-SHA1`, AccessKey = NAME,
SecretKey = TOKEN) counts as that token identity.

Refusals: no identity, or a credential the file does not list, is UNAUTHENTICATED; a
`read` identity calling an ADMIN method is PERMISSION_DENIED; each with one sentence that
names the identity or the certificate's CN, never a token. Clients send
`authorization: Bearer TOKEN` on every call when started with `--token-file FILE` (the
token on its first line); every channel made by mqmeta.tls carries it, and carries the
process's certificate (--tls-cert) when it dials with TLS.
"""

from __future__ import annotations

import argparse
import base64
import collections
import enum
import hashlib
import hmac
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqmeta.errors import InvalidArgument


class Access(enum.Enum):
    OPEN = "open"  # never checked
    READ = "read"  # any listed identity; anonymous only with --anonymous-reads
    DATA = "data"  # producing and consuming: checked like READ (no per-topic permissions)
    ADMIN = "admin"  # an admin identity whenever the server takes --auth-file


_A, _R, _D, _O = Access.ADMIN, Access.READ, Access.DATA, Access.OPEN
# Every method of every service a process serves. A new RPC goes here (a method missing
# is ADMIN, and tests/test_auth.py fails until every served method is listed).
_ACCESS_BY_SERVICE: dict[str, dict[str, Access]] = {
    "mqmeta.v1.ControllerService": {
        # admin writes
        **dict.fromkeys(
            ["CreateTopic", "UpdateTopic", "DeleteTopic", "CreateGroup", "UpdateGroup", "DeleteGroup"], _A
        ),
        **dict.fromkeys(["UpdateConfig", "ElectMaster", "CleanBrokerData", "Write"], _A),
        # a broker's own writes: the cluster credential keeps a stranger from registering a
        # broker, faking its liveness or moving its checkpoints
        **dict.fromkeys(
            ["RegisterBroker", "GetNextBrokerId", "Heartbeat", "HeartbeatStream", "AlterSyncStateSet"], _A
        ),
        **dict.fromkeys(["TieredUploadStart", "TieredCommit", "TieredForgetAbandoned"], _A),
        # a replicator worker's: leases and checkpoints of cross-cluster tasks
        **dict.fromkeys(["ReplicatorHeartbeat", "CommitReplicatorTask"], _A),
        # reads (Watch: the nameservers' route copies)
        **dict.fromkeys(["GetReplicaInfo", "GetSyncStateData", "GetMetadata", "ListBrokerSets"], _R),
        **dict.fromkeys(["ListTopics", "GetTopicRoute", "ListGroups", "GetConfig"], _R),
        **dict.fromkeys(
            ["GetTieredCheckpoint", "GetReplicatorStatus", "Watch", "WatchBatched", "GetCommandHistory"], _R
        ),
    },
    "mqmeta.v1.NameServer": dict.fromkeys(["QueryRoute", "GetClusterInfo", "ListTopics"], _R),
    "mqmeta.v1.BrokerService": {
        "Handoff": _A,
        **dict.fromkeys(["Send", "Pull", "CommitOffset"], _D),
        # HaFetch: a slave replicating from its master (brokers dial with their certificate)
        **dict.fromkeys(["QueryOffset", "GetEpochCache", "GetHaStatus", "HaFetch"], _R),
        **dict.fromkeys(["QueryOrigin", "ListConsumerOffsets"], _R),
        # admin calls (broker_agent/admin.py): reads, and two writes
        **dict.fromkeys(["QueryMessages", "TraceMessage", "GetGroupLag"], _R),
        **dict.fromkeys(["ResendMessage", "ResetOffsets"], _A),
    },
    "apache.rocketmq.v2.MessagingService": {
        **dict.fromkeys(["QueryRoute", "QueryAssignment", "GetOffset", "QueryOffset"], _R),
        **dict.fromkeys(["Heartbeat", "NotifyClientTermination", "Telemetry", "SendMessage"], _D),
        **dict.fromkeys(["ReceiveMessage", "AckMessage", "ChangeInvisibleDuration", "PullMessage"], _D),
        **dict.fromkeys(["ForwardMessageToDeadLetterQueue", "EndTransaction", "UpdateOffset"], _D),
        **dict.fromkeys(["RecallMessage", "SyncLiteSubscription"], _D),
    },
    # probes (a kubelet's gRPC probe sends no credential); with mutual TLS the handshake
    # still wants a client certificate
    "grpc.health.v1.Health": dict.fromkeys(["Check", "Watch", "List"], _O),
    # the schema only, but a read like any other (grpcurl sends -H and -cert)
    "grpc.reflection.v1alpha.ServerReflection": {"ServerReflectionInfo": _R},
    # the call stream's port (mqmeta/call_stream.py): 0 under an auth policy in any case
    "mqmeta.v1.CallStream": {"Offer": _R},
}
METHOD_ACCESS: dict[str, Access] = {
    f"/{service}/{method}": access
    for service, methods in _ACCESS_BY_SERVICE.items()
    for method, access in methods.items()
}
ADMIN_WRITE_METHODS = frozenset(m for m, access in METHOD_ACCESS.items() if access is Access.ADMIN)

ROLES = ("admin", "read")
TOKEN_FILE_BYTES_MAX = 1 << 16
AUTHORIZATION_KEY = "authorization"
CERT_PREFIX = "cn:"
BEARER = "Bearer "
RMQ_SIGNATURE = "MQv2-HMAC-SHA1 "  # RocketMQ 5 clients' Credentials (AccessKey, SecretKey)
RMQ_DATE_KEY = "x-mq-date-time"  # the header such a signature signs
# The auth context key of the verified peer certificate's subject CN (gRPC's TSI names).
PEER_CN_KEY = "x509_common_name"


@dataclass(frozen=True)
class Identity:
    name: str
    role: str


@dataclass(frozen=True)
class Policy:
    """A server's allow list (from --auth-file) and whether reads need a credential."""

    tokens: dict[str, Identity] = field(default_factory=dict)  # token -> identity
    certificates: dict[str, Identity] = field(default_factory=dict)  # subject CN -> identity
    reads_need_credential: bool = False


_policy: Policy | None = None  # server side (None: no --auth-file, nothing checked)
_token: str | None = None  # client side: sent on every call
_peer_certificates = False  # this process's servers verify client certificates (mutual TLS)


def add_auth_flags(parser: argparse.ArgumentParser, serves: bool) -> None:
    group = parser.add_argument_group("authorization")
    group.add_argument("--token-file", type=Path, help="file whose first line is the bearer token to send")
    if serves:
        group.add_argument(
            "--auth-file",
            type=Path,
            help="lines NAME ROLE TOKEN or NAME ROLE cn:CERT-CN (ROLE admin|read): admin writes need one",
        )
        group.add_argument(
            "--anonymous-reads",
            action="store_true",
            help="with --auth-file: reads, sends and fetches need no credential "
            "(by default they need a listed identity)",
        )


def _read(path: Path, flag: str) -> str:
    try:
        with path.open("rb") as file:
            return file.read(TOKEN_FILE_BYTES_MAX).decode()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidArgument(f"{flag} {path}: cannot read it as text ({error})") from None


def load_policy(path: Path, reads_need_credential: bool = True) -> Policy:
    tokens: dict[str, Identity] = {}
    certificates: dict[str, Identity] = {}
    for number, line in enumerate(_read(path, "--auth-file").splitlines(), 1):
        fields = line.split("#", 1)[0].split(None, 2)
        if not fields:
            continue
        if len(fields) != 3 or fields[1] not in ROLES:
            raise InvalidArgument(
                f"--auth-file {path} line {number}: expected NAME ROLE TOKEN or NAME ROLE cn:CN, "
                "ROLE admin or read"
            )
        credential = fields[2].strip()
        if credential.startswith(CERT_PREFIX):
            common_name = credential[len(CERT_PREFIX) :].strip()
            if not common_name:
                raise InvalidArgument(f"--auth-file {path} line {number}: cn: needs a certificate CN")
            certificates[common_name] = Identity(fields[0], fields[1])
        elif len(credential.split()) != 1:
            raise InvalidArgument(f"--auth-file {path} line {number}: a token has no spaces")
        else:
            tokens[credential] = Identity(fields[0], fields[1])
    if not tokens and not certificates:
        raise InvalidArgument(f"--auth-file {path} lists no identity")
    return Policy(tokens, certificates, reads_need_credential)


def load_token(path: Path) -> str:
    lines = _read(path, "--token-file").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise InvalidArgument(f"--token-file {path} is empty")
    return token


def configure_from_args(args: argparse.Namespace, peer_certificates: bool = False) -> None:
    """This process's server policy and client token (None: none). `peer_certificates`:
    its servers verify client certificates (mutual TLS), so `cn:` lines can match."""
    auth_file, token_file = getattr(args, "auth_file", None), getattr(args, "token_file", None)
    # only a serving command's flag (`local up` has one of that name for its children)
    anonymous = hasattr(args, "auth_file") and bool(getattr(args, "anonymous_reads", False))
    if anonymous and auth_file is None:
        raise InvalidArgument("--anonymous-reads needs --auth-file (without one nothing is checked)")
    policy = load_policy(auth_file, not anonymous) if auth_file else None
    if policy is not None and policy.certificates and not peer_certificates:
        raise InvalidArgument(
            f"--auth-file {auth_file} lists certificate identities (cn:), which need mutual TLS: "
            "pass --tls-client-ca"
        )
    configure(policy, load_token(token_file) if token_file else None, peer_certificates)


def configure(
    policy: Policy | dict[str, Identity] | None = None,
    token: str | None = None,
    peer_certificates: bool = False,
) -> None:
    """Sets this process's server policy (a Policy, or tokens alone) and client token."""
    global _policy, _token, _peer_certificates
    _policy = Policy(tokens=policy) if isinstance(policy, dict) else policy
    _token, _peer_certificates = token, peer_certificates


def client_token() -> str | None:
    return _token


def current_policy() -> Policy | None:
    """This process's server policy (None: nothing is checked)."""
    return _policy


def identity_of_token(token: str) -> Identity | None:
    """The identity this process's allow list gives `token` (None: unknown, or no list)."""
    policy = _policy
    return None if policy is None or not token else _by_token(policy, token)


def access_of(method: str) -> Access:
    return METHOD_ACCESS.get(method, Access.ADMIN)


@dataclass(frozen=True)
class _Caller:
    identity: Identity | None
    what: str = ""  # how the caller is named in a refusal (never a token)
    rejected: str = ""  # why the credential it sent is refused ("" when it sent none)
    unlisted: str = ""  # the CN of its certificate when the allow list does not name it


def _header(metadata: Any, key: str) -> str | None:
    return next((str(v) for k, v in metadata or () if k == key), None)


def _peer_common_name(auth_context: dict[str, list[bytes]] | None) -> str | None:
    names = (auth_context or {}).get(PEER_CN_KEY) or []
    return names[0].decode(errors="replace") if names else None


def _by_token(policy: Policy, sent: str) -> Identity | None:
    wanted = sent.encode()
    found = None
    for token, identity in policy.tokens.items():  # compare_digest each: no early exit on a match
        if hmac.compare_digest(token.encode(), wanted):
            found = identity
    return found


def _by_rocketmq_signature(policy: Policy, header: str, metadata: Any) -> Identity | None:
    """RocketMQ 5's `MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time,
    Signature=HEX`: HMAC-SHA1 of the date header keyed with the SecretKey (the token of the
    identity named AK)."""
    parts = dict(p.strip().partition("=")[::2] for p in header[len(RMQ_SIGNATURE) :].split(","))
    access_key, signature = parts.get("Credential", ""), parts.get("Signature", "")
    signed = _header(metadata, RMQ_DATE_KEY)
    if signed is None or parts.get("SignedHeaders") != RMQ_DATE_KEY:
        return None
    found = None
    for token, identity in policy.tokens.items():
        expected = hmac.new(token.encode(), signed.encode(), hashlib.sha1).hexdigest()
        if identity.name == access_key and hmac.compare_digest(expected, signature.lower()):
            found = identity
    return found


def _caller(policy: Policy, metadata: Any, auth_context: dict[str, list[bytes]] | None) -> _Caller:
    """Who is calling: the token when one is sent (see the module's docstring), else the
    verified peer certificate on a mutual TLS port, else nobody."""
    header = _header(metadata, AUTHORIZATION_KEY)
    if header is not None:
        if header.startswith(BEARER):
            identity = _by_token(policy, header[len(BEARER) :])
            rejected = "the bearer token is not known to this server"
        elif header.startswith(RMQ_SIGNATURE):
            identity = _by_rocketmq_signature(policy, header, metadata)
            rejected = "the RocketMQ credentials (AccessKey, SecretKey) match no identity of this server"
        else:
            identity, rejected = None, "the authorization header is neither a bearer token nor RocketMQ's"
        if identity is None:
            return _Caller(None, rejected=rejected)
        return _Caller(identity, f"identity {identity.name}")
    common_name = _peer_common_name(auth_context) if _peer_certificates else None
    identity = policy.certificates.get(common_name) if common_name is not None else None
    if identity is None:
        return _Caller(None, unlisted=common_name or "")
    return _Caller(identity, f"identity {identity.name} (certificate CN {common_name!r})")


def refusal(
    method: str, metadata: Any, auth_context: dict[str, list[bytes]] | None = None
) -> tuple[Any, str] | None:
    """(status, sentence) when this call must be refused, None when it may go on."""
    import grpc

    policy, access = _policy, access_of(method)
    if policy is None or access is Access.OPEN:
        return None
    if access is not Access.ADMIN and not policy.reads_need_credential:
        return None
    name = method.rsplit("/", 1)[-1]
    caller = _caller(policy, metadata, auth_context)
    if caller.identity is None:
        if caller.rejected:
            return grpc.StatusCode.UNAUTHENTICATED, f"{name} refused: {caller.rejected}"
        need = "a bearer token" if access is Access.ADMIN else "a credential (reads are not anonymous here)"
        why = (
            f"certificate CN {caller.unlisted!r} is not on this server's allow list"
            if caller.unlisted
            else "or, with mutual TLS, a client certificate on the server's allow list"
        )
        return grpc.StatusCode.UNAUTHENTICATED, f"{name} needs {need}: pass --token-file ({why})"
    if access is Access.ADMIN and caller.identity.role != "admin":
        return grpc.StatusCode.PERMISSION_DENIED, f"{name} refused: {caller.what} may only read"
    return None


REMOTING_ACCESS_KEY = "AccessKey"
REMOTING_SIGNATURE = "Signature"


def remoting_refusal(ext: dict[str, str], body: bytes, read_only: bool) -> str | None:
    """A sentence when a remoting request must be refused, None when it may go on.

    RocketMQ 4.x's ACL: the client adds extFields AccessKey (here: an identity's name) and
    Signature, base64 of HMAC-SHA1 keyed with the SecretKey (here: that identity's token)
    over the values of every other extField, in the order of their names, then the body.
    Every request is data access (no admin codes are served over remoting); a `read_only`
    one (a route) is anonymous with --anonymous-reads."""
    policy = _policy
    if policy is None or (read_only and not policy.reads_need_credential):
        return None
    access_key, signature = ext.get(REMOTING_ACCESS_KEY, ""), ext.get(REMOTING_SIGNATURE, "")
    if not access_key or not signature:
        return (
            "this server checks RocketMQ ACL credentials: give the client an AccessKey (an "
            "identity of the server's --auth-file) and its SecretKey (that identity's token)"
        )
    content = "".join(v for k, v in sorted(ext.items()) if k != REMOTING_SIGNATURE).encode() + body
    found = None
    for token, identity in policy.tokens.items():  # compare each: no early exit on a match
        expected = base64.b64encode(hmac.new(token.encode(), content, hashlib.sha1).digest()).decode()
        if identity.name == access_key and hmac.compare_digest(expected, signature):
            found = identity
    if found is None:
        return (
            f"the RocketMQ ACL signature of AccessKey {access_key[:64]!r} matches no identity of this server"
        )
    return None


def needs_peer(method: str) -> bool:
    """Whether deciding on `method` may need the peer's certificate (the handler's context)."""
    policy = _policy
    if policy is None or access_of(method) is Access.OPEN:
        return False
    return access_of(method) is Access.ADMIN or policy.reads_need_credential


def _guarded(behaviour: Callable, method: str, metadata: Any, streams: bool) -> Callable:
    """`behaviour` (a handler of any of the four shapes, sync or async; `streams`: it
    answers with a stream) checking the call first; the peer's certificate is only known to
    the handler's context, so the check runs there, before the handler."""

    def decide(context: Any) -> tuple[Any, str] | None:
        return refusal(method, metadata, context.auth_context())

    if inspect.isasyncgenfunction(behaviour):

        async def guarded_stream(request: Any, context: Any) -> Any:
            refused = decide(context)
            if refused is not None:
                await context.abort(*refused)
            async for item in behaviour(request, context):
                yield item

        return guarded_stream
    if inspect.iscoroutinefunction(behaviour):

        async def guarded_async(request: Any, context: Any) -> Any:
            refused = decide(context)
            if refused is not None:
                await context.abort(*refused)
            return await behaviour(request, context)

        return guarded_async

    if streams:  # a generator, also when `behaviour` merely returns one: grpc.aio waits
        # forever on a sync stream handler that raises before it returns its iterator

        def guarded_iterator(request: Any, context: Any) -> Any:
            refused = decide(context)
            if refused is not None:
                context.abort(*refused)  # raises
            yield from behaviour(request, context)

        return guarded_iterator

    def guarded(request: Any, context: Any) -> Any:
        refused = decide(context)
        if refused is not None:
            context.abort(*refused)  # raises
        return behaviour(request, context)

    return guarded


def _wrap(handler: Any, method: str, metadata: Any) -> Any:
    if handler is None:
        return None  # an unknown method: gRPC answers UNIMPLEMENTED
    shape = next(
        name
        for name in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        if getattr(handler, name)
    )
    guarded = _guarded(getattr(handler, shape), method, metadata, streams=handler.response_streaming)
    return handler._replace(**{shape: guarded})


def server_interceptors() -> list[Any]:
    """The interceptor of a grpc.Server (empty without --auth-file)."""
    import grpc

    if _policy is None:
        return []

    class _Check(grpc.ServerInterceptor):
        def intercept_service(self, continuation: Callable, details: Any) -> Any:
            handler = continuation(details)
            if not needs_peer(details.method):
                return handler
            return _wrap(handler, details.method, details.invocation_metadata)

    return [_Check()]


def aio_server_interceptors() -> list[Any]:
    """The interceptor of a grpc.aio.Server (empty without --auth-file)."""
    import grpc.aio

    if _policy is None:
        return []

    class _Check(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation: Callable, details: Any) -> Any:
            handler = await continuation(details)
            if not needs_peer(details.method):
                return handler
            return _wrap(handler, details.method, details.invocation_metadata)

    return [_Check()]


def with_token(channel: Any) -> Any:
    """`channel` sending this process's bearer token on every call (itself without one)."""
    import grpc

    token = _token
    if token is None:
        return channel
    header = (AUTHORIZATION_KEY, f"{BEARER}{token}")

    class _Details(
        collections.namedtuple(
            "_Details", ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"]
        ),
        grpc.ClientCallDetails,
    ):
        pass

    class _Bearer(
        grpc.UnaryUnaryClientInterceptor,
        grpc.UnaryStreamClientInterceptor,
        grpc.StreamUnaryClientInterceptor,
        grpc.StreamStreamClientInterceptor,
    ):
        def _add(self, continuation: Callable, details: Any, request: Any) -> Any:
            metadata = [*(details.metadata or ()), header]
            replaced = _Details(
                details.method,
                details.timeout,
                metadata,
                details.credentials,
                getattr(details, "wait_for_ready", None),
                getattr(details, "compression", None),
            )
            return continuation(replaced, request)

        intercept_unary_unary = intercept_unary_stream = _add
        intercept_stream_unary = intercept_stream_stream = _add

    return grpc.intercept_channel(channel, _Bearer())
