"""/docs and /redoc render in a real headless Chromium with every request off the API refused.

Chromium is Debian's `chromium` package (ops/test.sh installs it with apt), driven by Playwright's
Python package; no browser is downloaded. Screenshots go to $TIDEGATE_TEST_ARTIFACTS (default
build/test-artifacts) so a reviewer can see the pages.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.producer.api.conftest import Api

ARTIFACTS = Path(os.environ.get("TIDEGATE_TEST_ARTIFACTS", "build/test-artifacts"))
RENDER_TIMEOUT_MS = 30_000


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("SKIPPED LOUDLY: no system Chromium (apt-get install chromium); /docs was not rendered")


@pytest.fixture
def browser_page(api: Api) -> Iterator[tuple[Any, list[str]]]:
    """A page whose requests reach only the API under test; the refused ones are listed."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is missing")
    executable = _chromium()
    refused: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=[
                "--no-sandbox",
                "--no-proxy-server",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            ],
        )
        context = browser.new_context(viewport={"width": 1280, "height": 1600})

        def only_the_api(route: Any) -> None:
            if route.request.url.startswith(api.base_url + "/"):
                route.continue_()
            else:
                refused.append(route.request.url)
                route.abort("internetdisconnected")

        context.route("**/*", only_the_api)
        try:
            yield context.new_page(), refused
        finally:
            context.close()
            browser.close()


def test_swagger_ui_renders_every_operation_offline(api: Api, browser_page: tuple[Any, list[str]]) -> None:
    page, refused = browser_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(api.url("/docs"), wait_until="load", timeout=RENDER_TIMEOUT_MS)
    page.wait_for_selector(".swagger-ui .opblock", timeout=RENDER_TIMEOUT_MS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "docs-swagger-ui.png"
    page.screenshot(path=str(shot), full_page=True)
    operations = page.locator(".swagger-ui .opblock-summary-path").all_inner_texts()
    document = page.request.get(api.url("/openapi.json")).json()
    expected = {path for path, ops in document["paths"].items() for _ in ops}
    assert {text.replace("\u200b", "").strip() for text in operations} == expected
    assert page.locator("text=Submit one ticket").count() >= 1
    assert refused == [] and errors == []


def test_redoc_renders_offline(api: Api, browser_page: tuple[Any, list[str]]) -> None:
    """ReDoc's bundle links its footer logo to a CDN: the page's CSP stops it in the browser."""
    page, refused = browser_page
    page.goto(api.url("/redoc"), wait_until="load", timeout=RENDER_TIMEOUT_MS)
    page.locator("h2", has_text="Submit one ticket").wait_for(timeout=RENDER_TIMEOUT_MS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-redoc.png"))
    assert refused == []
