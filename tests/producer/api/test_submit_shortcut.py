"""The submit shortcut answers exactly as the route would: status, body, headers, record and counts.

Two APIs serve one queue, one with the shortcut and one without, both with caches long enough that
each request of a pair sees the same cached state; every pair is compared field by field.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from producer.api.app import create_app
from producer.api.keys import Role
from shared.config import Settings
from shared.control import Mode, set_mode
from shared.keys import QueueKeys
from shared.policy import default_policy_text
from shared.shed_log import recent_sheds
from tests.producer.api.conftest import publish_alarm
from tests.producer.api.server import serve

COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice."}
LOAN = {"type": "loan_approval", "prompt": "Approve?", "urgent_level": 5}
ARCHIVE = {"type": "archive_query", "prompt": "Statements of 2019", "is_bulk": True}
LONG_CACHE_S = 600.0
COMPARED_HEADERS = ("content-type", "content-length", "retry-after", "idempotent-replayed")


@dataclass
class Side:
    url: str
    app: FastAPI
    session: requests.Session

    @property
    def shortcut_answers(self) -> int:
        shortcut = getattr(self.app.state, "submit_shortcut", None)
        return shortcut.answered if shortcut is not None else 0


@pytest.fixture
def policy_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """The deployment's policy file: None (the default policy), or "capped": every type's cap 2."""
    if getattr(request, "param", None) != "capped":
        return None
    path = tmp_path / "capped.toml"
    path.write_text(re.sub(r"(?m)^cap = \d+", "cap = 2", default_policy_text()))
    return path


@pytest.fixture
def sides(redis_url: str, queue_name: str, policy_file: Path | None) -> Iterator[tuple[Side, Side]]:
    settings = Settings(
        redis_url=redis_url,
        queue_name=queue_name,
        operator_key="op_" + secrets.token_urlsafe(16),
        policy_file=str(policy_file) if policy_file else None,
    )
    fast = create_app(settings, auth_cache_seconds=LONG_CACHE_S, admission_cache_seconds=LONG_CACHE_S)
    route = create_app(
        settings, auth_cache_seconds=LONG_CACHE_S, admission_cache_seconds=LONG_CACHE_S, submit_shortcut=False
    )
    token, _ = fast.state.context.key_store.create(Role.BRANCH, "0412", "shortcut test")
    with serve(fast) as fast_url, serve(route) as route_url, requests.Session() as a, requests.Session() as b:
        a.headers["Authorization"] = b.headers["Authorization"] = f"Bearer {token}"
        yield Side(fast_url, fast, a), Side(route_url, route, b)


def _counts(redis_client: Redis, keys: QueueKeys) -> dict[str, int]:
    return {k: int(v) for k, v in redis_client.hgetall(keys.counts).items()}


def _answer(side: Side, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    answer = side.session.post(side.url + "/v1/tickets", json=body, headers=headers or {}, timeout=10)
    payload = answer.json()
    ticket_id = (payload.get("error") or {}).get("ticket_id") or payload.get("id")
    if ticket_id is not None:  # each side mints its own id; what the branch reads of it must match
        record = side.session.get(f"{side.url}/v1/tickets/{ticket_id}", timeout=10).json()
        payload = {"answer": payload, "record": record}
        payload = _without(
            payload, {"id", "ticket_id", "created_at", "expires_at", "finished_at", "timings", "deadline"}
        )
    kept = {name: answer.headers[name] for name in COMPARED_HEADERS if name in answer.headers}
    if answer.status_code == 202:
        kept.pop("content-length", None)  # a 202 carries its own times
    return answer.status_code, payload, kept


def _without(value: Any, names: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, names) for k, v in value.items() if k not in names}
    if isinstance(value, list):
        return [_without(v, names) for v in value]
    return value


def _same_answer(
    sides: tuple[Side, Side],
    redis_client: Redis,
    keys: QueueKeys,
    body: Any,
    headers: dict[str, str] | None = None,
) -> tuple[int, bool]:
    """Post `body` to each side; assert equal answers and equal changes to the books. Returns the
    status and whether the shortcut answered."""
    fast, route = sides
    taken = fast.shortcut_answers
    changes = []
    answers = []
    for side in (fast, route):
        before = _counts(redis_client, keys)
        answers.append(_answer(side, body, headers))
        after = _counts(redis_client, keys)
        changes.append(
            {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        )
    assert answers[0] == answers[1]
    assert changes[0] == changes[1]
    return answers[0][0], fast.shortcut_answers > taken


def _answers_by_route(side: Side) -> dict[tuple[str, str, str], float]:
    body = requests.get(side.url + "/metrics", timeout=10).text
    return {
        (sample.labels["handler"], sample.labels["method"], sample.labels["status"]): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "tidegate_http_requests_total"
    }


def _warm(sides: tuple[Side, Side], body: Any) -> None:
    """One request per side fills its admission and key caches (the route answers it)."""
    for side in sides:
        side.session.post(side.url + "/v1/tickets", json=body, timeout=10)


def test_red_sheds_through_the_shortcut_as_the_route_does(
    sides: tuple[Side, Side], redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    publish_alarm(redis_client, keys, "red")  # drain rate over depth: Retry-After 1 s on both sides
    _warm(sides, COMPLAINT)
    sheds_before = recent_sheds(redis_client, keys).total
    assert _same_answer(sides, redis_client, keys, COMPLAINT) == (429, True)
    assert _same_answer(sides, redis_client, keys, {**COMPLAINT, "urgent_level": 2}) == (429, True)
    assert recent_sheds(redis_client, keys).total == sheds_before + 4  # every refusal counted
    # Retries under one Idempotency-Key take over the earlier record, whichever side wrote it.
    for _ in range(2):
        assert _same_answer(sides, redis_client, keys, COMPLAINT, {"Idempotency-Key": "retry-a"}) == (
            429,
            True,
        )
    # The shortcut's answers are counted under the route's labels, as the route counts its own.
    fast, route = sides
    counted = _answers_by_route(fast)
    assert counted == _answers_by_route(route)
    assert counted[("/v1/tickets", "POST", "429")] == 5  # the warm-up's and four shortcut answers


def test_what_the_shortcut_cannot_read_goes_to_the_route(
    sides: tuple[Side, Side], redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    publish_alarm(redis_client, keys, "red")
    _warm(sides, COMPLAINT)
    cases: list[tuple[Any, dict[str, str] | None, int]] = [
        ({"type": "complaint"}, None, 422),  # no prompt
        ({**COMPLAINT, "type": "no_such_type"}, None, 422),
        ({**COMPLAINT, "branch_id": "0999"}, None, 403),
        ({**COMPLAINT, "idempotency_key": "a"}, {"Idempotency-Key": "b"}, 409),
        (COMPLAINT, {"Idempotency-Key": "k" * 129}, 422),
        (COMPLAINT, {"Authorization": "Bearer not-a-key"}, 401),
        (COMPLAINT, {"X-Tidegate-Deadline-Ms": "0"}, 422),
        (COMPLAINT, {"X-Tidegate-Deadline-Ms": "soon"}, 422),
        (COMPLAINT, {"X-Tidegate-Deadline-Ms": str(8 * 86_400_000)}, 422),
        (COMPLAINT, {"X-Tidegate-Other": "1"}, 429),  # a tidegate header it does not read
    ]
    for body, headers, status in cases:
        assert _same_answer(sides, redis_client, keys, body, headers) == (status, False)


def test_admitted_tickets_are_answered_through_the_shortcut_as_the_route_does(
    sides: tuple[Side, Side], redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    publish_alarm(redis_client, keys, "red")
    _warm(sides, LOAN)
    assert _same_answer(sides, redis_client, keys, LOAN) == (202, True)  # critical: admitted in red
    deadline = {"X-Tidegate-Deadline-Ms": "1500"}  # sooner than the loan's SLO: it wins on both
    assert _same_answer(sides, redis_client, keys, LOAN, deadline) == (202, True)
    assert _same_answer(sides, redis_client, keys, COMPLAINT, {"X-Tidegate-Deadline-Ms": "60000"}) == (
        429,
        True,
    )
    for side in sides:
        side.app.state.context.producer.admission.invalidate()
    publish_alarm(redis_client, keys, "green")
    _warm(sides, COMPLAINT)
    assert _same_answer(sides, redis_client, keys, COMPLAINT) == (202, True)
    fast, route = sides
    for side in sides:  # a retry under one key replays that side's ticket on both paths
        first = side.session.post(
            side.url + "/v1/tickets", json=COMPLAINT, headers={"Idempotency-Key": "k-" + side.url}, timeout=10
        )
        again = side.session.post(
            side.url + "/v1/tickets", json=COMPLAINT, headers={"Idempotency-Key": "k-" + side.url}, timeout=10
        )
        assert (first.status_code, again.status_code) == (202, 202)
        assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    counted = _answers_by_route(fast)
    assert counted == _answers_by_route(route)
    assert counted[("/v1/tickets", "POST", "202")] == 7


def test_critical_only_sheds_alike_and_orange_admits_alike(
    sides: tuple[Side, Side], redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    publish_alarm(redis_client, keys, "orange")  # archive queries deferred while their deadline holds
    _warm(sides, ARCHIVE)
    assert _same_answer(sides, redis_client, keys, ARCHIVE) == (202, True)
    assert _same_answer(sides, redis_client, keys, COMPLAINT) == (202, True)
    for side in sides:
        side.app.state.context.producer.admission.invalidate()
    publish_alarm(redis_client, keys, "green")
    set_mode(redis_client, keys, Mode.CRITICAL_ONLY)
    _warm(sides, COMPLAINT)
    assert _same_answer(sides, redis_client, keys, COMPLAINT) == (429, True)


@pytest.mark.parametrize("policy_file", ["capped"], indirect=True)
def test_a_cap_seen_by_the_script_is_refused_alike_from_memory(
    sides: tuple[Side, Side], redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    publish_alarm(redis_client, keys, "green")  # a drain rate: Retry-After 1 s on both sides
    fast, route = sides
    for _ in range(3):  # two queued, then the script refuses the third at the cap
        fast.session.post(fast.url + "/v1/tickets", json=COMPLAINT, timeout=10)
    refused = route.session.post(route.url + "/v1/tickets", json=COMPLAINT, timeout=10)
    assert refused.json()["error"]["code"] == "type_cap_reached"  # each side has now seen the cap
    assert _same_answer(sides, redis_client, keys, COMPLAINT) == (429, True)
