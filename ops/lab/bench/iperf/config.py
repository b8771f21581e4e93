"""inference-perf's configuration for one run, written from the template `inference-perf.yaml`.

The template holds what every run shares, with a comment on each part; a run fills in its address,
key, model, tokenizer, load and report folder. Strings go in JSON-quoted, which YAML reads as the
same strings, so a key or path with YAML's special characters cannot change the document.
"""

from __future__ import annotations

import json
import math
import string
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).with_name("inference-perf.yaml")
REQUEST_TIMEOUT_S = 300.0
"""Far above any answer at a load below capacity: a request that takes this long is a failure."""


@dataclass(frozen=True)
class LoadShape:
    """One stage of Poisson arrivals, every request the same size."""

    rate: float = 2.0
    """Requests per second, on average."""
    duration_s: int = 60
    prompt_tokens: int = 1024
    output_tokens: int = 128
    seed: int = 7

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate={self.rate} is not accepted; use a positive number of requests/s")
        for name in ("duration_s", "prompt_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is not accepted; use 1 or more")

    @property
    def requests(self) -> int:
        """How many requests the stage sends: inference-perf sends rate × duration, at Poisson times."""
        return max(1, int(self.rate * self.duration_s))


@dataclass(frozen=True)
class Target:
    """Where the requests go and what they are made with."""

    base_url: str
    api_key: str
    model: str
    tokenizer: Path
    slo_seconds: float
    """The goodput bound on each request's latency: the ticket type's SLO."""


def render_config(shape: LoadShape, target: Target, report_dir: Path, template: str | None = None) -> str:
    """The configuration text for one run (KeyError names a placeholder the template lacks a value for)."""
    values = {
        "base_url": json.dumps(target.base_url.rstrip("/")),
        "api_key": json.dumps(target.api_key),
        "model_name": json.dumps(target.model),
        "tokenizer": json.dumps(str(target.tokenizer)),
        "prompt_tokens": str(shape.prompt_tokens),
        "output_tokens": str(shape.output_tokens),
        "requests": str(shape.requests),
        "rate": repr(float(shape.rate)),
        "duration": str(shape.duration_s),
        "seed": str(shape.seed),
        "request_timeout": repr(REQUEST_TIMEOUT_S),
        "slo_seconds": repr(float(target.slo_seconds)),
        "report_dir": json.dumps(str(report_dir)),
    }
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    return string.Template(text).substitute(values)


def write_config(path: Path, shape: LoadShape, target: Target, report_dir: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(shape, target, report_dir), encoding="utf-8")
    return path
