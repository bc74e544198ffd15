"""Toxiproxy's HTTP API (api.go) on aiohttp.web, on the event loop of the data path.

Routes: GET/POST /proxies, POST /populate, GET/POST/PATCH/DELETE /proxies/{proxy},
GET/POST /proxies/{proxy}/toxics, GET/POST/PATCH/DELETE /proxies/{proxy}/toxics/{toxic},
POST /reset, GET /version. As Toxiproxy's middleware does, every answer carries an
X-Toxiproxy-Request-Id header, a browser (a User-Agent starting "Mozilla/") is refused with 403 so
that a web page cannot drive the API, and a request not answered within REQUEST_TIMEOUT_S gets
503. Errors are {"error": text, "status": status}; a failed populate adds the "proxies" it got to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from mqmeta.chaos.toxiproxy.collection import PopulateError, ProxyCollection
from mqmeta.chaos.toxiproxy.model import (
    API_CONNECTION_COUNT_MAX,
    REQUEST_BODY_BYTES_MAX,
    REQUEST_TIMEOUT_S,
    VERSION,
    ApiError,
    ToxiproxyError,
    parse_body,
)

API_IDLE_TIMEOUT_S = 60.0  # an idle keep-alive connection is closed (Toxiproxy's IdleTimeout)
API_SHUTDOWN_TIMEOUT_S = 5.0  # requests in flight when the server stops get this long
REQUEST_ID_HEADER = "X-Toxiproxy-Request-Id"
BROWSER_AGENT_PREFIX = "Mozilla/"

_log = logging.getLogger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(status: int, value: Any) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(value, separators=(",", ":")), content_type="application/json"
    )


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return _json(status, {"error": message, "status": status, **extra})


@web.middleware
async def _request_id(request: web.Request, handler: _Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers[REQUEST_ID_HEADER] = secrets.token_hex(10)
    return response


@web.middleware
async def _stop_browsers(request: web.Request, handler: _Handler) -> web.StreamResponse:
    if request.headers.get("User-Agent", "").startswith(BROWSER_AGENT_PREFIX):
        return web.Response(status=403, text="User agent not allowed\n")
    return await handler(request)


@web.middleware
async def _errors_and_timeout(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Maps errors to {error, status}; answers 503 when the work takes longer than the timeout
    (the work itself goes on, as under Go's TimeoutHandler, so that no change is left half done)."""
    work = asyncio.ensure_future(handler(request))
    work.add_done_callback(_retrieve)
    try:
        return await asyncio.wait_for(asyncio.shield(work), REQUEST_TIMEOUT_S)
    except TimeoutError:
        return _error(503, f"the request took longer than {REQUEST_TIMEOUT_S:g} s")
    except ApiError as error:
        return _error(error.status, error.message)
    except ToxiproxyError as error:  # a proxy that cannot listen: Toxiproxy answers 500 with Go's text
        return _error(500, str(error))
    except web.HTTPException as error:  # no such route, method not allowed, body too large
        response = _error(error.status, (error.reason or "").lower())
        if error.status == 413:
            response.force_close()  # the rest of the body is not read: the connection is out of step
        return response


def _retrieve(work: asyncio.Future[Any]) -> None:
    """Logs a failure nobody awaited any more (the 503 was already sent) or a bug."""
    if work.cancelled():
        return
    error = work.exception()
    if error is not None and not isinstance(error, ToxiproxyError | web.HTTPException):
        _log.error("toxiproxy: a request failed", exc_info=error)


class _Routes:
    def __init__(self, collection: ProxyCollection) -> None:
        self.collection = collection

    async def _body(self, request: web.Request) -> Any:
        length_bytes = request.content_length or 0
        if length_bytes > REQUEST_BODY_BYTES_MAX:  # answered before the body arrives
            raise web.HTTPRequestEntityTooLarge(max_size=REQUEST_BODY_BYTES_MAX, actual_size=length_bytes)
        return parse_body(await request.read())

    async def version(self, request: web.Request) -> web.Response:
        body = f'{{"version": "{VERSION}"}}\n'
        return web.Response(body=body, headers={"Content-Type": "application/json;charset=utf-8"})

    async def reset(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            await self.collection.reset()
        return web.Response(status=204)

    async def list_proxies(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            return _json(200, {name: p.to_json() for name, p in self.collection.proxies.items()})

    async def create_proxy(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        async with self.collection.lock:
            return _json(201, await self.collection.create(body))

    async def populate(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        async with self.collection.lock:
            try:
                return _json(201, {"proxies": await self.collection.populate(body)})
            except PopulateError as failure:
                error = failure.error
                status = error.status if isinstance(error, ApiError) else 500
                return _error(status, str(error), proxies=failure.proxies)

    async def show_proxy(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            return _json(200, self.collection.get(request.match_info["proxy"]).to_json())

    async def update_proxy(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        async with self.collection.lock:
            return _json(200, await self.collection.update(request.match_info["proxy"], body))

    async def delete_proxy(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            await self.collection.delete(request.match_info["proxy"])
        return web.Response(status=204)

    async def list_toxics(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            return _json(200, self.collection.get(request.match_info["proxy"]).toxics_json())

    async def create_toxic(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        async with self.collection.lock:
            return _json(200, self.collection.add_toxic(request.match_info["proxy"], body))

    async def show_toxic(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            toxic = self.collection.get_toxic(request.match_info["proxy"], request.match_info["toxic"])
            return _json(200, toxic.to_json())

    async def update_toxic(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        names = request.match_info["proxy"], request.match_info["toxic"]
        async with self.collection.lock:
            return _json(200, self.collection.update_toxic(*names, body))

    async def delete_toxic(self, request: web.Request) -> web.Response:
        async with self.collection.lock:
            self.collection.remove_toxic(request.match_info["proxy"], request.match_info["toxic"])
        return web.Response(status=204)


def make_app(collection: ProxyCollection) -> web.Application:
    app = web.Application(
        middlewares=[_request_id, _stop_browsers, _errors_and_timeout], client_max_size=REQUEST_BODY_BYTES_MAX
    )
    routes = _Routes(collection)
    proxy, toxic = "/proxies/{proxy}", "/proxies/{proxy}/toxics/{toxic}"
    for method, path, handler in [
        ("POST", "/reset", routes.reset),
        ("GET", "/proxies", routes.list_proxies),
        ("POST", "/proxies", routes.create_proxy),
        ("POST", "/populate", routes.populate),
        ("GET", proxy, routes.show_proxy),
        ("POST", proxy, routes.update_proxy),
        ("PATCH", proxy, routes.update_proxy),
        ("DELETE", proxy, routes.delete_proxy),
        ("GET", proxy + "/toxics", routes.list_toxics),
        ("POST", proxy + "/toxics", routes.create_toxic),
        ("GET", toxic, routes.show_toxic),
        ("POST", toxic, routes.update_toxic),
        ("PATCH", toxic, routes.update_toxic),
        ("DELETE", toxic, routes.delete_toxic),
        ("GET", "/version", routes.version),
    ]:
        app.router.add_route(method, path, handler)
    return app


class _Refused(asyncio.Protocol):
    """Stands in for an HTTP connection beyond API_CONNECTION_COUNT_MAX: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class ApiServer:
    """The HTTP API bound to a socket; start() returns the address it listens on."""

    def __init__(self, collection: ProxyCollection) -> None:
        self._runner = web.AppRunner(
            make_app(collection),
            access_log=None,
            keepalive_timeout=API_IDLE_TIMEOUT_S,
            handle_signals=False,
            shutdown_timeout=API_SHUTDOWN_TIMEOUT_S,
            lingering_time=0.0,  # a body left unread (413) is not waited for: the connection closes
        )
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listens; raises OSError when the address cannot be bound."""
        await self._runner.setup()
        handlers = self._runner.server
        assert handlers is not None

        def connection() -> asyncio.Protocol:
            if len(handlers.connections) >= API_CONNECTION_COUNT_MAX:
                return _Refused()
            return handlers()

        self._server = await asyncio.get_running_loop().create_server(
            connection, host, port, reuse_address=True
        )
        bound = self._server.sockets[0].getsockname()
        return bound[0], bound[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._runner.cleanup()
