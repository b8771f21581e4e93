"""Helpers for driving simulators over real HTTP: metric scraping, polling, prompts of exact size."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(base_url: str) -> dict[str, list[Sample]]:
    """Samples by sample name (e.g. `vllm:num_preemptions_total`), parsed by prometheus_client."""
    text = requests.get(f"{base_url}/metrics", timeout=5).text
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def metric(base_url: str, name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    found = scrape(base_url).get(name, [])
    return sum(s.value for s in found if all(s.labels.get(k) == v for k, v in labels.items()))


def token_ids(count: int, start: int = 1) -> list[int]:
    """A prompt of exactly `count` tokens."""
    return [start + (i % 1000) for i in range(count)]


def complete(base_url: str, **body: object) -> requests.Response:
    return requests.post(f"{base_url}/v1/completions", json=body, timeout=30)
