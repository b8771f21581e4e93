"""Every Redis key of a queue, from one hash-tagged prefix.

All keys of queue `q` share the hash tag `{tidegate:q}`, so a queue lives on one Redis Cluster slot
and multi-key Lua scripts stay legal there. Nothing else in the code base spells a key.
"""

from __future__ import annotations

from dataclasses import dataclass

KNOWN_QUEUES = "tidegate:known-queues"
"""SET of the queue names workers have served: how an operator's `GET /v1/queues` finds every
queue. The one key outside a queue's hash tag (a single-key set, legal on a Cluster)."""

WAKE_LIST_CAP = 64
"""Most wake-up markers a queue's wake list holds: enough to wake every idle worker."""


@dataclass(frozen=True)
class QueueKeys:
    queue: str = "default"

    @property
    def prefix(self) -> str:
        return "{tidegate:" + self.queue + "}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    # Queue state
    @property
    def pending(self) -> str:
        """ZSET id → priority score (shared/scoring.py): tickets ready to run."""
        return self._key("pending")

    @property
    def delayed(self) -> str:
        """ZSET id → ready time: tickets waiting out a retry backoff."""
        return self._key("delayed")

    @property
    def deadlines(self) -> str:
        """ZSET id → expires_at for every queued ticket (pending or delayed): the TTL index."""
        return self._key("deadlines")

    @property
    def inflight(self) -> str:
        """ZSET id → lease deadline of every running ticket."""
        return self._key("inflight")

    def waiting(self, ticket_type: str) -> str:
        """ZSET id → created_at of queued tickets of one type: depth and oldest age in O(log n)."""
        return self._key(f"waiting:{ticket_type}")

    def branch_depth(self, ticket_type: str) -> str:
        """HASH branch → its queued tickets of one type (the fair share's measure); its length is
        the number of branches waiting for that type."""
        return self._key(f"branch-depth:{ticket_type}")

    def branch_tokens(self, ticket_type: str) -> str:
        """HASH branch → weighted tokens of its queued tickets of one type, in thousandths (the
        fair share's measure at admission, docs/fairness.md); a branch has a field while it has a
        depth."""
        return self._key(f"branch-token-units:{ticket_type}")

    def branch_queue(self, ticket_type: str, branch: str) -> str:
        """ZSET id → score of one branch's pending tickets of one type, in queue order: where the
        claim finds the branch's next ticket (docs/fairness.md). Spelled in Lua as the branch depth
        key plus `:<branch>` (lib/tickets.lua `branch_queue_key`), so it needs no KEYS of its own."""
        return f"{self.branch_depth(ticket_type)}:{branch}"

    def branch_service(self, ticket_type: str) -> str:
        """ZSET branch → weighted tokens its claimed tickets of one type cost (the virtual token
        counter), for the branches waiting; the claim serves the one with the least first."""
        return self._key(f"branch-service:{ticket_type}")

    @property
    def ticket_prefix(self) -> str:
        """Prefix of ticket hashes; claim and reap scripts append ids they pop (same hash tag)."""
        return self._key("t:")

    def ticket(self, ticket_id: str) -> str:
        return self.ticket_prefix + ticket_id

    def live(self, ticket_id: str) -> str:
        """STREAM of a ticket's answer as it is generated (tokens, then its end), bounded and expiring."""
        return self._key(f"live:{ticket_id}")

    def api_wake(self, instance: str) -> str:
        """STREAM an API process writes to interrupt its own blocking read of the live streams."""
        return self._key(f"api-wake:{instance}")

    @property
    def idempotency_prefix(self) -> str:
        """Prefix of idempotency keys; the enqueue script appends "<branch>:<key>" (same hash tag)."""
        return self._key("idem:")

    def idempotency(self, branch_id: str, key: str) -> str:
        return f"{self.idempotency_prefix}{branch_id}:{key}"

    @property
    def counts(self) -> str:
        """HASH "<type>:<outcome>" → count of tickets that reached that outcome (and ":submitted")."""
        return self._key("counts")

    @property
    def token_seq(self) -> str:
        """Counter issuing fencing tokens, one per claim."""
        return self._key("token-seq")

    @property
    def wake(self) -> str:
        """LIST of wake-up markers that idle workers block on instead of polling."""
        return self._key("wake")

    @property
    def reaper_lock(self) -> str:
        return self._key("reaper-lock")

    @property
    def outbox(self) -> str:
        """LIST of ids of finished tickets whose callback still has to be handed to rq."""
        return self._key("outbox")

    @property
    def outbox_processing(self) -> str:
        """LIST of outbox ids being handed to rq; ids left here by a crash are handed over again."""
        return self._key("outbox-processing")

    # Monitor and admission
    @property
    def alarm(self) -> str:
        """HASH: level, since, depth — the current alarm as the acting monitor published it."""
        return self._key("alarm")

    @property
    def events(self) -> str:
        """STREAM of alarm transitions, mode changes and actions (capped)."""
        return self._key("events")

    @property
    def audit(self) -> str:
        """STREAM of operator actions (mode, keys, rollouts): who, when, before and after (capped)."""
        return self._key("audit")

    @property
    def mode(self) -> str:
        """STRING: operator override (normal | critical-only)."""
        return self._key("mode")

    @property
    def monitor_lock(self) -> str:
        """STRING (with expiry): id of the monitor that acts; the others stand by."""
        return self._key("monitor-lock")

    @property
    def monitor_state(self) -> str:
        """HASH: drain rate, desired workers, degrade flags and other figures the monitor derives."""
        return self._key("monitor")

    def sheds(self, minute: int) -> str:
        """HASH "<type>:<code>" → tickets shed in that minute (epoch seconds // 60); expires."""
        return self._key(f"sheds:{minute}")

    @property
    def depth_history(self) -> str:
        """STREAM of the acting monitor's samples: at, and t:<type> → depth (capped)."""
        return self._key("depth-history")

    @property
    def rollout(self) -> str:
        """HASH: the queue's one rollout (candidate, version, status, wave, timings); see shared/rollout.py."""
        return self._key("rollout")

    def rollout_arms(self, rollout_id: str) -> str:
        """HASH "<wave>:<arm>:<outcome>" → count of calls each arm answered that way (expiring)."""
        return self._key(f"rollout:{rollout_id}:arms")

    def rollout_ttft(self, rollout_id: str, wave: int, arm: str) -> str:
        """LIST of the latest time-to-first-token samples of one arm in one wave (capped, expiring)."""
        return self._key(f"rollout:{rollout_id}:ttft:{wave}:{arm}")

    def rollout_shadow(self, rollout_id: str) -> str:
        """LIST of JSON A/B records: a ticket's primary answer beside its shadow answer (capped, expiring)."""
        return self._key(f"rollout:{rollout_id}:shadow")

    # Workers
    @property
    def workers(self) -> str:
        """ZSET worker id → heartbeat deadline."""
        return self._key("workers")

    def worker(self, worker_id: str) -> str:
        """HASH with the worker's host, GPU, model, in-flight count, batch limit, KV usage (TTL'd)."""
        return self._key(f"worker:{worker_id}")

    # Circuit breakers (shared/breaker.py)
    @property
    def breakers(self) -> str:
        """SET of the endpoints that have a breaker state (each in `breaker(endpoint)`)."""
        return self._key("breakers")

    def breaker(self, endpoint: str) -> str:
        """HASH: one endpoint's breaker state (open_until, probe_until, sustained, deep, version, …)."""
        return self._key(f"breaker:{endpoint}")

    def breaker_bucket(self, endpoint: str, rung: str, index: int) -> str:
        """HASH {ok, err}: one time bucket of a rung's window (TTL'd)."""
        return self._key(f"breaker:{endpoint}:{rung}:{index}")

    def breaker_paged(self, endpoint: str, deep_since: float) -> str:
        """STRING, set NX by the monitor that pages for one deep episode (so it pages once)."""
        return self._key(f"breaker:{endpoint}:paged:{deep_since!r}")

    # API keys
    @property
    def api_keys(self) -> str:
        """HASH sha256(key) → JSON {branch_id, role, created_at, revoked}."""
        return self._key("api-keys")

    @property
    def callback_secrets(self) -> str:
        """HASH branch id → the branch's Standard Webhooks signing secret (whsec_…), for callbacks."""
        return self._key("callback-secrets")
