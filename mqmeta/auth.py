"""Admin writes need a credential: a bearer token, checked by a server interceptor.

Servers started with `--auth-file FILE` read lines `NAME ROLE TOKEN` (ROLE is `admin` or
`read`; `#` starts a comment). An admin write (ADMIN_WRITE_METHODS) without a token, or
with one the file does not list, is UNAUTHENTICATED; with the token of a `read` identity,
PERMISSION_DENIED. Reads stay anonymous. Clients send `authorization: Bearer TOKEN` on
every call when started with `--token-file FILE` (the token on its first line); every
channel made by mqmeta.tls carries it. Tokens are never logged: messages name the
identity, never the token.
"""

from __future__ import annotations

import argparse
import collections
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqmeta.errors import InvalidArgument

ADMIN_WRITE_METHODS = frozenset(
    [
        *(
            f"/mqmeta.v1.ControllerService/{name}"
            for name in (
                "CreateTopic",
                "UpdateTopic",
                "DeleteTopic",
                "CreateGroup",
                "UpdateGroup",
                "DeleteGroup",
                "UpdateConfig",
                "ElectMaster",
                "CleanBrokerData",
                "Write",
                # a broker's own writes: the cluster credential keeps a stranger from
                # registering a broker, faking its liveness or moving its checkpoints
                "RegisterBroker",
                "GetNextBrokerId",
                "Heartbeat",
                "AlterSyncStateSet",
                "TieredUploadStart",
                "TieredCommit",
                "TieredForgetAbandoned",
                # a replicator worker's: leases and checkpoints of cross-cluster tasks
                "ReplicatorHeartbeat",
                "CommitReplicatorTask",
            )
        ),
        "/mqmeta.v1.BrokerService/Handoff",
    ]
)
ROLES = ("admin", "read")
TOKEN_FILE_BYTES_MAX = 1 << 16
AUTHORIZATION_KEY = "authorization"


@dataclass(frozen=True)
class Identity:
    name: str
    role: str


_tokens: dict[str, Identity] | None = None  # server side: token -> identity
_token: str | None = None  # client side: sent on every call


def add_auth_flags(parser: argparse.ArgumentParser, serves: bool) -> None:
    group = parser.add_argument_group("authorization")
    group.add_argument("--token-file", type=Path, help="file whose first line is the bearer token to send")
    if serves:
        group.add_argument(
            "--auth-file", type=Path, help="lines NAME ROLE TOKEN (admin|read): admin writes need a token"
        )


def _read(path: Path, flag: str) -> str:
    try:
        with path.open("rb") as file:
            return file.read(TOKEN_FILE_BYTES_MAX).decode()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidArgument(f"{flag} {path}: cannot read it as text ({error})") from None


def load_tokens(path: Path) -> dict[str, Identity]:
    tokens: dict[str, Identity] = {}
    for number, line in enumerate(_read(path, "--auth-file").splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 3 or fields[1] not in ROLES:
            raise InvalidArgument(
                f"--auth-file {path} line {number}: expected NAME ROLE TOKEN, ROLE admin or read"
            )
        tokens[fields[2]] = Identity(fields[0], fields[1])
    if not tokens:
        raise InvalidArgument(f"--auth-file {path} lists no identity")
    return tokens


def load_token(path: Path) -> str:
    lines = _read(path, "--token-file").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise InvalidArgument(f"--token-file {path} is empty")
    return token


def configure_from_args(args: argparse.Namespace) -> None:
    """This process's server tokens and client token (None: none)."""
    global _tokens, _token
    auth_file, token_file = getattr(args, "auth_file", None), getattr(args, "token_file", None)
    _tokens = load_tokens(auth_file) if auth_file else None
    _token = load_token(token_file) if token_file else None


def configure(tokens: dict[str, Identity] | None = None, token: str | None = None) -> None:
    global _tokens, _token
    _tokens, _token = tokens, token


def client_token() -> str | None:
    return _token


def refusal(method: str, metadata: Any) -> tuple[Any, str] | None:
    """(status, sentence) when this call must be refused, None when it may go on."""
    import grpc

    tokens = _tokens
    if tokens is None or method not in ADMIN_WRITE_METHODS:
        return None
    name = method.rsplit("/", 1)[-1]
    header = next((str(v) for k, v in metadata or () if k == AUTHORIZATION_KEY), "")
    if not header.startswith("Bearer "):
        return grpc.StatusCode.UNAUTHENTICATED, f"{name} needs a bearer token: pass --token-file"
    sent = header[len("Bearer ") :].encode()
    identity = next((i for t, i in tokens.items() if hmac.compare_digest(t.encode(), sent)), None)
    if identity is None:
        return (
            grpc.StatusCode.UNAUTHENTICATED,
            f"{name} refused: the bearer token is not known to this server",
        )
    if identity.role != "admin":
        return grpc.StatusCode.PERMISSION_DENIED, f"{name} refused: identity {identity.name} may only read"
    return None


def server_interceptors() -> list[Any]:
    """The interceptor of a grpc.Server (empty without --auth-file)."""
    import grpc

    if _tokens is None:
        return []

    class _Check(grpc.ServerInterceptor):
        def intercept_service(self, continuation: Callable, details: Any) -> Any:
            refused = refusal(details.method, details.invocation_metadata)
            if refused is None:
                return continuation(details)
            code, message = refused
            return grpc.unary_unary_rpc_method_handler(lambda request, context: context.abort(code, message))

    return [_Check()]


def aio_server_interceptors() -> list[Any]:
    """The interceptor of a grpc.aio.Server (empty without --auth-file)."""
    import grpc.aio

    if _tokens is None:
        return []

    class _Check(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation: Callable, details: Any) -> Any:
            refused = refusal(details.method, details.invocation_metadata)
            if refused is None:
                return await continuation(details)
            code, message = refused

            async def abort(request: Any, context: Any) -> None:
                await context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(abort)

    return [_Check()]


def with_token(channel: Any) -> Any:
    """`channel` sending this process's bearer token on every call (itself without one)."""
    import grpc

    token = _token
    if token is None:
        return channel
    header = (AUTHORIZATION_KEY, f"Bearer {token}")

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
