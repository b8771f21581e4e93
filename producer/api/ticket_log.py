"""The API's line about each submitted ticket, with its id, branch and type for following it through
the logs; shared by POST /v1/tickets (single and batch) and the OpenAI-compatible front door."""

from __future__ import annotations

import logging

from producer.producer import SubmitResult
from shared.logs import line_fields
from shared.models import TicketRequest

log = logging.getLogger("tidegate.api")


def log_submitted(result: SubmitResult, request: TicketRequest) -> None:
    fields = line_fields(result.ticket_id, request.branch_id, request.type)
    if result.outcome == "rejected":
        code = result.code.value if result.code is not None else "unknown"
        log.info("ticket %s: shed (%s)", result.ticket_id, code, extra=fields)
    else:
        log.info("ticket %s: %s", result.ticket_id, result.outcome, extra=fields)
