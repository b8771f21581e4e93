"""`tidegate bench overload --quick` end to end: real processes, books and crashes, with the
branches calling them either way: tickets (submit and poll; the FIFO beside it) or streamed OpenAI
completions (tidegate's front door, from the open loop every OpenAI-speaking arm is played by)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OUTCOME_FIELDS = ("done", "rejected", "expired", "cancelled", "failed")
DURATION_S = 15.0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", ["tickets", "openai"])
def test_quick_overload_keeps_the_books_and_tidegate_never_crashes_a_gpu(
    redis_url: str, tmp_path: Path, client: str
) -> None:
    results = tmp_path / "overload"
    # The FIFO baseline has no OpenAI door: it runs once, beside the tickets client; the openai run
    # plays tidegate alone (a peer arm streamed from the same open loop is tested against a simulator in
    # test_open_loop.py: here it would add a third of a minute).
    expected = {"tidegate", "fifo"} if client == "tickets" else {"tidegate"}
    arms = ["--system", "tidegate,fifo" if client == "tickets" else "tidegate"]
    env = os.environ | {"TIDEGATE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    # The quick sizes with half their surge: this test reads the books and the crashes, not figures,
    # and a shorter run still takes both systems through the surge and its drain.
    command = [sys.executable, "-c", "from tidegate.cli import main; main()", "bench", "overload", "--quick"]
    flags = ["--duration", str(DURATION_S), "--client", client, *arms, "--json"]
    run = subprocess.run(
        [*command, *flags, "--results-dir", str(results)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    document = json.loads(run.stdout)
    systems = document["systems"]
    assert set(systems) == expected

    for name, system in systems.items():
        # Every submission ended in exactly one outcome, per type.
        assert system["books"]["holds"], f"{name}: {system['books']['line']}"
        for ticket_type, ledger in system["books"]["by_type"].items():
            ended = sum(ledger.get(outcome, 0) for outcome in OUTCOME_FIELDS)
            assert ended == ledger["submitted"] > 0, f"{name} {ticket_type}: {ledger}"
        # And every planned request reached a final outcome.
        for ticket_type, row in system["rows"].items():
            ends = row["done"] + row["rejected"] + row["expired"] + row["failed"] + row["cancelled"]
            assert ends + row["errors"] == row["offered"] and row["errors"] == 0, (
                f"{name} {ticket_type}: {row}"
            )
        lines = (results / f"{name}-tickets.jsonl").read_text().splitlines()
        assert len(lines) == system["rows"]["all"]["offered"] == document["plan"]["total"]

    tidegate = systems["tidegate"]
    assert tidegate["oom_crashes"] == 0, f"tidegate crashed a simulated GPU: {tidegate}"
    assert tidegate["rows"]["loan_approval"]["rejected"] == 0
    assert tidegate["books"]["by_type"]["loan_approval"]["rejected"] == 0
    # Redis's counters and the branches' records are two ledgers; they agreed (books hold), and the
    # server counted what the branches sent.
    assert (
        tidegate["books"]["by_type"]["loan_approval"]["submitted"]
        == tidegate["rows"]["loan_approval"]["submissions"]
    )

    for name, system in systems.items():
        loans = system["rows"]["loan_approval"]
        if client == "openai":  # every arm's branches streamed: their own time to first token is reported
            assert system["client"] == "openai"
            assert loans["ttft_p50_s"] is not None and 0 < loans["ttft_p50_s"] <= loans["ttft_p99_s"]
            assert loans["ttft_p99_s"] <= loans["p99_s"], f"{name}: {loans}"
        else:
            assert loans["ttft_p99_s"] is None
        # The harness shows it kept up: how late it sent, and the CPU it used, for every arm.
        lag = document["harness"][name]["send_lag"]
        assert lag == system["send_lag"] and 0 <= lag["p50_s"] <= lag["p99_s"] <= lag["max_s"], (
            f"{name}: {lag}"
        )
        assert document["harness"][name]["cpu_cores"] == system["cpu_cores"]["harness"] > 0
        assert document["harness"][name]["cpu_cores_in_surge"] == system["cpu_cores"]["harness_in_surge"] > 0
    assert document["scenario"]["client"] == client
    assert document["scenario"]["duration_s"] == DURATION_S
    assert document["capacity"]["tokens_per_s"] > 0
    assert (results / "overload.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((results / "results.json").read_text())
    assert set(saved["timelines"]) == expected and saved["timelines"]["tidegate"]
