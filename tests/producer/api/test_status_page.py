"""The operators' status page in a real browser: the level follows the queue as it fills, the
critical-only switch changes the mode end to end (the CLI agrees), and a branch key is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from producer.producer import Producer
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
         "normal_cap": 8, "kv_usage": 0.42, "gpu_free_bytes": 9 * 1024**3, "state": "running"}
    )  # fmt: skip
    log_in(page, api, operator_key)
    monitor.tick()
    expect(page.locator("#level-name")).to_have_text("GREEN", timeout=WAIT_MS)
    expect(page.locator("#workers tbody")).to_contain_text("node-a-gpu0")
    expect(page.locator("#workers tbody")).to_contain_text("42%")
    expect(page.locator("#breakers")).to_have_text("not configured")
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
