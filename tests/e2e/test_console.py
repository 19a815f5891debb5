"""The web console (issue #18 item 4) in a real headless Chromium, driven by Selenium
through Debian's chromedriver, against a real node with its HTTP listener on.

What these tests hold the console to:
- every page (overview, topics, a topic, its messages, groups, a group) loads with no
  error in the browser's console, at 1280x800 and at a phone's 390x844; a screenshot of
  each is kept under target/e2e-artifacts/console/;
- a topic a client (confluent-kafka) created shows, with its partitions, leaders and
  configs;
- the message browser shows the values produced, from an offset or the end, as text, JSON
  or hex, filtered by key;
- a group's lag shows, and goes to zero on the page once its consumer has committed;
- create topic through the page makes the topic; the JSON API refuses bad input with 4xx;
- the metrics page charts the node's own /metrics: records and bytes in per second show
  above zero while a client produces.

`cargo xtask test` installs chromium and chromium-driver with apt-get when they are
missing and passes their paths in CHROMIUM and CHROMEDRIVER; without them these tests
skip, or fail on CI (RILL_E2E_REQUIRE_CHROMIUM=1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from kafka_helpers import admin, create_topic, unique_topic, wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "target" / "e2e-artifacts" / "console"
HTTP_ON = {"http.listeners": "127.0.0.1:0"}
DESKTOP = (1280, 800)
PHONE = (390, 844)
WAIT_S = 30


def _require(what: str) -> None:
    if os.environ.get("RILL_E2E_REQUIRE_CHROMIUM") == "1":
        pytest.fail(f"{what} is required here (RILL_E2E_REQUIRE_CHROMIUM=1)")
    pytest.skip(f"{what} (`cargo xtask test` installs chromium and chromium-driver with apt-get)")


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium through chromedriver, with the browser console's log kept."""
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium")
    driver_path = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromium or not driver_path:
        _require("chromium and chromedriver are not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _require("selenium is not installed in this interpreter (tests/e2e/requirements.txt)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver's path given explicitly: Selenium Manager then downloads nothing.
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def node(rill_factory):
    server = rill_factory(overrides=HTTP_ON)
    return server, f"http://{server.http_address()}"


def console_errors(driver) -> list[str]:
    """The browser console's errors since the last call (reading the log empties it)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_text(driver, css: str, text: str, timeout_s: float = WAIT_S) -> None:
    """Waits until the element `css` contains `text`."""
    from selenium.webdriver.common.by import By

    def has() -> bool:
        try:
            # textContent, not .text: a cell scrolled out of a narrow table still counts.
            return any(
                text in (e.get_attribute("textContent") or "")
                for e in driver.find_elements(By.CSS_SELECTOR, css)
            )
        except Exception:  # a node replaced by a re-poll between find and read
            return False

    try:
        wait_for(has, timeout_s, f"{text!r} in {css}")
    except AssertionError as error:
        shown = [e.get_attribute("textContent") for e in driver.find_elements(By.CSS_SELECTOR, css)]
        raise AssertionError(f"{error}; {css} shows {shown!r}") from None


def wait_updated(driver) -> None:
    """Waits until the page has polled the API successfully at least once."""
    wait_text(driver, "#updated", "Updated")


def screenshot(driver, name: str) -> None:
    """The whole page (the window grown to the page's height for the shot, at most
    4000 px), as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = driver.get_window_size()
    inner = driver.execute_script("return window.innerHeight")
    page = driver.execute_script("return document.documentElement.scrollHeight")
    chrome = size["height"] - inner
    driver.set_window_size(size["width"], min(4000, max(size["height"], page + chrome)))
    try:
        driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    finally:
        driver.set_window_size(size["width"], size["height"])


def api(base: str, method: str, path: str, body=None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/api{path}", data=data, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return error.code, json.loads(body or b"null")
        except ValueError:  # axum's own refusals (413) are plain text
            return error.code, {"raw": body.decode(errors="replace")}


def produce(bootstrap: str, topic: str, records: list[tuple[str, str]], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(
            topic, key=key, value=value, partition=partition, headers=[("source", b"console-test")]
        )
    assert producer.flush(30) == 0


def group_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )


def consume(consumer: Consumer, count: int) -> list:
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.consume(count - len(got), timeout=1.0)
    assert len(got) == count, f"read {len(got)} of {count}"
    return got


def test_every_page_loads_without_console_errors(node, browser):
    server, base = node
    topic = unique_topic("console-pages")
    group = f"{topic}-readers"
    create_topic(server.bootstrap, topic, 3)
    produce(server.bootstrap, topic, [(f"user-{i}", json.dumps({"n": i})) for i in range(10)])
    consumer = group_consumer(server.bootstrap, group)
    consumer.subscribe([topic])
    try:
        consume(consumer, 4)
        consumer.commit(asynchronous=False)
        pages = [
            ("overview", "#/", "Cluster overview"),
            ("topics", "#/topics", topic),
            ("topic", f"#/topics/{topic}", f"Partitions of {topic}"),
            ("messages", f"#/topics/{topic}/messages", "user-9"),
            ("groups", "#/groups", group),
            ("group", f"#/groups/{group}", f"Committed offsets and lag of {group}"),
            ("metrics", "#/metrics", "Bytes in and out per second"),
        ]
        for size_name, size in [("desktop", DESKTOP), ("phone", PHONE)]:
            browser.set_window_size(*size)
            for name, route, expect in pages:
                browser.get(f"{base}/{route}")
                wait_updated(browser)
                wait_text(browser, "main", expect)
                screenshot(browser, f"{name}-{size_name}")
                assert console_errors(browser) == [], f"{name} ({size_name}) logged errors"
        browser.set_window_size(*DESKTOP)
        # The overview's counts: one broker, the active controller, our topic's partitions.
        browser.get(f"{base}/#/")
        wait_updated(browser)
        wait_text(browser, ".cards", "Active controller")
        wait_text(browser, "main table", server.bootstrap)
        wait_text(browser, "main table", "active controller")
    finally:
        consumer.close()


def test_topic_created_by_a_client_shows_its_partitions_and_configs(node, browser):
    server, base = node
    topic = unique_topic("console-topic")
    create_topic(server.bootstrap, topic, 3)
    browser.get(f"{base}/#/topics")
    wait_text(browser, "main table", topic)
    from selenium.webdriver.common.by import By

    browser.find_element(By.LINK_TEXT, topic).click()
    wait_text(browser, "main", f"Partitions of {topic}")
    wait_text(browser, "main", "retention.ms")
    wait_for(
        lambda: len(browser.find_elements(By.XPATH, "//caption[starts-with(., 'Partitions of')]/../tbody/tr")) == 3,
        WAIT_S,
        "three partition rows",
    )
    # Edit a config through the page, and see the broker took it.
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "config-name")).select_by_value("retention.ms")
    browser.find_element(By.ID, "config-value").send_keys("3600000")
    browser.find_element(By.CSS_SELECTOR, "#edit-config button[type=submit]").click()
    wait_text(browser, "#edit-config .msg", "Set retention.ms = 3600000")
    status, body = api(base, "GET", f"/topics/{topic}")
    assert status == 200
    retention = next(c for c in body["configs"] if c["name"] == "retention.ms")
    assert retention["value"] == "3600000" and not retention["is_default"]
    # Add partitions through the page.
    count = browser.find_element(By.ID, "partition-count")
    count.clear()
    count.send_keys("5")
    browser.find_element(By.CSS_SELECTOR, "#add-partitions button").click()
    wait_text(browser, "#add-partitions .msg", "now has 5 partitions")
    assert len(admin(server.bootstrap).list_topics(topic, timeout=10).topics[topic].partitions) == 5
    screenshot(browser, "topic-edited")
    assert console_errors(browser) == []


def test_message_browser_shows_the_values_produced(node, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    server, base = node
    topic = unique_topic("console-browse")
    create_topic(server.bootstrap, topic, 1)
    records = [
        (f"user-{i}", json.dumps({"order": i, "item": f"widget {i}"}, separators=(",", ":")))
        for i in range(30)
    ]
    produce(server.bootstrap, topic, records)

    # From the end: the last 50 (all 30), as text.
    browser.get(f"{base}/#/topics/{topic}/messages")
    wait_text(browser, "main table", '{"order":29,"item":"widget 29"}')
    wait_text(browser, "main table", "console-test")  # a header's value
    # From an offset, as pretty JSON.
    Select(browser.find_element(By.ID, "browse-from")).select_by_value("offset")
    offset = browser.find_element(By.ID, "browse-offset")
    offset.clear()
    offset.send_keys("25")
    Select(browser.find_element(By.ID, "browse-encoding")).select_by_value("json")
    wait_text(browser, "main table", '"item": "widget 25"')
    table = browser.find_element(By.CSS_SELECTOR, "main table").text
    assert "widget 24" not in table and "widget 29" in table
    # Filtered by key, as hex.
    browser.find_element(By.ID, "browse-key").send_keys("user-7")
    Select(browser.find_element(By.ID, "browse-encoding")).select_by_value("hex")
    # "user-7" in hex; from offset 25 no key matches, so read from 0.
    offset.clear()
    offset.send_keys("0")
    browser.find_element(By.CSS_SELECTOR, "#browse button[type=submit]").click()
    wait_text(browser, "main table", "75 73 65 72 2d 37")
    rows = browser.find_elements(By.CSS_SELECTOR, "main table tbody tr")
    assert len(rows) == 1, [r.text for r in rows]  # user-7 only ("user-17" does not contain it)
    screenshot(browser, "messages-filtered-hex")
    assert console_errors(browser) == []


def test_group_lag_goes_to_zero_after_the_consumer_commits(node, browser):
    server, base = node
    topic = unique_topic("console-lag")
    group = f"{topic}-readers"
    create_topic(server.bootstrap, topic, 2)
    produce(server.bootstrap, topic, [(f"k{i}", f"v{i}") for i in range(20)], partition=0)
    produce(server.bootstrap, topic, [(f"k{i}", f"v{i}") for i in range(10)], partition=1)
    consumer = group_consumer(server.bootstrap, group)
    consumer.subscribe([topic])
    try:
        consume(consumer, 5)
        consumer.commit(asynchronous=False)
        browser.get(f"{base}/#/groups/{group}")
        wait_text(browser, "main", f"Committed offsets and lag of {group}")
        # Some lag first (30 produced, 5 committed somewhere).
        wait_for(
            lambda: _total_lag(browser) not in (None, 0),
            WAIT_S,
            "a total lag above zero",
        )
        consume(consumer, 25)
        consumer.commit(asynchronous=False)
        # The page re-polls on its own; nothing is clicked.
        wait_for(lambda: _total_lag(browser) == 0, WAIT_S, "the total lag to reach 0")
        wait_text(browser, "main", "Stable")
        time.sleep(3.5)  # one more sample, so the chart shows the fall to zero
        screenshot(browser, "group-lag-zero")
        from selenium.webdriver.common.by import By

        points = browser.find_element(By.CSS_SELECTOR, "#lag-chart polyline").get_attribute("points")
        assert len(points.split()) >= 2
        # Reset is refused while the group has members.
        assert not browser.find_element(By.CSS_SELECTOR, "#reset-offsets button").is_enabled()
    finally:
        consumer.close()
    # Empty now: reset to earliest through the page, and the lag is back to everything.
    from selenium.webdriver.common.by import By

    wait_text(browser, "#reset-offsets", "its offsets can be reset")
    browser.find_element(By.CSS_SELECTOR, "#reset-offsets button").click()
    wait_text(browser, "#reset-offsets .msg", "Reset 2 partition(s) to earliest")
    wait_for(lambda: _total_lag(browser) == 30, WAIT_S, "the total lag to be 30 again")
    assert console_errors(browser) == []


def _total_lag(browser):
    from selenium.webdriver.common.by import By

    try:
        for card in browser.find_elements(By.CSS_SELECTOR, ".card"):
            if card.find_element(By.TAG_NAME, "dt").text == "Total lag":
                return int(card.find_element(By.TAG_NAME, "dd").text.replace(",", ""))
    except Exception:  # replaced by a re-poll while read
        return None
    return None


def _chart_now(browser, chart_id: str) -> str:
    from selenium.webdriver.common.by import By

    try:
        return browser.find_element(By.CSS_SELECTOR, f"#{chart_id} figcaption").get_attribute(
            "textContent"
        ) or ""
    except Exception:  # replaced by a re-poll between find and read
        return ""


def test_metrics_page_charts_a_produce_workload(node, browser):
    """The metrics page reads the node's own /metrics and charts rates between scrapes:
    while a client produces, records in per second and bytes in per second show above
    zero; the cards show the partitions the node hosts."""
    import re
    import threading

    server, base = node
    topic = unique_topic("console-metrics")
    create_topic(server.bootstrap, topic, 2)
    browser.get(f"{base}/#/metrics")
    wait_updated(browser)
    wait_text(browser, "main .cards", "Under-replicated")
    stop = threading.Event()

    def load() -> None:
        producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 5})
        while not stop.is_set():
            for i in range(200):
                producer.produce(topic, value=b"x" * 100, key=str(i).encode())
            producer.flush(10)
            time.sleep(0.05)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        def positive(chart_id: str, label: str) -> bool:
            match = re.search(rf"{label} ([0-9][0-9,]*(?:\.[0-9]+)?)", _chart_now(browser, chart_id))
            return bool(match) and float(match.group(1).replace(",", "")) > 0

        wait_for(lambda: positive("chart-messages", "records"), WAIT_S, "records in per second above 0")
        wait_for(lambda: positive("chart-requests", "requests"), WAIT_S, "requests per second above 0")
        wait_text(browser, "#chart-bytes figcaption", "KiB/s")

        def points() -> int:
            from selenium.webdriver.common.by import By

            try:
                line = browser.find_element(By.CSS_SELECTOR, "#chart-messages polyline")
                return len((line.get_attribute("points") or "").split())
            except Exception:  # replaced by a re-poll between find and read
                return 0

        wait_for(lambda: points() >= 2, WAIT_S, "two samples on the records chart")
    finally:
        stop.set()
        worker.join(30)
    # Two partitions of our topic, and nothing else yet on a fresh node.
    wait_text(browser, "main .cards", "Partitions2")
    screenshot(browser, "metrics-under-load")
    assert console_errors(browser) == []


def test_create_and_delete_a_topic_through_the_page(node, browser):
    from selenium.webdriver.common.by import By

    server, base = node
    topic = unique_topic("console-made")
    browser.get(f"{base}/#/topics")
    wait_updated(browser)
    browser.find_element(By.ID, "new-topic-name").send_keys(topic)
    browser.find_element(By.ID, "new-topic-partitions").send_keys("4")
    browser.find_element(By.CSS_SELECTOR, "#create-topic button").click()
    wait_text(browser, "#create-topic .msg", f"Created topic {topic}")
    wait_text(browser, "main table", topic)
    described = admin(server.bootstrap).list_topics(topic, timeout=10).topics[topic]
    assert described.error is None and len(described.partitions) == 4
    screenshot(browser, "topic-created")
    # A second create of the same name says why it failed.
    browser.find_element(By.ID, "new-topic-name").send_keys(topic)
    browser.find_element(By.CSS_SELECTOR, "#create-topic button").click()
    wait_text(browser, "#create-topic .msg", "TOPIC_ALREADY_EXISTS")
    console_errors(browser)  # the 409 above is logged by the browser: expected
    # Delete: the name typed is the confirmation.
    browser.get(f"{base}/#/topics/{topic}")
    wait_text(browser, "main", f"Partitions of {topic}")
    browser.find_element(By.ID, "delete-confirm").send_keys(topic)
    browser.find_element(By.CSS_SELECTOR, "#delete-topic button").click()
    wait_text(browser, "h1", "Topics")
    wait_for(
        lambda: topic not in admin(server.bootstrap).list_topics(timeout=10).topics,
        WAIT_S,
        "the topic to be deleted",
    )
    assert console_errors(browser) == []


def test_the_api_refuses_bad_input(node):
    server, base = node
    topic = unique_topic("console-api")
    create_topic(server.bootstrap, topic, 1)
    assert api(base, "GET", "/status")[1]["available"] is True
    for method, path, body in [
        ("POST", "/topics", {"name": "bad/name"}),
        ("POST", "/topics", {"name": "x", "partitions": 0}),
        ("POST", "/topics", "not an object"),
        ("GET", f"/topics/{topic}/messages?limit=100000", None),
        ("GET", f"/topics/{topic}/messages?from=offset", None),
        ("GET", f"/topics/{topic}/messages?encoding=base64", None),
        ("POST", f"/topics/{topic}/partitions", {"count": -1}),
        ("POST", "/groups/g/reset", {"to": "middle"}),
    ]:
        status, answer = api(base, method, path, body)
        assert status == 400, (method, path, status, answer)
        assert answer["error"], answer
    assert api(base, "GET", "/topics/no-such-topic")[0] == 404
    assert api(base, "GET", "/nothing-here")[0] == 404
    # A change not declared JSON (what a form on a foreign page could send) is refused.
    request = urllib.request.Request(
        f"{base}/api/topics", data=b'{"name":"csrf"}', method="POST",
        headers={"content-type": "text/plain"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 415
    assert "csrf" not in admin(server.bootstrap).list_topics(timeout=10).topics
    # A body over 64 KiB is refused before it is parsed.
    status, _ = api(base, "POST", "/topics", {"name": "x" * 70_000})
    assert status == 413
    # The page's headers: no inline script may run.
    with urllib.request.urlopen(f"{base}/", timeout=10) as response:
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert b"<script src=\"/console.js\"" in response.read()


def test_a_node_with_only_secured_listeners_says_so(tmp_path, browser):
    """With SASL listeners alone and no `console.listener.name` the console has no
    listener to read the cluster through, and its page says why instead of showing
    nothing."""
    from rill_harness import RillServer

    # `username`/`password`: the node's own inter-broker login, which a node whose only
    # listener is SASL needs (its inter-broker listener is that one).
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="pw" user_admin="pw";'
    )
    # A SASL listener turns on Basic authentication on the HTTP listener by default
    # (test_http_security.py); this test is about the console's banner, as an operator
    # who opted out with `http.authentication=none` sees it.
    server = RillServer(
        tmp_path / "sasl-only",
        overrides={**HTTP_ON, "plain.sasl.jaas.config": jaas, "http.authentication": "none"},
    )
    server.overrides["listeners"] = f"SASL_PLAINTEXT://127.0.0.1:{server.port}"
    server.start()
    try:
        base = f"http://{server.http_address()}"
        status, answer = api(base, "GET", "/status")
        assert status == 200 and answer["available"] is False
        assert "SASL_PLAINTEXT" in answer["reason"], answer
        assert api(base, "GET", "/topics")[0] == 503
        browser.get(f"{base}/#/")
        wait_text(browser, "#banner", "are all secured (TLS or SASL)")
        wait_text(browser, "#updated", "Not updated")
        screenshot(browser, "secured-listeners-only")
        # The page's polls are refused with 503 (what the banner explains), nothing else.
        errors = console_errors(browser)
        assert all("503" in e for e in errors), errors
    finally:
        problems = server.teardown()
    assert problems == [], problems


def test_the_console_logs_in_on_a_secured_listener_as_its_own_principal(tmp_path):
    """With `console.listener.name` and `console.client.*` the console connects to a
    SASL_SSL listener with its own login, and the authorizer decides what it sees: it
    lists the topics its principal may describe and not the others, and browses their
    records. A wrong password leaves it unavailable with the broker's reason."""
    from rill_harness import rill_binary
    from test_security import PLAIN_USERS, Pki, SecureServer

    pki = Pki(tmp_path)
    console_login = {
        "console.listener.name": "SASL_SSL",
        "console.client.sasl.mechanism": "PLAIN",
        "console.client.sasl.username": "bob",
        "console.client.sasl.password": PLAIN_USERS["bob"],
    }
    acls = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        # A SASL listener turns Basic authentication on for HTTP; this test is about the
        # console's Kafka login.
        "http.authentication": "none",
    }
    s = SecureServer(tmp_path / "secured", pki, {**HTTP_ON, **acls, **console_login}).start()
    try:
        plain = s.bootstrap("PLAINTEXT")
        create_topic(plain, "seen-orders", partitions=1)
        create_topic(plain, "hidden-payroll", partitions=1)
        produce(plain, "seen-orders", [("k1", "v1"), ("k2", "v2")])
        out = subprocess.run(
            [str(rill_binary()), "acl", "add", "-b", plain, "--allow-principal", "User:bob",
             "--operation", "Describe", "--operation", "Read", "--topic", "seen-",
             "--resource-pattern-type", "prefixed"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        base = f"http://{s.server.http_address()}"
        status, answer = api(base, "GET", "/status")
        assert status == 200 and answer["available"] is True, answer
        assert answer["bootstrap"] == s.bootstrap("SASL_SSL"), answer

        def names() -> set[str]:
            status, topics = api(base, "GET", "/topics")
            assert status == 200, topics
            return {t["name"] for t in topics}

        wait_for(lambda: "seen-orders" in names(), 30, "the topic bob may describe")
        assert "hidden-payroll" not in names()
        status, page = api(base, "GET", "/topics/seen-orders/messages?from=offset&offset=0")
        assert status == 200, page
        assert [r["value"]["text"] for r in page["records"]] == ["v1", "v2"], page
    finally:
        problems = s.server.teardown()
    assert problems == [], problems

    wrong = SecureServer(
        tmp_path / "wrong", pki,
        {**HTTP_ON, **acls, **console_login, "console.client.sasl.password": "nope"},
    ).start()
    try:
        base = f"http://{wrong.server.http_address()}"
        status, answer = api(base, "GET", "/topics")
        assert status >= 500, answer
        assert "authentication" in json.dumps(answer).lower(), answer
    finally:
        problems = wrong.server.teardown()
    assert problems == [], problems


def test_overview_of_a_cluster_with_a_broker_down(rill_cluster_factory, browser):
    """Three nodes, one killed: the overview shows it fenced or offline, and the
    partitions it held as under-replicated, without a reload."""
    from test_cluster import create_replicated_topic

    cluster = rill_cluster_factory(overrides=HTTP_ON)
    topic = unique_topic("console-cluster")
    create_replicated_topic(cluster.bootstrap, topic, 3, 3)
    base = f"http://{cluster.node(1).http_address()}"
    browser.get(f"{base}/#/")
    wait_updated(browser)
    wait_for(lambda: _card(browser, "Brokers") == "3", WAIT_S, "three brokers")
    assert _card(browser, "Under-replicated") == "0"
    cluster.node(3).kill9()
    wait_text(browser, "main table", "fenced or offline")
    wait_for(lambda: _card(browser, "Under-replicated") == "3", WAIT_S, "3 under-replicated")
    assert _card(browser, "Brokers") == "2"
    screenshot(browser, "overview-broker-down")
    assert console_errors(browser) == []


def _card(browser, label: str):
    from selenium.webdriver.common.by import By

    try:
        for card in browser.find_elements(By.CSS_SELECTOR, ".card"):
            if card.find_element(By.TAG_NAME, "dt").text == label:
                return card.find_element(By.TAG_NAME, "dd").text
    except Exception:  # replaced by a re-poll while read
        return None
    return None
