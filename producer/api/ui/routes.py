"""`GET /ui` (the page), `/ui/static/*` (its script and stylesheet) and `GET /v1/status` (its data).

The page itself carries no queue data, so it is served without a key; the operator enters the key
once, the script keeps it in sessionStorage and sends it as a Bearer token to `/v1/status` and
`PUT /v1/mode`, which refuse branch keys. Everything is served from the package: no CDN, so the page
works on a control-room network with no internet.
"""

from __future__ import annotations

import html
from pathlib import Path
from string import Template
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from producer.api.auth import require_operator
from producer.api.context import Caller, Context
from producer.api.errors import UNAUTHORIZED, error_responses
from producer.status import operator_status

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
PAGE = Template((HERE / "page.html").read_text(encoding="utf-8"))
SECURITY_HEADERS = {
    # Only our own script and stylesheet run; data is inserted as text, never as markup.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter()
static_files = StaticFiles(directory=STATIC_DIR)


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def page(context: Context) -> HTMLResponse:
    """The page shell with this deployment's queue, types and thresholds; the script fills it in."""
    policy = context.policy
    alarms = policy.alarms
    body = PAGE.substitute(
        queue=html.escape(context.settings.queue_name),
        types=html.escape(",".join(policy.type_names)),
        thresholds=html.escape(f"{alarms.yellow},{alarms.orange},{alarms.red}"),
        critical=html.escape(" and ".join(n for n, tp in policy.types.items() if tp.critical)),
    )
    return HTMLResponse(body, headers=SECURITY_HEADERS)


@router.get(
    "/v1/status",
    responses=error_responses({401: UNAUTHORIZED, 403: "not an operator key"}),
    tags=["operator"],
)
async def status(context: Context, principal: Caller) -> dict[str, Any]:
    """What `tidegate status --json` prints: depth, alarm and transitions, workers, sheds, breakers."""
    require_operator(principal)
    return await run_in_threadpool(
        operator_status, context.redis, context.policy, context.settings.queue_name
    )
