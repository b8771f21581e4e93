"""The operators' status page in a real browser: the level follows the queue as it fills, the
critical-only switch changes the mode end to end (the CLI agrees), and a branch key is refused.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from producer.producer import Producer
from shared.breaker_store import BreakerStore
from shared.policy import Policy
from tests.conftest import RunCli
from tests.monitor.conftest import MonitorFactory, make_monitor, rq_conn, rq_queues
from tests.producer.api.browser import browser, screenshot
from tests.producer.api.conftest import Api
from worker.registry import WorkerRegistry

__all__ = ["browser", "make_monitor", "rq_conn", "rq_queues"]  # fixtures, imported so pytest finds them

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="the status page's browser tests need playwright (pip install -e '.[test]')"
)
expect = playwright_api.expect
WAIT_MS = 8000


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    refused: list[str] = []

    def only_the_api(route: Any) -> None:
        # No CDN: anything the page asks of another host is refused and reported.
        if route.request.url.startswith("http://127.0.0.1:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_the_api)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    context.close()
    assert errors == [], f"the page's script raised: {errors}"
    assert refused == [], f"the page asked for something off the API: {refused}"


def log_in(page: Any, api: Api, key: str) -> None:
    page.goto(api.url("/ui"))
    page.fill("#key", key)
    page.click("#login-form button[type=submit]")


def fill_to(producer: Producer, depth: int, policy: Policy) -> None:
    """Queue critical tickets (admitted at every level) until the queue holds `depth`."""
    critical = next(name for name, tp in policy.types.items() if tp.critical)
    missing = depth - producer.queue.stats().depth
    results = producer.submit_many(
        [{"type": critical, "branch_id": "0412", "prompt": f"loan {i}"} for i in range(missing)]
    )
    assert all(r.accepted for r in results), [r.reason for r in results if not r.accepted]


def mode_show(run_cli: RunCli) -> str:
    out = run_cli("mode", "show", "--json")
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["mode"])


def test_level_follows_the_queue_as_it_fills(
    page: Any,
    api: Api,
    operator_key: str,
    branch_key: str,
    redis_client: Redis,
    producer: Producer,
    make_monitor: MonitorFactory,
) -> None:
    policy = producer.policy
    monitor = make_monitor()
    registry = WorkerRegistry(redis_client, api.queue_keys, "node-a-gpu0", heartbeat_seconds=20)
    registry.heartbeat(
        {"host": "node-a", "gpu": 0, "model": "qwen", "inflight": 3, "batch_limit": 12,
         "bound": "kv", "kv_usage": 0.42, "gpu_free_bytes": 9 * 1024**3, "state": "running"}
    )  # fmt: skip
    log_in(page, api, operator_key)
    monitor.tick()
    expect(page.locator("#level-name")).to_have_text("GREEN", timeout=WAIT_MS)
    expect(page.locator("#workers tbody")).to_contain_text("node-a-gpu0")
    expect(page.locator("#workers tbody")).to_contain_text("42%")
    expect(page.locator("#breakers tbody")).to_have_text("no endpoint recorded yet")
    screenshot(page, "1-green")
    alarms = policy.alarms
    for level, depth in (
        ("YELLOW", alarms.yellow + 1),
        ("ORANGE", alarms.orange + 1),
        ("RED", alarms.red + 1),
    ):
        fill_to(producer, depth, policy)
        monitor.tick()  # the acting monitor publishes the level and records the transition
        expect(page.locator("#level-name")).to_have_text(level, timeout=WAIT_MS)
        expect(page.locator("#depth")).to_have_text(str(depth), timeout=WAIT_MS)
        expect(page.locator("#level")).to_have_class(f"level level-{level.lower()}")
        expect(page.locator("#transitions")).to_contain_text(level.lower(), timeout=WAIT_MS)
        screenshot(page, f"2-{level.lower()}")
    # The chart draws the monitor's samples (one per tick) up to now.
    points = page.locator("polyline[data-type=total]").get_attribute("points") or ""
    assert len(points.split()) >= 4, points
    # At red a complaint is shed; the page counts it under its code.
    with api.session(branch_key) as branch:
        answer = branch.post(
            api.url("/v1/tickets"), json={"type": "complaint", "branch_id": "0412", "prompt": "late card"}
        )
    assert answer.status_code == 429, answer.text
    code = answer.json()["error"]["code"]
    expect(page.locator("#sheds tbody")).to_contain_text(code, timeout=WAIT_MS)
    screenshot(page, "3-red-with-shed")
    page.set_viewport_size({"width": 1280, "height": 800})  # a laptop: the panels wrap, nothing is cut
    expect(page.locator("#workers tbody")).to_contain_text("node-a-gpu0")
    screenshot(page, "3-red-laptop")
    registry.deregister()


def test_the_switch_sets_critical_only_and_the_cli_agrees(
    page: Any, api: Api, operator_key: str, run_cli: RunCli
) -> None:
    log_in(page, api, operator_key)
    expect(page.locator("#mode")).to_have_text("normal", timeout=WAIT_MS)
    page.click("#mode-switch")
    expect(page.locator("#confirm")).to_be_visible()
    screenshot(page, "4-confirm")
    page.click("#confirm-cancel")
    expect(page.locator("#mode")).to_have_text("normal")
    assert mode_show(run_cli) == "normal"

    page.click("#mode-switch")
    page.click("#confirm-ok")
    expect(page.locator("#mode")).to_have_text("critical-only", timeout=WAIT_MS)
    screenshot(page, "5-critical-only")
    assert mode_show(run_cli) == "critical-only"

    page.click("#mode-switch")
    page.click("#confirm-ok")
    expect(page.locator("#mode")).to_have_text("normal", timeout=WAIT_MS)
    assert mode_show(run_cli) == "normal"


def test_a_branch_key_is_refused(page: Any, api: Api, branch_key: str) -> None:
    log_in(page, api, branch_key)
    expect(page.locator("#login-error")).to_contain_text("403", timeout=WAIT_MS)
    expect(page.locator("#login-error")).to_contain_text("operator key")
    expect(page.locator("#board")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    screenshot(page, "6-branch-refused")


def browser_clock(page: Any, at: float) -> str:
    """`at` as the page writes a time: the browser's own locale and time zone."""
    return str(page.evaluate(f"new Date({at * 1000!r}).toLocaleTimeString([], {{hour12: false}})"))


def next_refresh(page: Any) -> None:
    """Wait until the page has drawn another poll than the one on screen now."""
    shown = page.locator("#refreshed").text_content()
    expect(page.locator("#refreshed")).not_to_have_text(shown or "", timeout=WAIT_MS)


def test_breakers_table_a_since_that_stays_put_the_scale_and_the_adaptive_limit(
    page: Any,
    api: Api,
    operator_key: str,
    redis_client: Redis,
    producer: Producer,
    make_monitor: MonitorFactory,
) -> None:
    policy = producer.policy
    store = BreakerStore(redis_client, api.queue_keys, policy.breaker)
    store.describe("vllm-0:8000", role="primary", model="qwen-7b:2026.11", model_version="2026.11")
    for _ in range(policy.breaker.min_requests):
        store.record("vllm-0:8000", False)
    store.describe("vllm-1:8000", role="fallback", model="qwen-7b:2026.11", model_version="2026.11")
    store.record("vllm-1:8000", True)
    registry = WorkerRegistry(redis_client, api.queue_keys, "node-b-gpu1", heartbeat_seconds=20)
    registry.heartbeat(
        {"host": "node-b", "gpu": 1, "model": "qwen", "inflight": 5, "batch_limit": 16,
         "concurrency_limit": 9, "bound": "critical_reserve", "kv_usage": 0.3, "state": "running"}
    )  # fmt: skip
    monitor = make_monitor()
    began = time.time() - 2.0
    for step in range(3):  # three samples at green, a second apart: the level began with the first
        assert monitor.tick(now=began + step).acting
    log_in(page, api, operator_key)

    expect(page.locator("#level-name")).to_have_text("GREEN", timeout=WAIT_MS)
    since = f" since {browser_clock(page, began)}"
    expect(page.locator("#level-since")).to_have_text(since)
    rows = page.locator("#breakers tbody tr")
    expect(rows).to_have_count(2)
    primary = rows.nth(0).locator("td")
    expect(primary.nth(0)).to_have_text("vllm-0:8000")
    expect(primary.nth(1)).to_have_text("deep: a person is paged")
    expect(primary.nth(2)).to_contain_text("open: refusing, retry in")
    # The instant window (1 s) may have rolled on by now; the minute's and five minutes' have not.
    expect(primary.nth(3)).to_have_text(re.compile(r"^(100%|–) · 100% · 100%$"))
    tripped = store.views()[0].as_dict()["since"]
    expect(primary.nth(4)).to_have_text(browser_clock(page, tripped))
    fallback = rows.nth(1).locator("td")
    expect(fallback.nth(0)).to_have_text("vllm-1:8000 (fallback)")
    expect(fallback.nth(1)).to_have_text("closed: normal")
    expect(fallback.nth(2)).to_have_text("closed: taking work")
    expect(fallback.nth(3)).to_have_text(re.compile(r"^(0%|–) · 0% · 0%$"))
    expect(fallback.nth(4)).to_have_text("never tripped")
    expect(page.locator("#workers tbody")).to_contain_text("9 (bound by critical reserve)")
    ticks = page.locator("#chart text.tick").all_text_contents()
    assert {"now", "−5 min", "tickets queued", "0"} <= set(ticks), ticks
    expect(page.locator("#audit tbody")).to_contain_text("no operator action recorded yet")
    screenshot(page, "7-breakers-and-since")

    # The monitor samples on and the page polls on; nothing changed, so neither "since" moves.
    for step in range(3, 6):
        monitor.tick(now=began + step)
        next_refresh(page)
    expect(page.locator("#level-since")).to_have_text(since)
    expect(primary.nth(4)).to_have_text(browser_clock(page, tripped))
    screenshot(page, "8-since-stays-put")
    registry.deregister()


def test_the_audit_panel_draws_the_trail_newest_first(page: Any, api: Api, operator_key: str) -> None:
    now = time.time()
    entries = [
        {"time": now, "actor": "ops-alice", "action": "mode.set", "target": "intake",
         "before": "normal", "after": "critical-only"},
        {"time": now - 60, "actor": "ops-alice", "action": "key.create", "target": "branch 0412",
         "before": None, "after": {"role": "branch", "default_type": "complaint"}},
    ]  # fmt: skip
    page.route("**/v1/audit", lambda route: route.fulfill(json={"entries": entries}))
    log_in(page, api, operator_key)
    rows = page.locator("#audit tbody tr")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    first = rows.nth(0).locator("td")
    expect(first.nth(0)).to_have_text(browser_clock(page, now))
    expect(first.nth(1)).to_have_text("ops-alice")
    expect(first.nth(2)).to_have_text("mode.set")
    expect(first.nth(4)).to_have_text("normal → critical-only")
    expect(rows.nth(1).locator("td").nth(4)).to_have_text('– → {"role":"branch","default_type":"complaint"}')
    screenshot(page, "9-audit")
