"""The live status page in headless Chromium, against the real supervisor.

Two PostgreSQL backends and a MariaDB one stream into stdout (one also into NATS) while the
page is open, beside a backend that cannot start: the page loads without console errors, lists
every backend with its state, the FATAL one with its error, the sinks' connections (nats up),
retained WAL over ``slot_warn_bytes`` in the warning colour; its events/s chart moves while rows
are written; the tail of the chosen backend shows a new row within 2 s, masked until "show
values" is ticked. With ``[http] token`` the page, its JSON and its stream refuse a client
without the token. After a ``kill -9`` of the dispatcher the open page's tail comes back by
itself. With LAPIDUS_SCREENSHOT set, the first test also writes docs/status-page.png (shown in
docs/operations.md and docs/status-page.md).

Chromium is Debian's (``/usr/bin/chromium``, installed by .ci/run), driven by Playwright's Python
package (the ``dev`` extra); Playwright never downloads a browser here.  Every wait is on a
condition in the page, with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend
from tests.integration.test_metrics import free_port, get

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import lapidus_backend  # noqa: E402

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium; skipped where it is missing, except in CI (.ci/run installs
    it, so there a missing browser is a failure)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Page:
    """A browser tab that records console errors and uncaught exceptions."""

    def __init__(self, browser, base: str):
        self.tab = browser.new_page(viewport={"width": 1400, "height": 860})
        self.errors = []
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.tab.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.base = base

    def until(self, script: str, arg=None, timeout: float = 20.0):
        """Wait for ``script`` (a JS function) to return a truthy value in the page."""
        return self.tab.wait_for_function(script, arg=arg, timeout=timeout * 1000).json_value()

    def close(self):
        self.tab.close()


class Writer(threading.Thread):
    """Inserts rows into ``items`` until stopped (a row every 20 ms): the load the chart shows."""

    def __init__(self, db):
        super().__init__(daemon=True)
        self.db = db
        self.done = threading.Event()
        self.rows = 0

    def run(self):
        while not self.done.is_set():
            self.rows += 1
            self.db.sql(f"INSERT INTO items VALUES ({self.rows}, 'secret-{self.rows}', "
                        f"{self.rows}.50)")
            self.done.wait(0.02)

    def stop(self):
        self.done.set()
        self.join(10)


def running(base: str, names) -> bool:
    code, body = get(base + "/status.json")
    rows = json.loads(body)["backends"] if code == 200 else []
    return all(any(r["name"] == name and r["state"] == "RUNNING" for r in rows)
               for name in names)


def test_page_shows_backends_chart_and_masked_tail_live(lapidus_factory, pg_db, sql, browser):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pg_db.sql("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric)",
              "CREATE TABLE marker (id int PRIMARY KEY)")
    sql.run("CREATE TABLE orders (id INT PRIMARY KEY, note VARCHAR(40))")
    proc = lapidus_factory({"http": {"listen": f"127.0.0.1:{port}"},
                            "backends": [pg_backend(pg_db, name="shop"),
                                         pg_backend(pg_db, name="shop_copy", slot_warn_bytes=1,
                                                    plugins={"stdout": {}, "nats": {
                                                        "subject_prefix": f"statuspage{port}"}}),
                                         lapidus_backend("crm"),
                                         pg_backend(pg_db, name="broken",
                                                    database="missing_db")],
                            "plugins": {"stdout": {}}})
    wait_until(lambda: running(base, ("shop", "shop_copy", "crm")), 60,
               message=f"3 backends RUNNING; log:\n{proc.log()[-3000:]}")

    # the page's JSON is lapidusctl status --json
    code, out, err = ctl(proc.config_path, "status", "--json")
    assert code == 0, err
    from_ctl = json.loads(out)
    from_page = json.loads(get(base + "/status.json")[1])
    assert set(from_page) == set(from_ctl)
    assert [b["name"] for b in from_page["backends"]] == [b["name"] for b in from_ctl["backends"]]

    page = Page(browser, base)
    writer = Writer(pg_db)
    try:
        page.tab.goto(base + "/")
        states = page.until("""() => {
            const rows = [...document.querySelectorAll('#backends tbody tr')];
            const found = Object.fromEntries(rows.map(r =>
                [r.dataset.backend, r.querySelector('.state').textContent]));
            return Object.keys(found).length === 4 ? found : null; }""")
        assert {name: states[name] for name in ("shop", "shop_copy", "crm")} == \
            {"shop": "RUNNING", "shop_copy": "RUNNING", "crm": "RUNNING"}
        # the broken one: not streaming, and why
        broken = page.until("""() => {
            const row = document.querySelector('tr[data-backend=broken]');
            const error = row.querySelector('td.error').textContent;
            return error.includes('missing_db') ?
                [row.querySelector('.state').textContent, error] : null; }""", timeout=30)
        assert broken[0] in ("FATAL", "BACKOFF", "WAITING", "STARTING"), broken
        # sink connections: shop_copy's nats (the local server) is up
        page.until("() => document.querySelector('tr[data-backend=shop_copy] .sink.up')"
                   "?.textContent === 'nats up'", timeout=30)
        # retained WAL: over shop_copy's slot_warn_bytes in the warning colour, shop's not
        page.until("() => document.querySelector('tr[data-backend=shop_copy] td.wal.warn') && "
                   "document.querySelector('tr[data-backend=shop] td.wal.ok')", timeout=30)
        # the tail follows the first backend until another is chosen
        page.tab.select_option("#tail-backend", "shop")
        page.until("() => window.lapidusStatus.backend === 'shop' && "
                   "window.lapidusStatus.source.readyState === 1")

        # the chart: its line for shop gets points above zero, and moves with each new one
        writer.start()
        plotted = page.until("() => window.lapidusStatus.latestRate('shop') > 0 && "
                             "window.lapidusStatus.plotted.shop", timeout=30)
        chart_before = page.tab.eval_on_selector("#rates", "c => c.toDataURL()")
        page.until("""([points, before]) => window.lapidusStatus.plotted.shop > points &&
            window.lapidusStatus.latestRate('shop') > 0 &&
            document.querySelector('#rates').toDataURL() !== before""",
                   arg=[plotted, chart_before], timeout=30)
        rate_cell = page.until("""() => {
            const cell = document.querySelector('tr[data-backend=shop] td:nth-child(8)');
            return cell && parseFloat(cell.textContent) > 0 ? cell.textContent : null; }""",
                               timeout=30)
        assert float(rate_cell) > 0

        # masked: column names, no values
        masked = page.until("""() => {
            const items = [...document.querySelectorAll('#tail li')];
            return items.length >= 3 ? items.map(li => li.textContent) : null; }""")
        assert all("public.items" in text and '"name":"•••"' in text for text in masked)
        assert not any("secret-" in text for text in masked), masked

        # a new row reaches the open page within 2 s
        pg_db.sql("INSERT INTO marker VALUES (7)")
        page.until("() => [...document.querySelectorAll('#tail li .meta')]"
                   ".some(m => m.textContent === 'public.marker')", timeout=2)

        # values once asked for
        page.tab.check("#show-values")
        shown = page.until("""() => {
            const texts = [...document.querySelectorAll('#tail li')].map(li => li.textContent);
            return texts.some(t => t.includes('secret-')) ? texts : null; }""")
        assert not any("•••" in text for text in shown)

        # another backend kind: MariaDB's tail
        page.tab.select_option("#tail-backend", "crm")
        page.until("() => window.lapidusStatus.source.readyState === 1 && "
                   "window.lapidusStatus.backend === 'crm'")
        sql.run("INSERT INTO orders VALUES (1, 'first order')")
        page.until("() => [...document.querySelectorAll('#tail li')]"
                   ".some(li => li.textContent.includes('first order'))", timeout=10)
        page.tab.select_option("#tail-backend", "shop")
        page.until("() => document.querySelectorAll('#tail li').length >= 3")
        if os.environ.get("LAPIDUS_SCREENSHOT"):
            page.tab.uncheck("#show-values")
            page.until("() => document.querySelectorAll('#tail li').length >= 8 && "
                       "window.lapidusStatus.plotted.shop >= 20", timeout=90)
            page.tab.screenshot(path=str(ROOT / "docs" / "status-page.png"), full_page=True)
    finally:
        writer.stop()
        page.close()
    assert page.errors == []


def request(url: str, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_token_guards_page_json_and_stream(lapidus_factory, pg_db, browser):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = lapidus_factory({"http": {"listen": f"127.0.0.1:{port}", "token": "${PAGE_TOKEN}"},
                            "backends": [pg_backend(pg_db, name="shop")],
                            "plugins": {"stdout": {}}}, env={"PAGE_TOKEN": "s3cret-token"})
    wait_until(lambda: get(base + "/healthz")[0] == 200, 60,
               message=f"healthz; log:\n{proc.log()[-3000:]}")

    for path in ("/", "/status.json", "/events", "/events?tail=shop&values=1"):
        code, body = request(base + path)
        assert code == 401, (path, code)
        assert "shop" not in body
    assert request(base + "/status.json", {"Authorization": "Bearer wrong"})[0] == 401
    code, body = request(base + "/status.json", {"Authorization": "Bearer s3cret-token"})
    assert code == 200 and json.loads(body)["backends"][0]["name"] == "shop"
    assert get(base + "/metrics")[0] == 200    # Prometheus needs no token

    page = Page(browser, base)
    try:
        page.tab.goto(base + "/")
        page.tab.fill("input[name=token]", "wrong")
        page.tab.click("button[type=submit]")
        page.tab.wait_for_selector("text=That token is not the one configured")
        page.tab.fill("input[name=token]", "s3cret-token")
        page.tab.click("button[type=submit]")
        assert page.until("() => document.querySelector('tr[data-backend=shop] .state')"
                          "?.textContent") == "RUNNING"
        assert page.tab.url == base + "/"    # the token left the address bar for a cookie
    finally:
        page.close()
    # the refused tries show as 401s in the console; nothing else went wrong
    assert all("401" in error for error in page.errors), page.errors


def test_the_tail_comes_back_after_a_kill_9_of_the_dispatcher(lapidus_factory, pg_db, browser):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pg_db.sql("CREATE TABLE marker (id int PRIMARY KEY)")
    proc = lapidus_factory({"http": {"listen": f"127.0.0.1:{port}"},
                            "backends": [pg_backend(pg_db, name="shop")],
                            "plugins": {"stdout": {}}})
    wait_until(lambda: running(base, ["shop"]), 60, message=f"shop RUNNING; log:\n"
               f"{proc.log()[-3000:]}")
    page = Page(browser, base)
    try:
        page.tab.goto(base + "/")
        page.until("() => window.lapidusStatus.backend === 'shop' && "
                   "window.lapidusStatus.source.readyState === 1")
        pg_db.sql("INSERT INTO marker VALUES (1)")
        page.until("() => document.querySelectorAll('#tail li').length === 1")

        os.kill(proc.dispatcher_pid(), signal.SIGKILL)
        wait_until(lambda: json.loads(get(base + "/status.json")[1])["dispatcher"].get(
            "restarts", 0) >= 1 and running(base, ["shop"]), 60,
            message="the dispatcher restarted and shop streaming again")
        # the supervisor renews its watch with the new dispatcher: later rows show again
        pg_db.sql("INSERT INTO marker VALUES (2)")
        page.until("() => document.querySelectorAll('#tail li').length >= 2", timeout=15)
    finally:
        page.close()
    assert page.errors == []
