"""The console in a real browser (Debian's chromium, headless, through chromedriver and
Selenium) against one real `mqmeta local up --auth` cluster for the module.

Properties checked:
- cluster.json names the console's URL; the page is served with its vendored uPlot and
  license, a Content-Security-Policy of 'self' (nothing from elsewhere);
- a read token's login shows the overview, which names each broker set and the master's
  address and epoch that the controllers report;
- kill -9 of the master: the page shows the new master and epoch within 3 s of the
  controllers electing it, without a reload (live through the watch stream);
- a search by key finds the message and shows its trace (the replicas that hold it,
  confirmed, the groups that consumed past it);
- a group's backlog grows while its consumer is stopped and falls to 0 once it runs;
- an admin write with a read-only login is refused in the page with the sentence the
  controllers give the CLI for the same token;
- the timeline lists the commands the controllers applied; an AlterSyncStateSet with a
  stale master epoch appears live (no reload), marked fenced with the controllers' sentence;
  a malformed page cursor is 400 with one sentence;
- the message page resends a message to a group (our consumer of %RETRY%GROUP then
  receives it) and requeues one from a %DLQ% topic; with a read-only login both are
  refused with the sentence the CLI prints for the same token;
- writes need the session's CSRF token; bad input (a reversed time range, an unknown
  id, a wrong token) is a status with one sentence.
Screenshots of each page go to the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mqmeta.cluster.wait import wait_for

from mqmeta.broker_client import Consumer
from mqmeta.client import ControllerClient
from mqmeta.errors import MqmetaError
from mqmeta.pb import controller_pb2 as pb
from tests.support.local_up import MQMETA, start_local_up, stop_local_up

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
selenium = pytest.importorskip("selenium")
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip(
        "the console's browser tests need Debian's chromium and chromium-driver", allow_module_level=True
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
FAILOVER_SHOWN_S = 3.0  # from the controllers' election to the page
PAGE_TIMEOUT_S = 15.0
ELECTION_TIMEOUT_S = 30.0
TOPIC = "ConsoleOrders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    proc, document = start_local_up(
        root / "data", "--auth", "--controllers", "1", "--replicas", "2", timeout_s=120
    )
    try:
        document["root"] = root
        run_cli(document, "admin", "topic", "create", TOPIC, "--queues", "2")
        yield document
    finally:
        stop_local_up(proc)


@pytest.fixture(scope="module")
def browser(cluster):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    # chromium leaves an empty org.chromium.Chromium.* directory in TMPDIR per run: keep it in the test's own
    scratch = cluster["root"] / "chromium-tmp"
    scratch.mkdir()
    service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": str(scratch)})
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.get(cluster["console"])
        login(driver, Path(cluster["auth"]["read_token_file"]).read_text().strip())
        yield driver
    finally:
        driver.quit()


def run_cli(cluster: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    data_dir = Path(cluster["root"]) / "data"
    command = [*MQMETA, args[0], "--cluster-dir", str(data_dir), *args[1:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def login(driver, token: str) -> None:
    field = WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: d.find_element(By.ID, "login-token"))
    WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: field.is_displayed())
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: "viewer" in d.find_element(By.ID, "identity").text)


def go(driver, page: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f"#nav a[data-page={page}]").click()
    WebDriverWait(driver, PAGE_TIMEOUT_S).until(
        lambda d: d.find_element(By.ID, f"page-{page}").is_displayed()
    )


def shot(driver, cluster: dict, name: str) -> None:
    driver.save_screenshot(str(Path(cluster["root"]) / f"console-{name}.png"))


def replica_info(cluster: dict) -> pb.ReplicaInfo:
    from mqmeta import auth

    auth.configure(token=Path(cluster["auth"]["admin_token_file"]).read_text().strip())
    try:
        with ControllerClient(",".join(c["grpc"] for c in cluster["controllers"])) as client:
            sets = client.list_broker_sets(pb.ListBrokerSetsRequest()).broker_sets
    finally:
        auth.configure()
    assert len(sets) == 1
    return sets[0]


def attribute(driver, element_id: str, name: str) -> str | None:
    """An attribute read in one step (the page re-renders its tables on every update)."""
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.getAttribute(arguments[1]) : null;",
        element_id,
        name,
    )


def shown_master(driver) -> tuple[str | None, str | None]:
    return attribute(driver, "set-broker-a", "data-master-address"), attribute(
        driver, "set-broker-a", "data-master-epoch"
    )


def fetch(driver, path: str) -> list:
    """[status, error sentence] of a GET made by the page (with its login)."""
    return driver.execute_async_script(
        """const done = arguments[arguments.length - 1];
        fetch(arguments[0], {credentials: "same-origin"}).then(async (r) =>
            done([r.status, (await r.json()).error || ""]));""",
        path,
    )


def http(cluster: dict, path: str, body: dict | None = None, headers: dict | None = None):
    request = urllib.request.Request(
        cluster["console"] + path.lstrip("/"),
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_cluster_json_names_the_console_and_the_page_loads_nothing_from_elsewhere(cluster):
    assert cluster["console"].startswith("http://127.0.0.1:") and cluster["console"].endswith("/")
    status, headers, page = http(cluster, "/")
    assert status == 200 and b"/static/console.js" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert b"http://" not in page and b"https://" not in page
    for path in ("static/vendor/uPlot.iife.min.js", "static/vendor/uPlot.LICENSE.txt"):
        assert http(cluster, path)[0] == 200, path
    assert b"Leon Sorokin" in http(cluster, "static/vendor/uPlot.LICENSE.txt")[2]
    assert http(cluster, "static/../web.py")[0] == 404


def test_reads_need_a_login_and_a_wrong_token_is_one_sentence(cluster):
    status, _, body = http(cluster, "api/overview")
    assert status == 401 and "needs a credential" in json.loads(body)["error"]
    status, _, body = http(cluster, "api/login", {"token": "not-a-token"})
    assert (
        status == 401 and json.loads(body)["error"] == "login refused: the token is not known to this server"
    )


def test_the_overview_names_each_broker_set_and_its_master(cluster, browser):
    info = replica_info(cluster)
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        lambda d: shown_master(d) == (info.master_address, str(info.master_epoch))
    )
    text = browser.find_element(By.ID, "set-broker-a").text
    assert "broker-a" in text and info.master_address in text
    assert "leader c" in browser.find_element(By.ID, "controllers").text
    shot(browser, cluster, "overview")


def test_kill_9_of_the_master_shows_the_new_master_within_3_s_without_a_reload(cluster, browser):
    go(browser, "overview")
    before = replica_info(cluster)
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: shown_master(d)[0] == before.master_address)
    browser.execute_script("window.__same_page = true;")
    master = next(b for b in cluster["brokers"] if b["grpc"] == before.master_address)
    pid = json.loads((Path(cluster["root"]) / "data" / "cluster.json").read_text())
    pid = next(b["pid"] for b in pid["brokers"] if b["grpc"] == master["grpc"])
    os.kill(pid, signal.SIGKILL)
    after = wait_for(
        lambda: replica_info(cluster),
        ELECTION_TIMEOUT_S,
        "the controllers to elect a new master",
        until=lambda i: (
            i.master_epoch > before.master_epoch and i.master_address not in ("", before.master_address)
        ),
        interval_s=0.05,
    )
    elected = time.monotonic()
    WebDriverWait(browser, FAILOVER_SHOWN_S, poll_frequency=0.05).until(
        lambda d: shown_master(d) == (after.master_address, str(after.master_epoch))
    )
    assert time.monotonic() - elected <= FAILOVER_SHOWN_S + 0.5
    assert browser.execute_script("return window.__same_page === true;"), "the page was reloaded"
    shot(browser, cluster, "failover")


def test_a_search_by_key_shows_the_message_and_its_trace(cluster, browser):
    sent = run_cli(cluster, "produce", "--topic", TOPIC, "--count", "3", "--keys", "order-42,vip", "--json")
    assert json.loads(sent.stdout)["acked"] == 3
    go(browser, "search")
    browser.find_element(By.ID, "search-topic").send_keys(TOPIC)
    browser.find_element(By.ID, "search-key").send_keys("order-42")
    browser.find_element(By.CSS_SELECTOR, "#search button").click()
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message"))
    messages = browser.find_elements(By.CSS_SELECTOR, ".message")
    assert len(messages) == 3
    trace = messages[0].find_element(By.CSS_SELECTOR, ".trace").text
    assert trace.startswith("trace: held by the master") and "; confirmed;" in trace, trace
    assert "order-42 vip" in messages[0].text
    shot(browser, cluster, "search")
    # bad input, from the logged-in page: a status and one sentence
    assert fetch(browser, f"/api/search?topic={TOPIC}&key=x&since=5&until=3") == [
        400,
        "the time range ends (3) before it starts (5)",
    ]
    status, sentence = fetch(browser, f"/api/search?topic={TOPIC}&id=0000")
    assert status == 404 and "no message with id 0000" in sentence, sentence


def test_a_groups_backlog_grows_while_its_consumer_is_stopped_and_falls_when_it_runs(cluster, browser):
    group = "console-g1"
    run_cli(cluster, "consume", "--topic", TOPIC, "--group", group, "--until-idle", "1")
    go(browser, "groups")

    def backlog() -> int | None:
        value = attribute(browser, f"group-{group}", "data-backlog")
        return None if value is None else int(value)

    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: backlog() == 0)
    run_cli(cluster, "produce", "--topic", TOPIC, "--count", "40")
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: backlog() == 40)  # live: no reload
    shot(browser, cluster, "groups")
    run_cli(cluster, "consume", "--topic", TOPIC, "--group", group, "--until-idle", "1")
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: backlog() == 0)


def test_an_admin_write_with_a_read_login_is_refused_with_the_servers_sentence(cluster, browser):
    read_token = cluster["auth"]["read_token_file"]
    refused = run_cli(cluster, "admin", "topic", "create", "Nope", "--token-file", read_token, check=False)
    assert refused.returncode != 0
    sentence = refused.stderr.strip().removeprefix("mqmeta: error: ")
    go(browser, "topics")
    browser.find_element(By.ID, "topic-name").send_keys("Nope")
    browser.find_element(By.CSS_SELECTOR, "#create-topic button").click()
    result = browser.find_element(By.ID, "create-topic-result")
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: result.text)
    assert result.text == sentence, (result.text, sentence)
    assert "may only read" in result.text
    shot(browser, cluster, "topics")
    # the brokers' admin write too: resetting a group's offsets
    go(browser, "groups")
    browser.find_element(By.ID, "reset-group").send_keys("console-g1")
    browser.find_element(By.CSS_SELECTOR, "#reset-offsets button").click()
    result = browser.find_element(By.ID, "reset-offsets-result")
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda d: result.text)
    assert result.text == "ResetOffsets refused: identity viewer may only read", result.text
    for page in ("replicator", "events"):
        go(browser, page)
        shot(browser, cluster, page)
    assert browser.find_elements(By.CSS_SELECTOR, "#events .event-role"), "no election in the timeline"


def fenced_write(cluster: dict) -> str:
    """An AlterSyncStateSet with a stale master epoch; the sentence the controllers refuse it with."""
    from mqmeta import auth

    auth.configure(token=Path(cluster["auth"]["admin_token_file"]).read_text().strip())
    try:
        with ControllerClient(",".join(c["grpc"] for c in cluster["controllers"])) as client:
            info = client.list_broker_sets(pb.ListBrokerSetsRequest()).broker_sets[0]
            stale = pb.AlterSyncStateSetRequest(
                cluster=info.cluster,
                broker_name=info.broker_name,
                master_broker_id=info.master_broker_id,
                master_epoch=info.master_epoch - 1,
                sync_state_set_epoch=info.sync_state_set_epoch,
                new_sync_state_set=[info.master_broker_id],
            )
            with pytest.raises(MqmetaError) as fenced:
                client.call("AlterSyncStateSet", stale)
    finally:
        auth.configure()
    assert fenced.value.code == "FENCED_MASTER_EPOCH"
    return fenced.value.message


def test_the_timeline_lists_applied_commands_and_marks_a_fenced_one(cluster, browser):
    go(browser, "events")
    browser.execute_script("window.__same_page = true;")
    sentence = fenced_write(cluster)  # shown live: the page is not reloaded nor left

    def rows(kind: str) -> list[str]:
        return browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((r) => r.textContent);",
            f"#history tr.command-{kind}",
        )

    fenced = WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        lambda d: [r for r in rows("fenced") if "alter_sync_state_set" in r and sentence in r]
    )
    assert "FENCED FENCED_MASTER_EPOCH" in fenced[0], fenced
    assert browser.execute_script("return window.__same_page === true;"), "the page was reloaded"
    assert fetch(browser, "/api/history?before=x") == [400, "before must be a Raft index, got 'x'"]
    assert any("elect_master" in r for r in rows("applied")), "no election among the applied commands"
    shot(browser, cluster, "timeline")


def search_key(driver, topic: str, key: str) -> list:
    go(driver, "search")
    for field, value in (("search-topic", topic), ("search-key", key), ("search-id", "")):
        driver.find_element(By.ID, field).clear()
        if value:
            driver.find_element(By.ID, field).send_keys(value)
    driver.execute_script("document.getElementById('search-results').replaceChildren();")
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    return WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message"))


def resend_in_page(driver, message, group: str | None) -> str:
    """Resends (or with group None, requeues) `message` from its page; the page's answer."""
    if group is None:
        message.find_element(By.CSS_SELECTOR, ".requeue-button").click()
    else:
        message.find_element(By.CSS_SELECTOR, ".resend-group").send_keys(group)
        message.find_element(By.CSS_SELECTOR, ".resend-button").click()
    result = message.find_element(By.CSS_SELECTOR, ".resend-result")
    WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: result.text)
    return result.text


def received_keys(cluster: dict, topic: str, group: str) -> list[str]:
    """The keys of what our consumer of `group` receives from `topic` (at least one message)."""
    from mqmeta import auth

    auth.configure(token=Path(cluster["auth"]["admin_token_file"]).read_text().strip())
    consumer = Consumer([n["grpc"] for n in cluster["namesrv"]], topic, group)
    try:
        received = wait_for(consumer.poll, PAGE_TIMEOUT_S, f"{group} to receive from {topic}")
        consumer.commit()
    finally:
        consumer.close()
        auth.configure()
    return [m.keys for m in received]


def test_resend_and_requeue_from_the_message_page(cluster, browser):
    group, dead_group = "console-resend", "console-dlq"
    run_cli(cluster, "produce", "--topic", TOPIC, "--count", "1", "--keys", "resend-me")
    (message,) = search_key(browser, TOPIC, "resend-me")
    msg_id = message.get_attribute("data-msg-id")
    read_token = cluster["auth"]["read_token_file"]
    refused = run_cli(
        cluster, "admin", "message", "resend", "--id", msg_id, "--group", group, "--token-file", read_token,
        check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    shown = resend_in_page(browser, message, group)
    assert shown == "ResendMessage refused: identity viewer may only read", shown
    # the CLI's sentence names the broker set it asked, then says the same
    assert refused.stderr.strip().endswith(f": {shown}"), (refused.stderr, shown)

    browser.execute_script("window.__before_logout = true;")
    browser.find_element(By.ID, "logout").click()  # the page reloads
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        lambda d: d.execute_script(
            "return window.__before_logout === undefined && document.readyState === 'complete'"
            " && !document.getElementById('login').hidden;"
        )
    )
    browser.find_element(By.ID, "login-token").send_keys(
        Path(cluster["auth"]["admin_token_file"]).read_text().strip()
    )
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        lambda d: "(admin)" in d.find_element(By.ID, "identity").text
    )

    message = search_key(browser, TOPIC, "resend-me")[0]
    shown = resend_in_page(browser, message, group)
    assert shown.startswith(f"resent to %RETRY%{group} "), shown
    shot(browser, cluster, "resend")
    assert received_keys(cluster, f"%RETRY%{group}", group) == ["resend-me"]

    dead_letters = f"%DLQ%{dead_group}"
    run_cli(cluster, "admin", "topic", "create", dead_letters, "--queues", "1")
    run_cli(cluster, "produce", "--topic", dead_letters, "--count", "1", "--keys", "dead-1")
    message = search_key(browser, dead_letters, "dead-1")[0]
    shown = resend_in_page(browser, message, None)
    assert shown.startswith(f"resent to %RETRY%{dead_group} "), shown
    assert received_keys(cluster, f"%RETRY%{dead_group}", dead_group) == ["dead-1"]


def test_a_write_without_the_sessions_csrf_token_is_refused(cluster):
    status, headers, body = http(cluster, "api/session")
    cookie = headers["Set-Cookie"].split(";")[0]
    csrf = json.loads(body)["csrf"]
    status, _, body = http(cluster, "api/topics", {"name": "X"}, {"Cookie": cookie})
    assert status == 403 and "CSRF" in json.loads(body)["error"]
    status, _, body = http(
        cluster,
        "api/topics",
        {"name": "X"},
        {"Cookie": cookie, "X-CSRF-Token": csrf, "Origin": "http://evil.example"},
    )
    assert status == 403 and "origin" in json.loads(body)["error"]


def test_a_console_address_in_use_or_malformed_is_one_sentence(cluster, capsys):
    from mqmeta import auth
    from mqmeta.cli import main

    taken = cluster["console"].removeprefix("http://").rstrip("/")
    controllers = cluster["controllers"][0]["grpc"]
    try:
        for address, expected in (
            (taken, "the port is in use"),
            ("127.0.0.1:http", "--console-listen address"),
        ):
            status = main(
                [
                    "namesrv",
                    "--listen",
                    "127.0.0.1:1",
                    "--controllers",
                    controllers,
                    "--console-listen",
                    address,
                ]
            )
            error = capsys.readouterr().err
            assert status == 2 and expected in error and "Traceback" not in error, error
    finally:
        auth.configure()
