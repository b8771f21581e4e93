"""Headless Chromium for the status page's tests: the system's browser (Debian's `chromium`) driven by
Playwright, never a downloaded one. Tests skip, saying why, where either is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RESULTS_DIR = Path(os.environ.get("TIDEGATE_TEST_ARTIFACTS", "build/test-artifacts")) / "status-page"
"""Screenshots land here (git-ignored, like the /docs test's), one per step, for a person to look at."""
CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_executable() -> str | None:
    explicit = os.environ.get("TIDEGATE_CHROMIUM")
    if explicit:
        return explicit
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.skip(f"the status page's browser tests need playwright (pip install -e '.[test]'): {exc}")
    executable = chromium_executable()
    if executable is None:
        pytest.skip(
            "the status page's browser tests need Chromium: `apt-get install chromium` "
            "(ops/test.sh does this as root) or set TIDEGATE_CHROMIUM to its path"
        )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield instance
        finally:
            instance.close()


def screenshot(page: Any, name: str) -> Path:
    path = RESULTS_DIR / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
