"""The console's HTTP side: pages and their JSON on aiohttp, a server-sent event stream
fed by the controllers' watch stream and a sampler, a login and CSRF-checked writes.

Who may do what is the nameserver's own allow list (mqmeta.auth, --auth-file): a login
with a token, or the client certificate on a mutual-TLS console, gives a session whose
identity is checked against the same access table as a gRPC call (auth.refusal), so a
refusal carries the server's sentence. Writes also need the session's CSRF token in
the X-CSRF-Token header (the page reads it from /api/session) and a same-origin Origin.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web
from mqmeta.controller.console import data

from mqmeta import auth
from mqmeta.errors import InvalidArgument, MqmetaError

log = logging.getLogger(__name__)

Json = dict[str, Any]
SESSION_COOKIE = "mqmeta_console"
CSRF_HEADER = "X-CSRF-Token"
SESSIONS_MAX = 1024
SUBSCRIBERS_MAX = 64  # open event streams
SUBSCRIBER_QUEUE_MAX = 256  # events waiting for one slow browser; past it that stream ends
EVENTS_MAX = 500  # the timeline's memory
SAMPLES_MAX = 300  # plot points kept (at SAMPLE_INTERVAL_S: ten minutes)
SAMPLE_INTERVAL_S = 2.0  # while a page is open
SAMPLE_IDLE_INTERVAL_S = 60.0  # while none is: the plots keep some history at little cost
# ...and while none is, sampling takes at most this share of the time: a sample reads every
# listed topic's queues from the brokers (200 topics of 4 queues: about 2,000 calls), which
# beside a busy cluster on few cores took a tenth of a core when it ran every 15 s
SAMPLE_IDLE_DUTY_MAX = 0.02
STREAM_KEEPALIVE_S = 15.0
READ_WORKERS_MAX = 8
PLOT_KEYS = ("now_ms", "rates", "backlog", "replication_delay_ms")
REQUEST_BODY_BYTES_MAX = 64 * 1024
CREATE_TOPIC_METHOD = "/mqmeta.v1.ControllerService/CreateTopic"
RESET_OFFSETS_METHOD = "/mqmeta.v1.BrokerService/ResetOffsets"
RESEND_METHOD = "/mqmeta.v1.BrokerService/ResendMessage"
HISTORY_PAGE_COMMANDS = 100
READ_METHOD = "/mqmeta.v1.ControllerService/GetMetadata"  # the access class of every page

_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "FAILED_PRECONDITION": 409,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
}


@dataclass
class Session:
    csrf: str
    token: str | None = None  # the login's bearer token (kept server-side only)
    name: str = ""
    role: str = ""


class ConsoleError(MqmetaError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code)


def _error_response(error: MqmetaError) -> web.Response:
    status = _HTTP_STATUS.get(error.code, 503)
    return web.json_response({"error": error.message, "code": error.code}, status=status)


def static_files() -> Any:
    return resources.files("mqmeta.controller.console").joinpath("static")


CONSOLE: web.AppKey[Any] = web.AppKey("console", object)  # the running Console, in the app


class Hub:
    """Fan-out of live events to every open stream, and the bounded memory of recent
    events (the timeline) and samples (the plots). Lives on the web loop."""

    def __init__(self) -> None:
        self.subscribers: set[asyncio.Queue[tuple[str, Json] | None]] = set()
        self.events: collections.deque[Json] = collections.deque(maxlen=EVENTS_MAX)
        self.samples: collections.deque[Json] = collections.deque(maxlen=SAMPLES_MAX)
        self.joined = threading.Event()  # a stream opened: the sampler takes up its pace

    def publish(self, kind: str, document: Json) -> None:
        if kind == "event":
            self.events.append(document)
        elif kind == "sample":  # the plots' points; the tables go to open streams only
            self.samples.append({k: document[k] for k in PLOT_KEYS})
        for queue in list(self.subscribers):
            try:
                queue.put_nowait((kind, document))
            except asyncio.QueueFull:  # a browser that stopped reading: end its stream (it reconnects)
                self.subscribers.discard(queue)
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(None)


def build_app(console: Any) -> web.Application:
    """The routes; `console` is the running Console (controller/console/__init__.py)."""
    app = web.Application(client_max_size=REQUEST_BODY_BYTES_MAX, middlewares=[_security_headers])
    app[CONSOLE] = console
    pages = ["/", "/topics", "/groups", "/search", "/replicator", "/events"]
    for page in pages:
        app.router.add_get(page, _index)
    app.router.add_get("/static/{path:.+}", _static)
    app.router.add_get("/favicon.ico", _no_content)
    app.router.add_get("/api/session", _session)
    app.router.add_post("/api/login", _login)
    app.router.add_post("/api/logout", _logout)
    reads: dict[str, Callable[[web.Request], Callable[[], Json]]] = {
        "/api/overview": lambda r: lambda: data.overview(console.client, console.brokers),
        "/api/topics": lambda r: lambda: data.topics(console.client, console.brokers),
        "/api/groups": lambda r: lambda: data.group_lag(console.client, console.brokers),
        "/api/replicator": lambda r: lambda: data.replicator(console.client),
        "/api/search": _search_call,
        "/api/history": _history_call,
    }
    for path, call in reads.items():
        app.router.add_get(path, _reader(call))
    app.router.add_get("/api/events", _events)
    app.router.add_get("/api/samples", _samples)
    app.router.add_get("/api/stream", _stream)
    app.router.add_post("/api/topics", _create_topic)
    app.router.add_post("/api/groups/reset", _reset_offsets)
    app.router.add_post("/api/messages/resend", _resend)
    return app


@web.middleware
async def _security_headers(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
    response = await handler(request)
    # the page works offline and runs only its own scripts
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


async def _no_content(request: web.Request) -> web.Response:
    return web.Response(status=204)


async def _index(request: web.Request) -> web.Response:
    return web.Response(body=static_files().joinpath("index.html").read_bytes(), content_type="text/html")


_CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".txt": "text/plain"}


async def _static(request: web.Request) -> web.Response:
    path = request.match_info["path"]
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise web.HTTPNotFound()
    file = static_files()
    for part in parts:
        file = file.joinpath(part)
    if not file.is_file():
        raise web.HTTPNotFound()
    suffix = "." + path.rsplit(".", 1)[-1] if "." in path else ""
    return web.Response(
        body=file.read_bytes(), content_type=_CONTENT_TYPES.get(suffix, "application/octet-stream")
    )


# Sessions and who is calling ------------------------------------------------------------


def _session_of(request: web.Request) -> Session | None:
    return request.app[CONSOLE].sessions.get(request.cookies.get(SESSION_COOKIE, ""))


def _new_session(request: web.Request, response: web.StreamResponse, session: Session) -> None:
    sessions: collections.OrderedDict[str, Session] = request.app[CONSOLE].sessions
    while len(sessions) >= SESSIONS_MAX:
        sessions.popitem(last=False)
    session_id = secrets.token_urlsafe(32)
    sessions[session_id] = session
    response.set_cookie(
        SESSION_COOKIE, session_id, httponly=True, samesite="Strict", secure=request.secure, path="/"
    )


def _certificate_cn(request: web.Request) -> str | None:
    """The verified client certificate's subject CN (a mutual-TLS console)."""
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    for rdn in (peer or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _metadata(request: web.Request, session: Session | None) -> tuple[list[tuple[str, str]], Any]:
    """The call's credential as a gRPC server would see it: the login's token, else the
    client certificate's CN."""
    if session is not None and session.token is not None:
        return [(auth.AUTHORIZATION_KEY, f"{auth.BEARER}{session.token}")], None
    common_name = _certificate_cn(request)
    context = {auth.PEER_CN_KEY: [common_name.encode()]} if common_name else None
    return [], context


def _refused(request: web.Request, method: str) -> MqmetaError | None:
    """The server's refusal of `method` for this browser, or None."""
    metadata, context = _metadata(request, _session_of(request))
    refusal = auth.refusal(method, metadata, context)
    if refusal is None:
        return None
    status, sentence = refusal
    return ConsoleError(sentence, status.name)


async def _session(request: web.Request) -> web.Response:
    """Who this browser is and its CSRF token (a first visit gets an anonymous session)."""
    session = _session_of(request)
    fresh = session is None
    if session is None:
        session = Session(csrf=secrets.token_urlsafe(24))
    identity = _identity(request, session)
    checked = auth.current_policy() is not None
    document = {
        "auth": checked,
        "identity": identity.name if identity else "",
        "role": identity.role if identity else ("" if checked else "admin"),
        "may_read": _refused(request, READ_METHOD) is None,
        "csrf": session.csrf,
    }
    response = web.json_response(document)
    if fresh:
        _new_session(request, response, session)
    return response


def _identity(request: web.Request, session: Session | None) -> auth.Identity | None:
    policy = auth.current_policy()
    if policy is None:
        return None
    if session is not None and session.token is not None:
        return auth.identity_of_token(session.token)
    common_name = _certificate_cn(request)
    return policy.certificates.get(common_name) if common_name else None


async def _login(request: web.Request) -> web.Response:
    body = await _json_body(request)
    token = str(body.get("token", "")).strip()
    if auth.current_policy() is None:
        return web.json_response({"error": "this console checks no credential: no login needed"}, status=400)
    identity = auth.identity_of_token(token)
    if identity is None:
        return web.json_response(
            {"error": "login refused: the token is not known to this server", "code": "UNAUTHENTICATED"},
            status=401,
        )
    response = web.json_response({"identity": identity.name, "role": identity.role})
    _new_session(
        request,
        response,
        Session(csrf=secrets.token_urlsafe(24), token=token, name=identity.name, role=identity.role),
    )
    return response


async def _logout(request: web.Request) -> web.Response:
    request.app[CONSOLE].sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)
    response = web.json_response({"logged_out": True})
    response.del_cookie(SESSION_COOKIE, path="/")
    return response


async def _json_body(request: web.Request) -> Json:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text='{"error": "the body is not JSON"}', content_type="application/json"
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text='{"error": "the body is not a JSON object"}', content_type="application/json"
        )
    return body


def _check_csrf(request: web.Request) -> MqmetaError | None:
    session = _session_of(request)
    sent = request.headers.get(CSRF_HEADER, "")
    if session is None or not sent or not secrets.compare_digest(sent, session.csrf):
        return ConsoleError(
            "the write lacks this session's CSRF token: reload the page and try again", "PERMISSION_DENIED"
        )
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return ConsoleError(
            f"a write from origin {origin} is refused (not this console)", "PERMISSION_DENIED"
        )
    return None


# Reads -----------------------------------------------------------------------------------


def _reader(
    make: Callable[[web.Request], Callable[[], Json]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        refused = _refused(request, READ_METHOD)
        if refused is not None:
            return _error_response(refused)
        try:
            call = make(request)
            document = await request.app[CONSOLE].run(call)
        except MqmetaError as error:
            return _error_response(error)
        return web.json_response(document)

    return handler


def _milliseconds(text: str, name: str) -> int:
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be milliseconds since the epoch, got {text!r}") from None
    if value < 0:
        raise InvalidArgument(f"{name} must not be negative, got {value}")
    return value


def _search_call(request: web.Request) -> Callable[[], Json]:
    query = request.query
    console = request.app[CONSOLE]
    since = _milliseconds(query.get("since", ""), "since")
    until = _milliseconds(query.get("until", ""), "until")
    return lambda: data.search(
        console.client,
        query.get("topic", ""),
        key=query.get("key", ""),
        msg_id=query.get("id", ""),
        since_ms=since,
        until_ms=until,
    )


def _history_call(request: web.Request) -> Callable[[], Json]:
    text = request.query.get("before", "") or "0"
    try:
        before_index = int(text)
    except ValueError:
        raise InvalidArgument(f"before must be a Raft index, got {text[:32]!r}") from None
    if before_index < 0:
        raise InvalidArgument(f"before must be a Raft index (1 or more; 0: the newest), not {before_index}")
    console = request.app[CONSOLE]
    return lambda: data.history(console.client, before_index, HISTORY_PAGE_COMMANDS)


async def _events(request: web.Request) -> web.Response:
    refused = _refused(request, READ_METHOD)
    if refused is not None:
        return _error_response(refused)
    return web.json_response({"events": list(request.app[CONSOLE].hub.events)})


async def _samples(request: web.Request) -> web.Response:
    refused = _refused(request, READ_METHOD)
    if refused is not None:
        return _error_response(refused)
    return web.json_response({"samples": list(request.app[CONSOLE].hub.samples)})


async def _stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `event` (a controller decision), `sample` (plot points and the
    latest topics and groups)."""
    refused = _refused(request, READ_METHOD)
    if refused is not None:
        return _error_response(refused)
    hub: Hub = request.app[CONSOLE].hub
    if len(hub.subscribers) >= SUBSCRIBERS_MAX:
        return web.json_response({"error": "too many open consoles on this nameserver"}, status=503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue: asyncio.Queue[tuple[str, Json] | None] = asyncio.Queue(maxsize=SUBSCRIBER_QUEUE_MAX)
    hub.subscribers.add(queue)
    hub.joined.set()
    try:
        await response.write(b"retry: 1000\n\n")
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=STREAM_KEEPALIVE_S)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if item is None:
                break
            kind, document = item
            await response.write(f"event: {kind}\ndata: {json.dumps(document)}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        hub.subscribers.discard(queue)
    return response


# Writes ----------------------------------------------------------------------------------


async def _admin_write(
    request: web.Request, method: str, write: Callable[[Any, dict[str, Any]], dict[str, Any]]
) -> web.Response:
    """An admin write: refused by the CSRF check, then by the same table and sentence as the
    gRPC call `method`; then `write(console, body)` runs with this nameserver's own
    credential and its document is the answer."""
    refused = _check_csrf(request) or _refused(request, method)
    if refused is not None:
        return _error_response(refused)
    body = await _json_body(request)
    console = request.app[CONSOLE]
    try:
        document = await console.run(lambda: write(console, body))
    except MqmetaError as error:
        return _error_response(error)
    return web.json_response(document)


def _text(body: dict[str, Any], key: str) -> str:
    return str(body.get(key, "")).strip()


async def _create_topic(request: web.Request) -> web.Response:
    from mqmeta.pb import controller_pb2 as pb

    def write(console: Any, body: dict[str, Any]) -> dict[str, Any]:
        try:
            queues = int(body.get("queues", 4))
        except (TypeError, ValueError):
            raise InvalidArgument("queues must be a whole number") from None
        topic = console.client.create_topic(pb.TopicSpec(name=_text(body, "name"), queue_count=queues))
        return {"name": topic.name, "queue_count": topic.queue_count}

    return await _admin_write(request, CREATE_TOPIC_METHOD, write)


async def _reset_offsets(request: web.Request) -> web.Response:
    """The brokers' ResetOffsets."""
    return await _admin_write(
        request,
        RESET_OFFSETS_METHOD,
        lambda console, body: data.reset_offsets(
            console.client,
            _text(body, "group"),
            _text(body, "topic"),
            str(body.get("to", "")),
            bool(body.get("force", False)),
        ),
    )


async def _resend(request: web.Request) -> web.Response:
    """The brokers' ResendMessage: a copy for one group, or the requeue of a dead letter."""
    return await _admin_write(
        request,
        RESEND_METHOD,
        lambda console, body: data.resend(
            console.client, _text(body, "msg_id"), _text(body, "topic"), _text(body, "group")
        ),
    )


def server_ssl_context() -> ssl.SSLContext | None:
    """HTTPS with this process's certificate when it serves TLS; client certificates
    asked for (optional: a token login works too) when it takes --tls-client-ca."""
    import os
    import tempfile

    from mqmeta import tls

    config = tls.current()
    if config is None or not config.serves_tls:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory() as directory:  # load_cert_chain reads files only
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        with open(cert, "wb") as file:
            file.write(config.cert or b"")
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as file:
            file.write(config.key or b"")
        context.load_cert_chain(cert, key)
    if config.client_ca:
        context.load_verify_locations(cadata=config.client_ca.decode())
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def read_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=READ_WORKERS_MAX, thread_name_prefix="console")
