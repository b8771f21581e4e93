"""This worker's side of the shared breakers: whether to claim, where to send, what to count.

The claim loop asks `claim_gate()` before claiming: while the primary's circuit is open nothing is
claimed (tickets wait in the queue, their TTL running); half-open, one worker wins the one probe.
The breaker is also the endpoint's one health state: after a failed call every worker waits out
one pause (the retry backoff curve, at least vLLM's Retry-After), then one worker of all sends the
probe, until a call succeeds. The executor asks `client_for()` and reports each outcome (a failure
with vLLM's Retry-After) with `record()`. Fallbacks come from
`TIDEGATE_FALLBACK_VLLM_URL` (a comma-separated list); one is used only while its model version
(after the last `:` of its served name) equals the primary's, or the policy's `[models] version`.
A mismatched fallback is reported (event, status, metric) and never used.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from shared import clock
from shared.breaker import BreakerState, Phase, endpoint_id, model_version
from shared.breaker_store import BreakerStore
from shared.control import append_event
from shared.policy import Policy
from worker.claim_plan import Bound, Gate
from worker.vllm_client import VllmClient, VllmError

log = logging.getLogger(__name__)

CACHE_SECONDS = 0.2
"""How stale this worker's view of a breaker may be: one Redis read per this, not per claim."""


@dataclass
class Fallback:
    client: VllmClient
    endpoint: str
    status: str = "unknown"
    """`matched`, `mismatched`, or `unknown` (its /v1/models did not answer yet)."""


def fallback_urls(setting: str | None) -> list[str]:
    return [url.strip() for url in (setting or "").split(",") if url.strip()]


class BreakerGate:
    def __init__(
        self, store: BreakerStore, policy: Policy, primary: VllmClient, fallbacks: list[VllmClient]
    ) -> None:
        self.store = store
        self.policy = policy
        self.primary = primary
        self.primary_endpoint = endpoint_id(primary.base_url)
        self.fallbacks = [Fallback(c, endpoint_id(c.base_url)) for c in fallbacks]
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, BreakerState]] = {}
        self.listeners: list[Callable[[str, BreakerState, list[str]], None]] = []
        """Told of every transition this worker commits (each is committed once, by one worker)."""

    # ---- state --------------------------------------------------------------------------------
    def state(self, endpoint: str) -> BreakerState:
        now = clock.monotonic()
        with self._lock:
            cached = self._cache.get(endpoint)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        # Evaluating, not just reading: a rung whose traffic moved to the fallback must be able
        # to clear although nothing is counted for its endpoint any more.
        state, transitions = self.store.record(endpoint, None)
        self._remember(endpoint, state)
        self._announce(endpoint, state, transitions)
        return state

    def _announce(self, endpoint: str, state: BreakerState, transitions: list[str]) -> None:
        for transition in transitions:
            log.warning("breaker %s: %s", endpoint, transition)
        if transitions:
            for listener in self.listeners:
                listener(endpoint, state, transitions)

    def _remember(self, endpoint: str, state: BreakerState) -> None:
        with self._lock:
            self._cache[endpoint] = (clock.monotonic(), state)

    def primary_healthy(self) -> bool:
        return self.state(self.primary_endpoint).phase(clock.now()) is Phase.CLOSED

    # ---- claiming -----------------------------------------------------------------------------
    def claim_gate(self) -> tuple[Gate, float, Bound | None]:
        """Whether to claim: GO, PROBE (one ticket, if `take_probe` wins it), or WAIT seconds; and
        why not GO: `open`, `half_open`, or `failing` (the primary failed its last call)."""
        now = clock.now()
        state = self.state(self.primary_endpoint)
        phase = state.phase(now)
        if phase is Phase.OPEN:
            return Gate.WAIT, state.open_until - now, Bound.OPEN
        if phase is Phase.CLOSED and not state.failures:
            return Gate.GO, 0.0, None
        why = Bound.HALF_OPEN if phase is Phase.HALF_OPEN else Bound.FAILING
        if not state.probing(now):
            return Gate.WAIT, state.paused_until - now, why
        if state.probe_until > now:
            return Gate.WAIT, 0.5, why  # another worker's probe is out
        return Gate.PROBE, 0.0, why

    def take_probe(self, endpoint: str | None = None) -> bool:
        """Claim the one probe of `endpoint` (the primary's by default)."""
        endpoint = endpoint or self.primary_endpoint
        taken = self.store.take_probe(endpoint)
        with self._lock:
            self._cache.pop(endpoint, None)
        return taken

    def release_probe(self) -> None:
        self.store.release_probe(self.primary_endpoint)
        with self._lock:
            self._cache.pop(self.primary_endpoint, None)

    # ---- routing and counting -----------------------------------------------------------------
    def usable_fallback(self, *, verified: bool) -> Fallback | None:
        """A fallback whose circuit is closed, outside a failure pause, and whose version matched
        (or, unless `verified`, is not known yet); a mismatched one never."""
        now = clock.now()
        accepted = ("matched",) if verified else ("matched", "unknown")
        for fallback in self.fallbacks:
            if fallback.status not in accepted:
                continue
            state = self.state(fallback.endpoint)
            if state.phase(now) is Phase.CLOSED and state.paused_until <= now:
                return fallback
        return None

    def client_for(self, routed_to_fallback: bool, probe: bool) -> VllmClient:
        """Probes go to the primary; sustained errors send to a verified fallback, a ticket routed
        there at admission (orange) to any fallback not known to mismatch."""
        if probe:
            return self.primary
        if self.state(self.primary_endpoint).sustained:
            fallback = self.usable_fallback(verified=True)
            if fallback is not None:
                return fallback.client
        if routed_to_fallback:
            fallback = self.usable_fallback(verified=False)
            if fallback is not None:
                return fallback.client
        return self.primary

    def record(
        self, client: VllmClient, ok: bool, *, probe: bool = False, retry_after: float | None = None
    ) -> None:
        """Count a call: `ok` False only for a transient failure (5xx, timeout, refused, OOM)."""
        endpoint = endpoint_id(client.base_url)
        state, transitions = self.store.record(endpoint, ok, probe=probe, retry_after=retry_after)
        self._remember(endpoint, state)
        self._announce(endpoint, state, transitions)

    # ---- pairing ------------------------------------------------------------------------------
    def pair(self) -> None:
        """Read every endpoint's served model; pair fallbacks whose version matches, report the rest."""
        primary_model = self._model_of(self.primary)
        wanted = self.policy.models.version or (model_version(primary_model) if primary_model else None)
        self.store.describe(
            self.primary_endpoint,
            role="primary",
            model=primary_model or "",
            model_version=(model_version(primary_model) or "") if primary_model else "",
        )
        for fallback in self.fallbacks:
            model = self._model_of(fallback.client)
            version = model_version(model) if model else None
            if model is None or (primary_model is None and self.policy.models.version is None):
                status = "unknown"
            else:  # two names without a version pair too: nothing says they differ
                status = "matched" if version == wanted else "mismatched"
            if status != fallback.status:
                self._report_pairing(fallback, status, model or "", version or "", wanted or "")
            fallback.status = status

    def _report_pairing(self, fallback: Fallback, status: str, model: str, version: str, wanted: str) -> None:
        self.store.describe(
            fallback.endpoint, role="fallback", model=model, model_version=version, fallback_status=status
        )
        if status == "mismatched":
            log.error(
                "fallback %s serves %r (version %r), not version %r; it will not be used",
                fallback.endpoint,
                model,
                version,
                wanted,
            )
            append_event(
                self.store.redis,
                self.store.keys,
                "fallback_mismatch",
                endpoint=fallback.endpoint,
                model=model,
                version=version,
                wanted=wanted,
            )

    @staticmethod
    def _model_of(client: VllmClient) -> str | None:
        try:
            return client.served_model()
        except VllmError as exc:
            log.warning("cannot read %s/v1/models (%s)", client.base_url, exc)
            return None
