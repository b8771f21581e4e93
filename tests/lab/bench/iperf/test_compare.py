"""The two sides summarised alike, the 10% bar on TTFT p50 and answered count, and the per-request gap."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

from ops.lab.bench.iperf.compare import (
    Figures,
    agreement_holds,
    compare,
    linear_percentile,
    per_request_gap,
    ticket_figures,
)
from ops.lab.bench.iperf.report import ClientRequest
from ops.lab.bench.iperf.table import print_iperf
from ops.lab.bench.iperf.tickets import TicketTimes

T0 = 1_800_000_000.0


def _ticket(
    n: int, ttft: float = 0.2, latency: float = 1.0, status: str = "done", deadline: float = 10.0
) -> TicketTimes:
    created = T0 + n
    return TicketTimes(
        id=f"t{n}",
        status=status,
        created_at=created,
        first_token_at=created + ttft if status == "done" else None,
        finished_at=created + latency if status == "done" else None,
        deadline=created + deadline,
        completion_tokens=100 if status == "done" else None,
    )


def _figures(answered: int = 100, ttft_p50: float | None = 0.2) -> Figures:
    return Figures(answered, ttft_p50, 0.4, 1.0, 2.0, 200.0, answered)


def test_percentiles_are_numpys_linear_ones() -> None:
    assert linear_percentile([], 50) is None
    assert linear_percentile([3.0], 99) == 3.0
    assert linear_percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert linear_percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)


def test_ticket_figures_count_done_tickets_and_time_them_from_creation() -> None:
    tickets = [
        _ticket(0, ttft=0.1, latency=1.0),
        _ticket(1, ttft=0.3, latency=3.0),
        _ticket(2, ttft=0.2, latency=20.0),  # past its 10 s deadline
        _ticket(3, status="cancelled"),
    ]
    figures = ticket_figures(tickets)
    assert figures.answered == 3
    assert figures.ttft_p50 == pytest.approx(0.2)
    assert figures.latency_p50 == pytest.approx(3.0)
    assert figures.good == 2
    # 300 tokens from the first creation (T0) to the last answer (T0 + 2 + 20)
    assert figures.output_tokens_per_s == pytest.approx(300 / 22.0)


def test_no_answers_give_no_percentiles_and_no_rate() -> None:
    figures = ticket_figures([_ticket(0, status="expired")])
    assert (figures.answered, figures.ttft_p50, figures.output_tokens_per_s, figures.good) == (
        0,
        None,
        None,
        0,
    )


def test_agreement_is_judged_on_ttft_p50_and_the_answered_count_only() -> None:
    rows = compare(_figures(answered=100, ttft_p50=0.219), _figures(answered=100, ttft_p50=0.2))
    by_key = {row.key: row for row in rows}
    assert by_key["ttft_p50"].difference == pytest.approx(0.095)
    assert by_key["ttft_p50"].agrees
    assert agreement_holds(rows)
    assert [row.key for row in rows if row.gated] == ["answered", "ttft_p50"]

    slower = compare(_figures(ttft_p50=0.221), _figures(ttft_p50=0.2))
    assert not agreement_holds(slower)
    fewer = compare(_figures(answered=89), _figures(answered=100))
    assert not agreement_holds(fewer)
    missing = compare(_figures(ttft_p50=None), _figures())
    assert not agreement_holds(missing)


def test_the_gap_splits_into_the_way_in_and_the_way_out() -> None:
    offset = 1000.0  # tidegate's wall clock minus the client's monotonic one
    tickets = [_ticket(n, ttft=0.2, latency=1.0) for n in range(3)]
    requests = []
    for ticket in tickets:
        start = ticket.created_at - 0.004 - offset  # sent 4 ms before the ticket existed
        first = ticket.created_at + 0.2 + 0.002 - offset  # reached the client 2 ms after the worker saw it
        end = ticket.created_at + 1.0 + 0.003 - offset
        requests.append(ClientRequest(ticket.id, start, first, end, ok=True))
    requests.append(ClientRequest(None, 0.0, None, 1.0, ok=False))
    shed = _ticket(5, status="rejected")
    requests.append(ClientRequest(shed.id, 0.0, 0.1, 0.2, ok=True))  # a degraded 200
    gap = per_request_gap(requests, [*tickets, shed, _ticket(9)], offset)
    assert (gap.paired, gap.unpaired_requests, gap.unpaired_tickets, gap.shed_answers) == (3, 2, 1, 1)
    assert gap.ttft.p50_ms == pytest.approx(6.0, abs=0.01)
    assert gap.latency.p50_ms == pytest.approx(7.0, abs=0.01)
    assert gap.before_ticket is not None and gap.before_ticket.p50_ms == pytest.approx(4.0, abs=0.01)
    assert gap.after_first_token is not None and gap.after_first_token.p50_ms == pytest.approx(2.0, abs=0.01)

    unaligned = per_request_gap(requests, tickets, None)
    assert unaligned.ttft.p50_ms == pytest.approx(6.0, abs=0.01)
    assert unaligned.before_ticket is None and unaligned.after_first_token is None


def test_the_table_prints_every_row_and_the_verdict() -> None:
    rows = compare(_figures(ttft_p50=0.25), _figures(ttft_p50=0.2))
    tickets = [_ticket(0)]
    gap = per_request_gap([ClientRequest("t0", T0 - 0.01, T0 + 0.2, T0 + 1.0, ok=True)], tickets, 0.0)
    doc = {
        "options": {
            "shape": {"rate": 2.0, "duration_s": 60, "prompt_tokens": 1024, "output_tokens": 128},
            "ticket_type": "complaint",
        },
        "rows": [row.to_dict() for row in rows],
        "agreement_holds": agreement_holds(rows),
        "tidegate": {
            "api_e2e_ttft": {"observed": 1.0, "p50_ms": 210.0, "p50_bucket_s": [0.1, 0.25]},
            "shed_codes": ["deadline_unreachable"],
        },
        "gap": gap.to_dict() | {"shed_answers": 1},
        "cpu_cores": {"api": 0.1, "inference-perf": 0.2},
        "load_average": {"before": [1.0, 1.0, 1.0], "after": [2.0, 1.0, 1.0]},
        "cpus": 2,
        "client": {"send_lag_p50": 0.0005, "send_lag_p99": 0.0123},
    }
    out = StringIO()
    print_iperf(Console(file=out, width=200), doc)
    text = out.getvalue()
    assert "+25.0%" in text
    assert "TTFT p50" in text and "NO" in text
    assert "does NOT hold" in text
    assert "100–250 ms bucket" in text
    assert "p50 0.5 ms, p99 12.3 ms" in text
    assert (
        "1 request(s) inference-perf counted as answered were shed by tidegate (deadline_unreachable)" in text
    )
