"""The 429 answer for a shed ticket: the words for its shed code, the code itself, Retry-After.

Nothing here decides or re-derives why a ticket was shed: the code comes with the submission result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from producer.api.schemas import ErrorObject
from producer.producer import SubmitResult
from shared.policy import Policy
from shared.shed import ShedCode, shed_message

SHED_HEADER = "X-Tidegate-Shed"
"""The shed code of a refused request, for callers (and proxies) that read headers, not bodies."""


@dataclass(frozen=True)
class Shed:
    retry_after: int
    error: ErrorObject

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after), SHED_HEADER: self.error.code or "shed"}


def retry_after_header(seconds: float | None) -> int:
    """Whole seconds, rounded up, at least one (RFC 9110 delay-seconds)."""
    return max(1, math.ceil(seconds or 1.0))


def shed_answer(result: SubmitResult, ticket_type: str, policy: Policy) -> Shed:
    """The 429 for a rejected submission, looked up from the code admission or the cap returned."""
    retry_after = retry_after_header(result.retry_after)
    code = result.shed_code or ShedCode.TYPE_CAP  # a rejection always has one
    message = shed_message(
        code,
        ticket_type,
        retry_after,
        critical_types=policy.critical_types,
        cap=policy.type_policy(ticket_type).cap,
    )
    return Shed(
        retry_after,
        ErrorObject(message=message, type=code.error_type, param=None, code=code, ticket_id=result.ticket_id),
    )
