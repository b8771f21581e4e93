"""The rq job that tells the operator a rollout rolled back by itself (the policy's notify hook)."""

from __future__ import annotations

from typing import Any

from ops.monitor.actions import queue_connection
from ops.monitor.hooks import HookFailed, run_hook
from shared.control import append_event
from shared.keys import QueueKeys
from shared.policy import HooksPolicy


def notify_rollback(queue_name: str, payload: dict[str, str | int | float], hooks: dict[str, Any]) -> str:
    """Call the notify hook with the rollback's figures and record the outcome; raising lets rq retry."""
    conn = queue_connection()
    policy = HooksPolicy.model_validate(hooks)
    keys = QueueKeys(queue_name)
    if not policy.notify_hook:
        detail = "no notify_hook configured"
    else:
        try:
            detail = run_hook(
                "notify_hook",
                policy.notify_hook,
                {"event": "rollout_rollback", **payload},
                policy.timeout_seconds,
            )
        except HookFailed as exc:
            append_event(conn, keys, "rollout", step="notify", state="failed", detail=str(exc))
            raise
    append_event(conn, keys, "rollout", step="notify", state="done", detail=detail)
    return detail
