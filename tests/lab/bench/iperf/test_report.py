"""Reading inference-perf's report: fixtures captured from a real inference-perf 0.7.0 run against the
front door (`tidegate bench inference-perf --duration 15`), the summary without its image, video,
audio and request-size sections, three of the requests with their chunk lists cut to four entries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ops.lab.bench.iperf.report import (
    PER_REQUEST_FILE,
    SUMMARY_FILE,
    ReportError,
    parse_requests,
    parse_summary,
    read_report,
)

FIXTURES = Path(__file__).with_name("fixtures")


def _load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def test_the_summary_figures_are_inference_perfs_own() -> None:
    raw = _load(SUMMARY_FILE)
    summary = parse_summary(raw)
    latency = raw["successes"]["latency"]
    assert (summary.sent, summary.answered, summary.failed) == (30, 30, 0)
    assert summary.ttft_p50 == latency["time_to_first_token"]["median"]
    assert summary.ttft_p99 == latency["time_to_first_token"]["p99"]
    assert summary.latency_p50 == latency["request_latency"]["median"]
    assert summary.latency_p99 == latency["request_latency"]["p99"]
    assert summary.output_tokens_per_s == raw["successes"]["throughput"]["output_tokens_per_sec"]
    assert summary.requests_per_s == raw["successes"]["throughput"]["requests_per_sec"]
    assert summary.good == 30
    assert summary.seconds == raw["benchmark_time_seconds"]
    assert summary.send_lag_p50 == raw["load_summary"]["schedule_delay"]["median"]
    assert summary.send_lag_p99 == raw["load_summary"]["schedule_delay"]["p99"]


def test_a_summary_without_goodput_or_latencies_reads_none_for_them() -> None:
    raw = _load(SUMMARY_FILE)
    del raw["successes"]["goodput_metrics"]
    raw["successes"]["latency"] = None  # inference-perf writes null when nothing succeeded
    summary = parse_summary(raw)
    assert summary.good is None
    assert summary.ttft_p50 is None
    assert summary.latency_p99 is None


def test_a_summary_without_its_counts_is_refused_naming_the_field() -> None:
    raw = _load(SUMMARY_FILE)
    del raw["successes"]["count"]
    with pytest.raises(ReportError, match=r"successes\.count"):
        parse_summary(raw)


def test_each_request_names_its_ticket_through_its_chunks() -> None:
    raw = _load(PER_REQUEST_FILE)
    requests = parse_requests(raw)
    assert [r.ticket_id for r in requests] == [
        "01m94s5wh50000xq5gz6n5kh23",
        "01m94s5xbn00002j6yfsgyv0cr",
        "01m94s5ybv00008thj93t3rafx",
    ]
    first = requests[0]
    assert first.start == raw[0]["start_time"]
    assert first.end == raw[0]["end_time"]
    assert first.first_token == raw[0]["info"]["response_metrics"]["output_token_times"][0]
    assert first.ok


def test_a_failed_request_without_chunks_names_no_ticket() -> None:
    record = {
        "start_time": 1.0,
        "end_time": 2.0,
        "info": {"response_metrics": {}},
        "error": {"error_type": "x"},
    }
    (request,) = parse_requests([record])
    assert (request.ticket_id, request.first_token, request.ok) == (None, None, False)


def test_a_request_without_times_is_refused() -> None:
    with pytest.raises(ReportError, match="request 0"):
        parse_requests([{"info": {}}])


def test_read_report_reads_both_files_and_names_a_missing_one(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=str(tmp_path)):
        read_report(tmp_path)
    for name in (SUMMARY_FILE, PER_REQUEST_FILE):
        shutil.copy(FIXTURES / name, tmp_path / name)
    summary, requests = read_report(tmp_path)
    assert summary.answered == 30
    assert len(requests) == 3
