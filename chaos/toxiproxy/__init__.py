"""A Toxiproxy-compatible TCP fault proxy for the chaos suite.

No Toxiproxy binary can be installed where the chaos suite runs, so this package is a server that
behaves as Toxiproxy 2.12 (`toxiproxy-server`) does, as its own tests (api_test.go, proxy_test.go,
link_test.go, toxics/*_test.go) define that behaviour; tests/test_toxiproxy*.py are those tests in
Python, run over HTTP and real sockets. The unchanged `toxiproxy-python` client drives it.

- model: proxies and toxics as JSON, their validation and Toxiproxy's error texts (pure);
- datapath: listeners, links and toxics on one asyncio loop, every buffer bounded;
- collection: the proxy and toxic operations with Toxiproxy's semantics (populate, update, reset);
- api: the HTTP API on aiohttp.web, on the same loop;
- server: ToxiproxyServer (the loop in a daemon thread) and the command line.

Known differences from Toxiproxy (where its behaviour is an accident of its Go code, or unsafe):
an empty listen host means 127.0.0.1, not every interface; a half-close is passed on as a
half-close (Toxiproxy closes the whole connection when one side stops sending); reset_peer always
resets with RST; a toxic's toxicity is re-rolled and its timeout timer restarted only when that
toxic is updated (Toxiproxy also does it when a neighbour in its chain is added or removed);
inputs that crash Toxiproxy (a slicer with average_size 0 on data, a negative bandwidth rate)
are served (1-byte slices; nothing passes); names over NAME_LENGTH_MAX, more than
PROXY_COUNT_MAX proxies or TOXIC_COUNT_MAX toxics per proxy, bodies over REQUEST_BODY_BYTES_MAX
are refused; a proxy's upstream connect gives up after UPSTREAM_CONNECT_TIMEOUT_S; error bodies
are sent as application/json; no /metrics endpoint.
"""

from mqmeta.chaos.toxiproxy.datapath import LINK_COUNT_MAX, PIPE_BUFFER_BYTES_MAX, UPSTREAM_CONNECT_TIMEOUT_S
from mqmeta.chaos.toxiproxy.model import (
    API_CONNECTION_COUNT_MAX,
    NAME_LENGTH_MAX,
    PROXY_COUNT_MAX,
    REQUEST_BODY_BYTES_MAX,
    REQUEST_TIMEOUT_S,
    TOXIC_COUNT_MAX,
    TOXIC_TYPES,
    VERSION,
    ApiError,
    Stream,
    Toxic,
    ToxiproxyError,
)
from mqmeta.chaos.toxiproxy.server import (
    DEFAULT_LISTEN,
    ToxiproxyServer,
    add_toxiproxy_arguments,
    main,
    run_toxiproxy,
)

__all__ = [
    "API_CONNECTION_COUNT_MAX",
    "DEFAULT_LISTEN",
    "LINK_COUNT_MAX",
    "NAME_LENGTH_MAX",
    "PIPE_BUFFER_BYTES_MAX",
    "PROXY_COUNT_MAX",
    "REQUEST_BODY_BYTES_MAX",
    "REQUEST_TIMEOUT_S",
    "TOXIC_COUNT_MAX",
    "TOXIC_TYPES",
    "UPSTREAM_CONNECT_TIMEOUT_S",
    "VERSION",
    "ApiError",
    "Stream",
    "Toxic",
    "ToxiproxyError",
    "ToxiproxyServer",
    "add_toxiproxy_arguments",
    "main",
    "run_toxiproxy",
]
