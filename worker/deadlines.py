"""No GPU time for answers nobody waits for: a claimed ticket whose deadline can no longer be met is
not started but ended `expired` with reason `deadline_passed` (readable, and counted per type).

Critical types are exempt, as from the admission rule: a loan decision is still wanted after its
SLO, and its TTL bounds how long it may wait. Within a priority band the claim already takes the
earliest deadline first: a type's tickets share one SLO, so their deadlines follow their arrival
order (a caller's sooner deadline does not move a ticket forward; it only ends it sooner).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.models import Ticket

DEADLINE_PASSED = "deadline_passed"
"""The reason an unstarted ticket ended `expired` at its worker, first in its error text."""


@dataclass(frozen=True)
class StartRule:
    """Whether a claimed ticket may still start: `service_seconds` is the least time an answer
    takes (its first token), so a ticket due sooner than that could not be answered in time."""

    critical: frozenset[str]
    service_seconds: float

    def too_late(self, ticket: Ticket, now: float) -> bool:
        if ticket.deadline is None or ticket.type in self.critical:
            return False
        return now + self.service_seconds > ticket.deadline

    def reason(self, ticket: Ticket, now: float) -> str:
        """The error text of such a ticket: its reason code first, then the figures."""
        late = now - (ticket.deadline or now)
        return (
            f"{DEADLINE_PASSED}: not started, as its deadline could no longer be met "
            f"({late:+.2f} s past it when a worker took it, with {self.service_seconds:.2f} s of service)"
        )
