"""tidegate-client: submit, wait for and cancel tidegate tickets over HTTP, sync or async."""

from tidegate_client.client import AsyncTidegateClient, TidegateClient
from tidegate_client.errors import (
    ApiResponseError,
    ConnectionFailed,
    RejectedError,
    TidegateError,
    WaitTimeout,
)
from tidegate_client.models import (
    BatchItemResult,
    BatchResult,
    CancelResult,
    ErrorDetail,
    QueuesView,
    TicketAccepted,
    TicketStatus,
    TicketTimings,
    TicketView,
    TypeDepth,
    ValidationIssue,
)
from tidegate_client.retry import RETRY_STATUSES, RetryEvent, RetryPolicy, parse_retry_after

__all__ = [
    "RETRY_STATUSES",
    "ApiResponseError",
    "AsyncTidegateClient",
    "BatchItemResult",
    "BatchResult",
    "CancelResult",
    "ConnectionFailed",
    "ErrorDetail",
    "QueuesView",
    "RejectedError",
    "RetryEvent",
    "RetryPolicy",
    "TicketAccepted",
    "TicketStatus",
    "TicketTimings",
    "TicketView",
    "TidegateClient",
    "TidegateError",
    "TypeDepth",
    "ValidationIssue",
    "WaitTimeout",
    "parse_retry_after",
]
