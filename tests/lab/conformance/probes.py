"""Client-side probes shared by the conformance tests: metrics, polling, prompts, streams.

Everything here speaks plain HTTP, so the same probe reads the simulator and real vLLM alike.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.waiting import wait_until

TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Endpoint:
    """A served model under test and the engine settings both servers were started with."""

    name: str
    base_url: str
    model: str
    max_model_len: int
    max_num_seqs: int
    vocab_size: int
    max_num_batched_tokens: int
    """Tokens one engine step may compute: a longer prompt is prefilled over several steps."""

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"


def scrape(endpoint: Endpoint) -> dict[str, list[Sample]]:
    """Samples by exposition name: `vllm:num_preemptions_total`, `vllm:e2e_request_latency_seconds_count`."""
    text = requests.get(endpoint.url("/metrics"), timeout=10).text
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def family_types(endpoint: Endpoint) -> dict[str, str]:
    text = requests.get(endpoint.url("/metrics"), timeout=10).text
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def metric(endpoint: Endpoint, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    found = scrape(endpoint).get(name, [])
    return sum(s.value for s in found if all(s.labels.get(k) == v for k, v in labels.items()))


def running(endpoint: Endpoint) -> float:
    return metric(endpoint, "vllm:num_requests_running")


def waiting(endpoint: Endpoint) -> float:
    return metric(endpoint, "vllm:num_requests_waiting")


def queue_gauges(endpoint: Endpoint) -> tuple[float, float]:
    """Running and waiting requests from one scrape, so the two describe the same moment."""
    samples = scrape(endpoint)

    def total(name: str) -> float:
        return sum(sample.value for sample in samples.get(name, []))

    return total("vllm:num_requests_running"), total("vllm:num_requests_waiting")


def wait_idle(endpoint: Endpoint, timeout_s: float = 60.0) -> None:
    """Wait until nothing runs or waits, so counters and queue order belong to the test alone."""
    wait_until(lambda: queue_gauges(endpoint) == (0, 0), timeout_s, "an idle server")


def prompt_ids(seed: str, length: int, vocab: int) -> list[int]:
    """Random token ids, distinct per seed, so real vLLM's prefix cache never shortens a prefill."""
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(length)]


def post(
    endpoint: Endpoint, path: str, body: object, headers: dict[str, str] | None = None
) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    return requests.post(
        endpoint.url(path),
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
        timeout=TIMEOUT_S,
    )


@dataclass(frozen=True)
class Stream:
    status: int
    content_type: str
    headers: dict[str, str]
    payloads: list[str]

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(payload) for payload in self.payloads if payload != "[DONE]"]


def read_stream(
    endpoint: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Stream:
    """A whole server-sent-event response; every non-blank line must be a `data: ` line."""
    with requests.post(
        endpoint.url(path), json=body | {"stream": True}, headers=headers, stream=True, timeout=TIMEOUT_S
    ) as response:
        payloads: list[str] = []
        for raw in response.iter_lines(decode_unicode=True):
            if not raw:
                continue
            line = str(raw)
            assert line.startswith("data: "), f"not a server-sent data line: {line!r}"
            payloads.append(line.removeprefix("data: "))
        return Stream(
            response.status_code, response.headers.get("content-type", ""), dict(response.headers), payloads
        )


class OpenStream:
    """A streaming request held open until `close()`, which is how a client disconnects mid-generation."""

    def __init__(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        self.response = requests.post(
            endpoint.url("/v1/completions"), json=body | {"stream": True}, stream=True, timeout=TIMEOUT_S
        )
        self.response.raise_for_status()
        self._lines = self.response.iter_lines()

    def read_chunks(self, count: int) -> None:
        seen = 0
        while seen < count:
            if next(self._lines):
                seen += 1

    def drain_in_background(self) -> threading.Event:
        """Read the stream on a thread of its own, so a long answer never fills the socket buffers.

        The event returned is set when the stream ends, by the server finishing it or by `close()`.
        """
        ended = threading.Event()

        def drain() -> None:
            with contextlib.suppress(requests.RequestException, AttributeError, ValueError, OSError):
                for _ in self._lines:
                    pass
            ended.set()

        threading.Thread(target=drain, daemon=True).start()
        return ended

    def times_in_background(self, started: threading.Event, after: int) -> list[float]:
        """Read the stream on a thread of its own, noting when each data chunk arrives (the list
        grows as it does); `started` is set once `after` have arrived."""
        arrivals: list[float] = []

        def note() -> None:
            with contextlib.suppress(requests.RequestException, AttributeError, ValueError, OSError):
                for line in self._lines:
                    if line.startswith(b"data: {"):
                        arrivals.append(time.monotonic())
                        if len(arrivals) >= after:
                            started.set()

        threading.Thread(target=note, daemon=True).start()
        return arrivals

    def close(self) -> None:
        self.response.close()


class RawRequest:
    """A non-streaming request on a bare socket, so the test can hang up while the server still works."""

    def __init__(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        host, port = endpoint.base_url.removeprefix("http://").rsplit(":", 1)
        payload = json.dumps(body).encode()
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + payload)

    def close(self) -> None:
        self.sock.close()
