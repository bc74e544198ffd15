"""The fault proxy's HTTP API behaves as Toxiproxy's: Shopify/toxiproxy api_test.go and
proxy_test.go (and the README's HTTP API section) turned into Python, against our server over
HTTP, with the unchanged toxiproxy-python client where it can make the call and raw HTTP where it
cannot. Each test names the Go tests it ports; error texts are compared word for word.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator

import pytest
from mqmeta.chaos.toxiproxy import NAME_LENGTH_MAX, TOXIC_COUNT_MAX, VERSION, ToxiproxyServer, collection
from mqmeta.cluster.ports import PortReservation
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import NotFound, ProxyExists

from tests.support.fault_proxy import (
    Upstream,
    api,
    assert_error,
    connect,
    is_up,
    nothing_arrives,
    round_trip_s,
)

pytest_plugins = ["tests.support.fault_proxy"]  # its fixtures: server, toxiproxy, echo, upstream
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("toxiproxy"),
]  # every proxy deleted after each test

BROWSER = (
    "Mozilla/5.0 (Linux; Android 4.4.2); Nexus 5 Build/KOT49H) AppleWebKit/537.36"
    "(KHTML, like Gecko) Chrome/33.0.1750.117 Mobile Safari/537.36 OPR/20.0.1396.72047"
)


def _port(listen: str) -> int:
    return int(listen.rpartition(":")[2])


@pytest.fixture
def free_ports() -> Iterator[Callable[[int], list[int]]]:
    """Ports held for the test (cluster.ports.PortReservation) that a proxy may listen on. A
    port found by binding port 0 and closing is free for anyone: a cluster on the other
    worker could reserve it meanwhile, and the proxy, listening first, would take it from
    that cluster's process ("Address already in use" in a CI run)."""
    held: list[PortReservation] = []

    def take(count: int) -> list[int]:
        held.append(PortReservation.pick(count))
        return held[-1].ports

    yield take
    for reservation in held:
        reservation.release()


# --- middleware: request id, browsers, version --------------------------------------------------


def test_every_answer_carries_a_request_id(server: ToxiproxyServer) -> None:
    """TestRequestId: X-Toxiproxy-Request-Id on answers, errors included; a new id each time."""
    ids = []
    for path in ("/version", "/proxies", "/proxies/nope"):
        answer = api(server, "GET", path, headers={"User-Agent": "curl"})
        ids.append(answer.headers["X-Toxiproxy-Request-Id"])
    assert all(ids) and len(set(ids)) == 3


def test_browsers_are_refused_with_403(server: ToxiproxyServer) -> None:
    """TestBrowserGets403, TestNonBrowserGets200: a Mozilla/ user agent gets 403 (a web page must
    not drive the API), on every route and method; other agents are served."""
    for method, path in (("GET", "/proxies"), ("POST", "/reset"), ("GET", "/version")):
        refused = api(server, method, path, headers={"User-Agent": BROWSER})
        assert refused.status == 403 and refused.body == "User agent not allowed\n", refused
    assert api(server, "GET", "/proxies", headers={"User-Agent": "Wget/2.1"}).status == 200
    assert api(server, "POST", "/reset", headers={"User-Agent": "Wget/2.1"}).status == 204


def test_version_is_json(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestVersionEndpointReturnsVersion: GET /version is {"version": "..."} and a newline."""
    answer = api(server, "GET", "/version")
    assert answer.status == 200 and answer.body == {"version": VERSION}
    assert answer.headers["Content-Type"] == "application/json;charset=utf-8"
    assert toxiproxy.version() == f'{{"version": "{VERSION}"}}\n'.encode()  # the client reads it raw


# --- proxies ------------------------------------------------------------------------------------


def test_index_create_show_and_listen_resolution(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, free_ports: Callable[[int], list[int]]
) -> None:
    """TestIndexWithNoProxies, TestListingProxies, TestCreateAndGetProxy: an empty index; a proxy
    created on "localhost:PORT" listens on and shows "127.0.0.1:PORT", enabled, without toxics;
    the upstream is kept as written (it is only dialled when a client connects)."""
    assert api(server, "GET", "/proxies").body == {}
    (port,) = free_ports(1)
    body = {"name": "mysql_master", "listen": f"localhost:{port}", "upstream": "localhost:20001"}
    created = api(server, "POST", "/proxies", body)
    expected = {
        "name": "mysql_master",
        "listen": f"127.0.0.1:{port}",
        "upstream": "localhost:20001",
        "enabled": True,
        "toxics": [],
    }
    assert created.status == 201 and created.body == expected
    assert api(server, "GET", "/proxies").body == {"mysql_master": expected}
    assert api(server, "GET", "/proxies/mysql_master").body == expected
    assert is_up(f"127.0.0.1:{port}")


def test_listen_hostnames_and_empty_listen(server: ToxiproxyServer, toxiproxy: Toxiproxy, echo: str) -> None:
    """Hostnames other than localhost are resolved (this machine's name here); an empty listen
    address, or port 0, picks a free port; a name that does not resolve is Go's 500."""
    hostname = socket.gethostname()
    if not socket.gethostbyname(hostname).startswith("127."):
        pytest.skip(f"{hostname} does not resolve to a loopback address")
    named = api(server, "POST", "/proxies", {"name": "named", "listen": f"{hostname}:0", "upstream": echo})
    assert named.status == 201, named
    host, port = named.body["listen"].rsplit(":", 1)
    assert host.startswith("127.") and int(port) > 0
    with connect(named.body["listen"]) as sock:
        assert round_trip_s(sock) < 2.0
    for name, fields in (("empty", {"listen": ""}), ("absent", {})):
        created = api(server, "POST", "/proxies", {"name": name, "upstream": echo, **fields})
        assert created.status == 201 and _port(created.body["listen"]) > 0, created
        with connect(created.body["listen"]) as sock:
            assert round_trip_s(sock) < 2.0
    unknown = api(server, "POST", "/proxies", {"name": "x", "listen": "nohost.invalid:0", "upstream": echo})
    assert unknown.status == 500 and unknown.body["error"].startswith("listen tcp: lookup nohost.invalid: ")


def test_create_needs_a_name_and_an_upstream(server: ToxiproxyServer) -> None:
    """TestCreateProxyBlankName, TestCreateProxyBlankUpstream: Toxiproxy's words and status 400."""
    assert_error(
        api(server, "POST", "/proxies", {"name": "", "upstream": ""}), 400, "missing required field: name"
    )
    assert_error(api(server, "POST", "/proxies", {"name": "test"}), 400, "missing required field: upstream")
    assert api(server, "GET", "/proxies").body == {}


def test_create_disabled_then_enable_and_disable(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, free_ports: Callable[[int], list[int]]
) -> None:
    """TestCreateDisabledProxy, TestCreateDisabledProxyAndEnable, TestStopProxyBeforeStarting: a
    proxy created disabled keeps its listen text as given and does not listen; enabling it
    listens, disabling stops it again."""
    (port,) = free_ports(1)
    body = {
        "name": "mysql_master",
        "listen": f"localhost:{port}",
        "upstream": "localhost:20001",
        "enabled": False,
    }
    created = api(server, "POST", "/proxies", body)
    assert (
        created.status == 201
        and created.body["listen"] == f"localhost:{port}"
        and not created.body["enabled"]
    )
    assert not is_up(f"127.0.0.1:{port}")
    enabled = api(server, "POST", "/proxies/mysql_master", {"enabled": True})
    assert enabled.status == 200 and enabled.body["enabled"] and enabled.body["listen"] == f"127.0.0.1:{port}"
    assert is_up(f"127.0.0.1:{port}")
    disabled = api(server, "PATCH", "/proxies/mysql_master", {"enabled": False})
    assert disabled.status == 200 and not disabled.body["enabled"]
    assert not is_up(f"127.0.0.1:{port}")
    proxy = toxiproxy.get_proxy("mysql_master")
    assert proxy is not None
    for _ in range(3):  # TestClosingProxyMultipleTimes
        proxy.disable()
    proxy.enable()
    assert is_up(f"127.0.0.1:{port}")


def test_delete(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestDeleteProxy: a deleted proxy stops listening and leaves the index; deleting it again
    answers 404 "proxy not found"."""
    proxy = toxiproxy.create(upstream="localhost:20001", name="mysql_master")
    assert is_up(proxy.listen)
    assert proxy.destroy() is True
    assert not is_up(proxy.listen) and toxiproxy.proxies() == {}
    assert_error(api(server, "DELETE", "/proxies/mysql_master"), 404, "proxy not found")
    with pytest.raises(NotFound):
        proxy.destroy()


def test_duplicate_listen_and_duplicate_name(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestCreateProxyPortConflict, TestStartTwoProxiesOnSameAddress, TestCreateProxyNameConflict,
    TestRestartFailedToStartProxy: a taken listen address is Go's error with status 500, a taken
    name 409; once the first proxy is gone, the second can be created and enabled."""
    first = api(
        server, "POST", "/proxies", {"name": "mysql_master", "listen": "localhost:0", "upstream": "x:1"}
    )
    listen = first.body["listen"]
    conflict = api(server, "POST", "/proxies", {"name": "test", "listen": listen, "upstream": "x:1"})
    assert_error(conflict, 500, f"listen tcp {listen}: bind: address already in use")
    assert set(api(server, "GET", "/proxies").body) == {"mysql_master"}
    disabled = api(
        server, "POST", "/proxies", {"name": "test", "listen": listen, "upstream": "x:1", "enabled": False}
    )
    assert disabled.status == 201
    assert_error(
        api(server, "POST", "/proxies/test", {"enabled": True}),
        500,
        f"listen tcp {listen}: bind: address already in use",
    )
    assert_error(
        api(server, "POST", "/proxies", {"name": "mysql_master", "upstream": "x:1"}),
        409,
        "proxy already exists",
    )
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream="x:1", name="mysql_master")
    assert api(server, "DELETE", "/proxies/mysql_master").status == 204
    assert api(server, "POST", "/proxies/test", {"enabled": True}).body["enabled"] is True
    assert is_up(listen)


def test_update_moves_restarts_or_keeps_connections(server: ToxiproxyServer, echo: str) -> None:
    """TestProxyUpdate, TestProxyUpdateWithHostname, TestProxyDiffers (and 2.12's changelog): a new
    listen address moves the proxy; re-saving the same proxy, even with "localhost" for
    "127.0.0.1", keeps its live connections and toxics; a new upstream restarts it (connections
    dropped, toxics kept); fields left out keep their value."""
    created = api(
        server, "POST", "/proxies", {"name": "test", "upstream": echo, "listen": "127.0.0.1:0"}
    ).body
    api(server, "POST", "/proxies/test/toxics", {"type": "noop"})
    moved = api(server, "PATCH", "/proxies/test", {"listen": "localhost:0"}).body
    assert moved["listen"] != created["listen"] and is_up(moved["listen"]) and not is_up(created["listen"])
    port = _port(moved["listen"])
    with connect(moved["listen"]) as sock:
        assert round_trip_s(sock) < 2.0
        for same in ({"listen": f"localhost:{port}"}, moved, {"upstream": echo, "enabled": True}, {}):
            kept = api(server, "POST", "/proxies/test", same)
            assert kept.status == 200 and kept.body["listen"] == moved["listen"], kept
            assert nothing_arrives(sock, 0.05) and round_trip_s(sock) < 2.0  # the same connection
        assert len(kept.body["toxics"]) == 1
        restarted = api(server, "POST", "/proxies/test", {"upstream": echo.replace("127.0.0.1", "localhost")})
        assert restarted.body["listen"] == moved["listen"] and len(restarted.body["toxics"]) == 1
        try:
            assert sock.recv(16) == b""
        except ConnectionResetError:
            pass
    with connect(moved["listen"]) as again:
        assert round_trip_s(again) < 2.0


def test_refused_upstream_closes_the_client(toxiproxy: Toxiproxy) -> None:
    """TestProxyToDownUpstream: a client of a proxy whose upstream refuses is closed; the proxy
    keeps serving."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_upstream = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: refuses
        proxy = toxiproxy.create(upstream=dead_upstream, name="dead")
        for _ in range(2):
            with connect(proxy.listen) as sock:
                try:
                    assert sock.recv(16) == b""
                except ConnectionResetError:
                    pass
    assert toxiproxy.get_proxy("dead") is not None


# --- populate -----------------------------------------------------------------------------------


def test_populate_creates_enabled_by_default_or_disabled(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, free_ports: Callable[[int], list[int]]
) -> None:
    """TestPopulateProxy, TestPopulateDefaultEnabled, TestPopulateDisabledProxy,
    TestPopulateAddToxic: 201 with the proxies in order; enabled unless the entry says false."""
    ports = free_ports(2)
    answer = api(
        server,
        "POST",
        "/populate",
        [
            {
                "name": "one",
                "listen": f"localhost:{ports[0]}",
                "upstream": "localhost:7171",
                "enabled": False,
            },
            {"name": "two", "listen": f"localhost:{ports[1]}", "upstream": "localhost:7474"},
        ],
    )
    assert answer.status == 201 and [p["name"] for p in answer.body["proxies"]] == ["one", "two"]
    assert [p["enabled"] for p in answer.body["proxies"]] == [False, True]
    assert not is_up(f"127.0.0.1:{ports[0]}") and is_up(f"127.0.0.1:{ports[1]}")
    assert api(server, "POST", "/proxies/two/toxics", {"type": "latency"}).status == 200


def test_populate_leaves_an_unchanged_proxy_untouched(server: ToxiproxyServer, echo: str) -> None:
    """TestPopulateExistingProxy: an entry equal to an existing proxy ("localhost" resolving to its
    address) leaves it exactly as it is: its toxics, its connections, and enabled even when the
    entry says enabled: false."""
    one = api(server, "POST", "/proxies", {"name": "one", "listen": "localhost:0", "upstream": echo}).body
    api(server, "POST", "/proxies", {"name": "two", "listen": "localhost:0", "upstream": "localhost:7474"})
    api(server, "POST", "/proxies/one/toxics", {"type": "latency", "stream": "downstream"})
    entry = {"name": "one", "listen": f"localhost:{_port(one['listen'])}", "upstream": echo, "enabled": False}
    with connect(one["listen"]) as sock:
        assert round_trip_s(sock) < 2.0
        answer = api(
            server, "POST", "/populate", [entry, {"name": "two", "listen": "127.0.0.1:0", "upstream": "x:2"}]
        )
        assert answer.status == 201, answer
        kept, replaced = answer.body["proxies"]
        assert kept["listen"] == one["listen"] and kept["enabled"] is True
        assert [t["type"] for t in kept["toxics"]] == ["latency"]
        assert replaced["upstream"] == "x:2" and is_up(replaced["listen"])
        assert round_trip_s(sock) < 2.0  # the same connection still carries data


def test_populate_replaces_a_changed_proxy_without_its_toxics(server: ToxiproxyServer, echo: str) -> None:
    """README "Populating Proxies": a proxy whose upstream or listen differs is replaced by a new
    one, so its toxics are gone and its connections closed."""
    one = api(server, "POST", "/proxies", {"name": "one", "listen": "127.0.0.1:0", "upstream": echo}).body
    api(server, "POST", "/proxies/one/toxics", {"type": "latency"})
    with connect(one["listen"]) as sock:
        assert round_trip_s(sock) < 2.0
        entry = {"name": "one", "listen": one["listen"], "upstream": echo.replace("127.0.0.1", "localhost")}
        answer = api(server, "POST", "/populate", [entry])
        assert answer.status == 201 and answer.body["proxies"][0]["toxics"] == [], answer
        try:
            assert sock.recv(16) == b""
        except ConnectionResetError:
            pass
    assert api(server, "GET", "/proxies/one").body["toxics"] == []


def test_populate_checks_every_entry_before_creating_any(server: ToxiproxyServer) -> None:
    """TestPopulateWithBadName: a missing name or upstream is refused with "at proxy N" and
    nothing is created; a body of the wrong shape is a bad request body."""
    answer = api(
        server,
        "POST",
        "/populate",
        [{"name": "one", "listen": "localhost:0", "upstream": "localhost:7171"}, {"name": "", "listen": ""}],
    )
    assert_error(answer, 400, "missing required field: name at proxy 2")
    answer = api(server, "POST", "/populate", [{"name": "one", "upstream": "x:1"}, {"name": "b"}])
    assert_error(answer, 400, "missing required field: upstream at proxy 2")
    assert api(server, "GET", "/proxies").body == {}
    assert api(server, "POST", "/populate", {"name": "one"}).body["error"].startswith("bad request body: ")


def test_populate_stops_at_a_bad_entry_and_keeps_those_before(server: ToxiproxyServer) -> None:
    """TestPopulateProxyWithBadDataShouldReturnError: an entry that cannot listen stops the
    populate there: the proxies before it are created and listed in the error body, none after."""
    answer = api(
        server,
        "POST",
        "/populate",
        [
            {"name": "one", "listen": "localhost:0", "upstream": "localhost:7171"},
            {"name": "two", "listen": "local373", "upstream": "localhost:7474"},
            {"name": "three", "listen": "localhost:0", "upstream": "localhost:7676"},
        ],
    )
    assert answer.status == 500, answer
    assert answer.body["error"] == "listen tcp: address local373: missing port in address"
    assert [p["name"] for p in answer.body["proxies"]] == ["one"]
    proxies = api(server, "GET", "/proxies").body
    assert set(proxies) == {"one"} and is_up(proxies["one"]["listen"])


def test_server_populate_call_and_config(server: ToxiproxyServer, toxiproxy: Toxiproxy, echo: str) -> None:
    """ToxiproxyServer.populate (what --config uses) has the same semantics as POST /populate."""
    created = server.populate([{"name": "c", "upstream": echo, "listen": "127.0.0.1:0"}])
    assert [p["name"] for p in created] == ["c"] and set(toxiproxy.proxies()) == {"c"}
    assert server.populate(
        [{"name": "c", "upstream": echo, "listen": created[0]["listen"], "enabled": False}]
    )[0]["enabled"]


# --- reset and toxics -----------------------------------------------------------------------------


def test_reset_enables_every_proxy_and_removes_every_toxic(
    server: ToxiproxyServer, toxiproxy: Toxiproxy
) -> None:
    """TestResetState: after POST /reset (204) a disabled proxy listens again on its address and
    has no toxics."""
    proxy = toxiproxy.create(upstream="localhost:20001", name="mysql_master")
    answer = api(
        server,
        "POST",
        "/proxies/mysql_master/toxics",
        {"type": "latency", "stream": "downstream", "attributes": {"latency": 100, "jitter": 10}},
    )
    assert answer.body["attributes"] == {"latency": 100, "jitter": 10}
    proxy.disable()
    assert not is_up(proxy.listen)
    assert toxiproxy.reset() is True
    shown = api(server, "GET", "/proxies/mysql_master").body
    assert shown["enabled"] is True and shown["listen"] == proxy.listen and shown["toxics"] == []
    assert is_up(proxy.listen)


def test_toxics_listed_added_updated_removed(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestListingToxics, TestAddToxic, TestAddMultipleToxics, TestAddToxicWithToxicity,
    TestUpdateToxics, TestRemoveToxic: defaults (name type_stream, stream downstream, toxicity 1,
    attributes 0), upstream toxics listed first, updates merge attributes and keep what is left
    out, removal."""
    toxiproxy.create(upstream="localhost:20001", name="mysql_master")
    toxics = "/proxies/mysql_master/toxics"
    assert api(server, "GET", toxics).body == []
    added = api(
        server,
        "POST",
        toxics,
        {"name": "foobar", "type": "latency", "attributes": {"latency": 100, "jitter": 10}},
    )
    assert added.status == 200 and added.body == {
        "attributes": {"latency": 100, "jitter": 10},
        "name": "foobar",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }
    api(server, "POST", toxics, {"name": "latency2", "type": "latency"})
    api(server, "POST", toxics, {"type": "latency", "stream": "upstream", "toxicity": 0.2})
    listed = api(server, "GET", toxics).body
    assert [(t["name"], t["stream"]) for t in listed] == [
        ("latency_upstream", "upstream"),
        ("foobar", "downstream"),
        ("latency2", "downstream"),
    ]
    assert listed[0]["toxicity"] == 0.2 and listed[2]["attributes"] == {"latency": 0, "jitter": 0}
    updated = api(
        server, "PATCH", toxics + "/foobar", {"toxicity": 0.5, "attributes": {"latency": 1000}}
    ).body
    assert updated["toxicity"] == 0.5 and updated["attributes"] == {"latency": 1000, "jitter": 10}
    updated = api(server, "POST", toxics + "/foobar", {"attributes": {"latency": 500}}).body
    assert updated["toxicity"] == 0.5 and updated["attributes"] == {"latency": 500, "jitter": 10}
    assert api(server, "GET", toxics + "/foobar").body == updated
    assert api(server, "DELETE", toxics + "/foobar").status == 204
    assert [t["name"] for t in api(server, "GET", toxics).body] == ["latency_upstream", "latency2"]
    assert_error(api(server, "DELETE", toxics + "/foobar"), 404, "toxic not found")
    assert_error(api(server, "GET", toxics + "/foobar"), 404, "toxic not found")
    assert_error(api(server, "POST", "/proxies/nope/toxics", {"type": "latency"}), 404, "proxy not found")


def test_toxic_name_conflicts(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestAddConflictingToxic, TestAddConflictingToxicsMultistream,
    TestAddConflictingToxicsMultistreamDefaults: a name is taken across both streams (409); the
    default names of the two streams differ."""
    toxiproxy.create(upstream="localhost:20001", name="mysql_master")
    toxics = "/proxies/mysql_master/toxics"
    assert (
        api(server, "POST", toxics, {"name": "foobar", "type": "latency", "stream": "upstream"}).status == 200
    )
    for body in (
        {"name": "foobar", "type": "slow_close"},
        {"name": "foobar", "type": "latency", "stream": "downstream"},
    ):
        assert_error(api(server, "POST", toxics, body), 409, "toxic already exists")
    assert api(server, "POST", toxics, {"type": "latency", "stream": "upstream"}).status == 200
    assert api(server, "POST", toxics, {"type": "latency", "stream": "downstream"}).status == 200
    names = [(t["name"], t["type"], t["stream"]) for t in api(server, "GET", toxics).body]
    assert names == [
        ("foobar", "latency", "upstream"),
        ("latency_upstream", "latency", "upstream"),
        ("latency_downstream", "latency", "downstream"),
    ]


def test_noop_toxic_and_case_insensitive_stream(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """TestAddNoop, TestInvalidStream, stream.TestParseDirection: noop is a toxic type; the stream
    is read in any letter case and shown as written; another stream is refused."""
    toxiproxy.create(upstream="localhost:20001", name="mysql_master")
    toxics = "/proxies/mysql_master/toxics"
    noop = api(server, "POST", toxics, {"name": "foobar", "type": "noop"}).body
    assert noop == {"attributes": {}, "name": "foobar", "type": "noop", "stream": "downstream", "toxicity": 1}
    upper = api(server, "POST", toxics, {"type": "latency", "stream": "UpStream"})
    assert (
        upper.status == 200
        and upper.body["name"] == "latency_UpStream"
        and upper.body["stream"] == "UpStream"
    )
    for stream in ("walrustream", ""):
        answer = api(server, "POST", toxics, {"type": "latency", "stream": stream})
        assert_error(answer, 400, "stream was invalid, can be either upstream or downstream")
    assert_error(api(server, "POST", toxics, {"type": "bogus"}), 400, "invalid toxic type")
    assert_error(api(server, "POST", toxics, {}), 400, "invalid toxic type")


def test_bodies_as_gos_decoder_reads_them(server: ToxiproxyServer, toxiproxy: Toxiproxy) -> None:
    """Unknown fields and attributes are ignored; null keeps the default; a field of the wrong
    type is a bad request body naming the Go field; a toxic update ignores name, type and stream;
    out-of-range toxicity and negative attributes are accepted (Toxiproxy does not check them)."""
    created = api(
        server, "POST", "/proxies", {"name": "p", "upstream": "x:1", "listen": "127.0.0.1:0", "color": "red"}
    )
    assert created.status == 201 and created.body["enabled"] is True
    toxics = "/proxies/p/toxics"
    added = api(
        server,
        "POST",
        toxics,
        {"type": "latency", "stream": None, "attributes": {"latency": 5, "ms": 7}, "x": 1},
    )
    assert added.status == 200 and added.body["attributes"] == {"latency": 5, "jitter": 0}, added
    for body, message in (
        (
            {"name": 5, "upstream": "x:1"},
            "json: cannot unmarshal number into Go struct field Proxy.name of type string",
        ),
        (
            {"name": "q", "upstream": "x:1", "enabled": "yes"},
            "json: cannot unmarshal string into Go struct field Proxy.enabled of type bool",
        ),
        ([1], "json: cannot unmarshal array into Go value of type toxiproxy.Proxy"),
    ):
        assert_error(api(server, "POST", "/proxies", body), 400, f"bad request body: {message}")
    for body, message in (
        (
            {"type": "bandwidth", "attributes": {"rate": "100"}},
            "string into Go struct field BandwidthToxic.attributes.rate of type int64",
        ),
        (
            {"type": "bandwidth", "attributes": {"rate": 1.5}},
            "number 1.5 into Go struct field BandwidthToxic.attributes.rate of type int64",
        ),
        (
            {"type": "latency", "toxicity": "high"},
            "string into Go struct field ToxicWrapper.toxicity of type float32",
        ),
    ):
        assert_error(
            api(server, "POST", toxics, body), 400, f"bad request body: json: cannot unmarshal {message}"
        )
    assert api(server, "POST", "/proxies", b"{nope").body["error"].startswith("bad request body: ")
    assert_error(api(server, "POST", "/proxies", b""), 400, "bad request body: EOF")
    renamed = api(
        server,
        "PATCH",
        toxics + "/latency_downstream",
        {"name": "z", "type": "timeout", "stream": "upstream"},
    )
    assert renamed.body == added.body
    odd = api(server, "POST", toxics, {"type": "timeout", "toxicity": 1.5, "attributes": {"timeout": -1}})
    assert odd.status == 200 and odd.body["toxicity"] == 1.5 and odd.body["attributes"] == {"timeout": -1}


def test_chunked_bodies_keep_alive_and_size_limit(server: ToxiproxyServer) -> None:
    """A chunked request body is read (Go's server reads them); several requests share one
    connection; a body over the limit is answered 413 before it is sent, then the connection is
    closed."""
    answer = api(
        server,
        "POST",
        "/proxies",
        {"name": "chunky", "upstream": "x:1", "listen": "127.0.0.1:0"},
        chunked=True,
    )
    assert answer.status == 201 and answer.body["name"] == "chunky"
    connection = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        sockets = []
        for _ in range(3):
            connection.request("GET", "/proxies/chunky")
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read())["name"] == "chunky"
            sockets.append(connection.sock)  # http.client drops the socket when the server closes
        assert sockets[0] is not None and sockets == [sockets[0]] * 3
    finally:
        connection.close()
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
        answer_bytes = b""
        while piece := sock.recv(65536):
            answer_bytes += piece
    assert answer_bytes.startswith(b"HTTP/1.1 413 ") and b'"status":413' in answer_bytes


def test_our_bounds(server: ToxiproxyServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Toxiproxy leaves unbounded is bounded here, each with a 400 that says the limit: name
    length, proxies (PROXY_COUNT_MAX, lowered to 2 here), toxics per proxy."""
    monkeypatch.setattr(collection, "PROXY_COUNT_MAX", 2)
    long_name = "n" * (NAME_LENGTH_MAX + 1)
    assert_error(
        api(server, "POST", "/proxies", {"name": long_name, "upstream": "x:1"}),
        400,
        f"name is longer than {NAME_LENGTH_MAX} characters",
    )
    for name in ("a", "b"):
        assert (
            api(server, "POST", "/proxies", {"name": name, "upstream": "x:1", "enabled": False}).status == 201
        )
    assert_error(
        api(server, "POST", "/proxies", {"name": "c", "upstream": "x:1"}), 400, "too many proxies: at most 2"
    )
    for number in range(TOXIC_COUNT_MAX):
        assert api(server, "POST", "/proxies/a/toxics", {"name": f"t{number}", "type": "noop"}).status == 200
    too_many = api(server, "POST", "/proxies/a/toxics", {"name": "one_more", "type": "noop"})
    assert_error(too_many, 400, f"too many toxics on proxy a: at most {TOXIC_COUNT_MAX}")


def test_unknown_routes_and_methods(server: ToxiproxyServer) -> None:
    """Routes outside the API are 404, a method a route does not take is 405 (as gorilla/mux)."""
    assert api(server, "GET", "/proxies/a/b/c").status == 404
    assert api(server, "PUT", "/proxies").status == 405
    assert api(server, "DELETE", "/reset").status == 405


def test_upstream_reached_after_create(
    server: ToxiproxyServer, toxiproxy: Toxiproxy, upstream: Upstream
) -> None:
    """The upstream is dialled per client connection: data goes both ways through a new proxy."""
    proxy = toxiproxy.create(upstream=upstream.address, name="test")
    with connect(proxy.listen) as client:
        with upstream.accept() as held:
            client.sendall(b"hello world")
            assert held.recv(64) == b"hello world"
            held.sendall(b"back")
            assert client.recv(64) == b"back"
