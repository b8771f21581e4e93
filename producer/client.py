"""The Python client now ships on its own as `tidegate-client` (clients/python/, package
`tidegate_client`), so a branch installs it with httpx alone; this module re-exports it so code
written against `producer.client` keeps working."""

from tidegate_client import (
    RETRY_STATUSES,
    ApiResponseError,
    AsyncTidegateClient,
    ConnectionFailed,
    RejectedError,
    RetryEvent,
    RetryPolicy,
    TidegateClient,
    TidegateError,
    WaitTimeout,
    parse_retry_after,
)

__all__ = [
    "RETRY_STATUSES",
    "ApiResponseError",
    "AsyncTidegateClient",
    "ConnectionFailed",
    "RejectedError",
    "RetryEvent",
    "RetryPolicy",
    "TidegateClient",
    "TidegateError",
    "WaitTimeout",
    "parse_retry_after",
]
