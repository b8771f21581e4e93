"""The run's books: done + rejected + expired + cancelled + failed = submitted, per type and in total,
kept twice — by Redis (the queue's outcome counters) and by the branches (what each was answered) —
and the two must agree. Either side alone could hide a lost ticket; both together cannot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ops.lab.traffic.records import OUTCOMES, TicketRecord


@dataclass(frozen=True)
class Ledger:
    source: str
    by_type: dict[str, dict[str, int]]
    """type → {"submitted": n, "done": n, ...}."""

    def submitted(self, ticket_type: str | None = None) -> int:
        return self._sum("submitted", ticket_type)

    def ended(self, ticket_type: str | None = None) -> int:
        return sum(self._sum(outcome, ticket_type) for outcome in OUTCOMES)

    def count(self, outcome: str, ticket_type: str | None = None) -> int:
        return self._sum(outcome, ticket_type)

    def _sum(self, field: str, ticket_type: str | None) -> int:
        rows = [self.by_type.get(ticket_type, {})] if ticket_type is not None else self.by_type.values()
        return sum(row.get(field, 0) for row in rows)

    def unbalanced(self) -> list[str]:
        """Types whose ended tickets do not add up to their submissions."""
        return [t for t in self.by_type if self.ended(t) != self.submitted(t)]


def redis_ledger(counts: Mapping[str, int], types: Sequence[str]) -> Ledger:
    """From the queue's `counts` hash ("<type>:<outcome>" → n)."""
    fields = ("submitted", *OUTCOMES)
    return Ledger("redis", {t: {f: int(counts.get(f"{t}:{f}", 0)) for f in fields} for t in types})


def client_ledger(records: Iterable[TicketRecord], types: Sequence[str]) -> Ledger:
    """From the branches' records: every answered submission and how it ended."""
    rows = {t: dict.fromkeys(("submitted", *OUTCOMES), 0) for t in types}
    for record in records:
        row = rows.setdefault(record.type, dict.fromkeys(("submitted", *OUTCOMES), 0))
        row["submitted"] += record.submissions
        for outcome, count in record.submission_outcomes().items():
            row[outcome] += count
    return Ledger("clients", rows)


@dataclass(frozen=True)
class AccountingCheck:
    redis: Ledger
    clients: Ledger
    client_errors: int
    """Requests that ended in a client-side error (no answer, an unexpected HTTP status)."""
    open_records: int
    """Requests not yet terminal when the books were closed."""

    @property
    def mismatches(self) -> list[str]:
        """Every way the books disagree, in words."""
        problems = [f"Redis: {t} does not balance" for t in self.redis.unbalanced()]
        problems += [f"clients: {t} does not balance" for t in self.clients.unbalanced()]
        for ticket_type in sorted(set(self.redis.by_type) | set(self.clients.by_type)):
            for field in ("submitted", *OUTCOMES):
                ours = self.clients.count(field, ticket_type)
                theirs = self.redis.count(field, ticket_type)
                if ours != theirs:
                    problems.append(f"{ticket_type} {field}: clients {ours}, Redis {theirs}")
        if self.client_errors:
            problems.append(f"{self.client_errors} requests ended in a client-side error")
        if self.open_records:
            problems.append(f"{self.open_records} requests had not ended")
        return problems

    @property
    def holds(self) -> bool:
        return not self.mismatches

    def line(self) -> str:
        formula = "done + rejected + expired + cancelled + failed = submitted"
        figures = (
            f"Redis {self.redis.ended()} = {self.redis.submitted()}, "
            f"branches {self.clients.ended()} = {self.clients.submitted()}"
        )
        if self.holds:
            return f"accounting: {formula}: holds ({figures}, per type too)"
        return f"accounting: {formula}: DOES NOT HOLD ({figures}): " + "; ".join(self.mismatches[:6])


def check_accounting(
    counts: Mapping[str, int],
    records: Sequence[TicketRecord],
    types: Sequence[str],
    clients: Ledger | None = None,
) -> AccountingCheck:
    """Redis's books against the branches': `clients` when the branches kept a ledger of their own
    (each submission counted by its ticket's end, where a record holds the branch's view), else the
    records' own."""
    return AccountingCheck(
        redis=redis_ledger(counts, types),
        clients=clients if clients is not None else client_ledger(records, types),
        client_errors=sum(1 for r in records if r.outcome == "error"),
        open_records=sum(1 for r in records if r.submissions and not r.terminal),
    )
