"""Per ticket type (class): how many were refused early, by shed code, and how many expired before
a worker started them because their deadline could no longer be met. Both are running counts in the
queue's counts hash (`<type>:shed:<code>`, written by the enqueue script; `<type>:deadline_passed`,
by the finish script), read here for `tidegate status` and the metrics."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SHED_FIELD = "shed"
DEADLINE_PASSED_FIELD = "deadline_passed"


@dataclass
class ClassCounts:
    refused: dict[str, int] = field(default_factory=dict)
    """Tickets shed at submission, by shed code."""
    expired_before_start: int = 0
    """Tickets a worker ended unstarted because their deadline could no longer be met."""

    def as_dict(self) -> dict[str, object]:
        return {
            "refused": dict(sorted(self.refused.items())),
            "expired_before_start": self.expired_before_start,
        }


def class_counts(counts: Mapping[str, int], type_names: Iterable[str]) -> dict[str, ClassCounts]:
    """Every type's counts (zero when none were seen), from the counts hash."""
    out = {name: ClassCounts() for name in type_names}
    for key, value in counts.items():
        parts = key.split(":")
        if len(parts) == 3 and parts[1] == SHED_FIELD:
            out.setdefault(parts[0], ClassCounts()).refused[parts[2]] = int(value)
        elif len(parts) == 2 and parts[1] == DEADLINE_PASSED_FIELD:
            out.setdefault(parts[0], ClassCounts()).expired_before_start = int(value)
    return out
