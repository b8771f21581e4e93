"""README stays a short way in: its two commands first, under 200 lines, every link it and the docs/
pages hold leads somewhere, and the sample `.env` is one the settings accept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker.config import WorkerConfig

REPO = Path(__file__).resolve().parents[2]
TWO_COMMANDS = """```bash
# 1. set up and run the demo (embedded Redis if none runs, simulated GPUs, live view)
python3 -m venv .venv && .venv/bin/pip install -e ./clients/python -e '.[lab]' && .venv/bin/tidegate demo

# 2. run every test (installs the test extras, starts a Redis if none answers, lint + types + pytest)
bash ops/test.sh
```"""
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_opens_with_the_two_commands_and_stays_short() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.index(TWO_COMMANDS) < readme.index("## Run it yourself") < readme.index("## Reference")
    assert len(readme.splitlines()) < 200


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in (REPO / "docs").glob("*.md"))])
def test_every_link_leads_somewhere(page: str) -> None:
    path = REPO / page if page == "README.md" else REPO / "docs" / page
    missing = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://")):
            continue
        resolved = (path.parent / target).resolve()
        if not resolved.exists():
            missing.append(target)
    assert missing == [], f"{page} links to missing files: {missing}"


def test_the_sample_env_is_accepted_by_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = REPO / ".env.example"
    names = re.findall(r"^(TIDEGATE_\w+)=", sample.read_text(encoding="utf-8"), re.MULTILINE)
    assert {"TIDEGATE_REDIS_URL", "TIDEGATE_VLLM_URL", "TIDEGATE_OPERATOR_KEY"} <= set(names)
    for name in names:
        monkeypatch.delenv(name, raising=False)
        assert name.removeprefix("TIDEGATE_").lower() in WorkerConfig.model_fields, name
    settings = WorkerConfig(_env_file=sample)  # type: ignore[call-arg]
    assert settings.redis_url == "redis://127.0.0.1:6379/0" and settings.gpu_backend == "sim"
