"""The simulator's HTTP surface: vLLM's OpenAI-compatible routes plus two simulator-only `/sim` routes.

A request that loses its client is aborted at once, streaming or not, so its KV blocks go back to the
pool the way vLLM frees them; the request id the client sent is the one logged and aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import Receive

from ops.lab.sim import protocol
from ops.lab.sim.config import SimConfig
from ops.lab.sim.engine import Engine, EngineUnavailable, RequestHandle
from ops.lab.sim.errors import ApiError, error_body, invalid, schema_error
from ops.lab.sim.faults import FaultError, FaultInjector
from ops.lab.sim.metrics import build_registry
from ops.lab.sim.pool import EnginePool
from ops.lab.sim.scheduler import SeqState

log = logging.getLogger("tidegate.sim")

# The vLLM release whose HTTP surface the simulator reproduces (ops/lab/vllm_cpu/OBSERVED.md).
VLLM_VERSION = "0.32.0"

Parser = Callable[[object, SimConfig, str | None], protocol.Job]


def create_app(config: SimConfig) -> FastAPI:
    """Build the app; its engines start with the server's event loop and stop with it."""
    pool = EnginePool(config)
    registry = build_registry(config, pool.engines)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        pool.start()
        log.info(
            "Serving %s on %d simulated %s GPU(s): %d KV blocks each, time scale %g",
            config.model,
            config.gpus,
            config.profile.gpu_name,
            config.kv_blocks,
            config.time_scale,
        )
        yield
        await pool.stop()

    app = FastAPI(title="tidegate vLLM simulator", lifespan=lifespan)
    app.state.pool = pool
    injector = FaultInjector(config.faults, seed=config.seed)
    app.state.faults = injector

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return error.response()

    app.include_router(_vllm_routes(config, pool, injector, registry))
    app.include_router(_sim_routes(pool, injector))
    return app


def _vllm_routes(
    config: SimConfig, pool: EnginePool, injector: FaultInjector, registry: CollectorRegistry
) -> APIRouter:
    """What vLLM's OpenAI-compatible server answers."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        down = pool.down()
        if down:
            gpu, wait = max(down, key=lambda item: item[1])
            raise ApiError(
                HTTPStatus.SERVICE_UNAVAILABLE, str(EngineUnavailable(gpu, wait)), retry_after_s=wait
            )
        return Response(status_code=HTTPStatus.OK)

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VLLM_VERSION}

    @router.get("/load")
    async def load() -> dict[str, int]:
        return {"server_load": sum(engine.load()[0] for engine in pool.engines)}

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return protocol.models_response(config, int(time.time()))

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(pool, request, protocol.parse_completion, injector)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(pool, request, protocol.parse_chat, injector)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router


def _sim_routes(pool: EnginePool, injector: FaultInjector) -> APIRouter:
    """The simulator's own controls: faults and GPU memory pressure, for tests and drills."""
    router = APIRouter(prefix="/sim")

    @router.get("/faults")
    async def sim_faults() -> dict[str, float | int]:
        return injector.faults.as_dict()

    @router.post("/faults")
    async def sim_set_faults(request: Request) -> dict[str, float | int]:
        payload = await _json(request)
        if not isinstance(payload, dict):
            raise invalid("the body must be a JSON object of fault fields.", "body", payload)
        try:
            faults = injector.faults.updated(payload)
        except FaultError as error:
            raise invalid(str(error), error.field) from None
        injector.set(faults)
        log.info("faults now %s", faults.as_dict())
        return faults.as_dict()

    @router.get("/gpus")
    async def sim_gpus() -> list[dict[str, object]]:
        return pool.describe_gpus()

    @router.post("/gpus/{index}/pressure")
    async def sim_pressure(index: int, request: Request) -> dict[str, object]:
        if not 0 <= index < len(pool.gpus):
            raise ApiError(
                HTTPStatus.NOT_FOUND, f"GPU {index} does not exist; GPUs run from 0 to {len(pool.gpus) - 1}"
            )
        payload = await _json(request)
        extra = payload.get("extra_used_bytes") if isinstance(payload, dict) else None
        if not isinstance(extra, int) or isinstance(extra, bool):
            raise invalid("extra_used_bytes must be an integer number of bytes.", "extra_used_bytes", extra)
        try:
            pool.gpus[index].set_pressure(extra)
        except ValueError as error:
            raise invalid(str(error), "extra_used_bytes", extra) from None
        log.info("GPU %d: another process now holds %d bytes", index, extra)
        return pool.describe_gpus()[index]

    return router


async def _json(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except json.JSONDecodeError as error:
        detail = {"type": "json_invalid", "loc": (0,), "msg": "JSON decode error", "input": {}}
        raise schema_error([detail | {"ctx": {"error": error.msg}}]) from None


async def _serve(pool: EnginePool, request: Request, parse: Parser, injector: FaultInjector) -> Response:
    job = parse(await _json(request), pool.config, request.headers.get("x-request-id"))
    failed_with = await injector.before_request()
    if failed_with is not None:
        raise ApiError(failed_with, f"injected fault: answering {failed_with} (POST /sim/faults changes it)")
    try:
        engine = pool.pick()
    except EngineUnavailable as down:
        raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, str(down), retry_after_s=down.retry_after_s) from None
    if job.stream:
        return StreamingResponse(_stream(engine, job), media_type="text/event-stream")
    handle = _submit(engine, job)
    if not await _finished_or_disconnected(handle, request.receive):
        engine.abort(handle, "client disconnected")
        return Response(status_code=499)
    if handle.error is not None:
        return JSONResponse(error_body(HTTPStatus.INTERNAL_SERVER_ERROR, handle.error), 500)
    seq = handle.seq
    body = protocol.full_response(job, int(time.time()), seq.output_tokens, seq.finish_reason or "stop")
    # vLLM puts the request id in the body's `id` only; it does not echo an X-Request-Id header.
    return JSONResponse(body)


def _submit(engine: Engine, job: protocol.Job) -> RequestHandle:
    try:
        handle = engine.submit(
            job.response_id,
            job.prompt_tokens,
            job.max_tokens,
            job.target_tokens,
            job.priority,
            streaming=job.stream,
        )
    except EngineUnavailable as down:
        raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, str(down), retry_after_s=down.retry_after_s) from None
    log.info(
        "Received request %s on GPU %d: prompt_tokens=%d max_tokens=%d priority=%d",
        job.response_id,
        engine.gpu,
        job.prompt_tokens,
        job.max_tokens,
        job.priority,
    )
    return handle


async def _finished_or_disconnected(handle: RequestHandle, receive: Receive) -> bool:
    """Wait for the request to end; False when the client went away first (vLLM's with_cancellation)."""
    done = asyncio.ensure_future(handle.done.wait())
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        return done.done()
    finally:
        for task in (done, gone):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stream(engine: Engine, job: protocol.Job) -> AsyncIterator[str]:
    """Server-sent events as vLLM sends them; a cancelled stream (client gone) aborts the request."""
    created = int(time.time())
    try:
        handle = _submit(engine, job)
    except ApiError as error:
        yield protocol.sse(error.body())
        yield "data: [DONE]\n\n"
        return
    try:
        if job.kind == "chat":
            yield protocol.sse(protocol.role_chunk(job, created))
        sent = 0
        while True:
            await handle.changed.wait()
            handle.changed.clear()
            seq = handle.seq
            if handle.error is not None:
                yield protocol.sse(error_body(HTTPStatus.INTERNAL_SERVER_ERROR, handle.error))
                break
            finished = seq.state is SeqState.FINISHED
            if seq.output_tokens > sent:
                reason = seq.finish_reason if finished else None
                yield protocol.token_events(job, created, sent, seq.output_tokens, reason)
                sent = seq.output_tokens
            if finished:
                if job.include_usage:
                    yield protocol.sse(protocol.usage_chunk(job, created, sent))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not handle.done.is_set():
            engine.abort(handle, "client disconnected")
