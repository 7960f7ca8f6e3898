"""The HTTP side: Starlette routes over the server's state (docs/serve.md).

POST /v1/completions, POST /v1/chat/completions (whole, or `stream: true` as server-sent
events ending with `data: [DONE]`), GET /v1/models, GET /health, GET /metrics. Every error is
OpenAI's JSON: 400 malformed or invalid, 404 unknown model or route, 429 queue full, 503
loading or shutting down, 500 when decoding fails.
"""

from __future__ import annotations

import asyncio
import json

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from linnet.serve.protocol import ApiError, parse_request
from linnet.serve.responses import Shape, sse, usage
from linnet.serve.sampling import Sampler
from linnet.serve.scheduler import Job, Update
from linnet.serve.state import ServerState
from linnet.serve.textout import TextOut

MAX_BODY = 32 * 2**20  # bytes of one request body
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI's API


def build_app(state: ServerState) -> Starlette:
    async def completions(request: Request) -> Response:
        return await _generate(state, request, chat=False)

    async def chat(request: Request) -> Response:
        return await _generate(state, request, chat=True)

    async def models(request: Request) -> Response:
        try:
            state.ready()
        except ApiError as err:
            return _error(err)
        card = {"id": state.name, "object": "model", "created": state.created, "owned_by": "linnet"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": state.phase}, 200 if state.phase == "ready" else 503)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(state.metrics.text(), media_type="text/plain; version=0.0.4")

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(
            ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        )

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), err.status)


async def _generate(state: ServerState, request: Request, chat: bool) -> Response:
    route = request.url.path
    try:
        engine, scheduler = state.ready()
        req = parse_request(await _json(request), chat)
        if req.model != engine.name:
            raise ApiError(
                404,
                f"the model `{req.model}` does not exist; this server serves `{engine.name}`",
                param="model",
                code="model_not_found",
            )
        ids = await run_in_threadpool(
            engine.encode_chat if chat else engine.encode_prompt, req.messages or req.prompt
        )
        max_tokens = _budget(req, len(ids), engine.rows.positions)
        job, updates = _job(engine, req, ids, max_tokens)
        scheduler.submit(job)
    except ApiError as err:
        state.metrics.request(route, err.status)
        return _error(err)
    state.metrics.request(route, 200)
    shape = Shape(chat, engine.name)
    if req.stream:
        events = _stream(shape, job, updates, len(ids), req.include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    return await _collect(request, shape, job, updates)


async def _json(request: Request):
    body = await request.body()
    if len(body) > MAX_BODY:
        raise ApiError(400, f"the request body is over {MAX_BODY} bytes")
    try:
        return json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}") from err


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _budget(req, prompt_tokens: int, positions: int) -> int:
    """max_tokens for this request: the one asked for (it must fit the row with the prompt),
    else the endpoint's default cut to the room left."""
    param = "messages" if req.chat else "prompt"
    if prompt_tokens == 0:
        raise ApiError(400, "the prompt has no tokens", param=param)
    room = positions - prompt_tokens
    if room < 1:
        raise ApiError(
            400,
            f"the prompt is {prompt_tokens} tokens; a row holds {positions} (prompt and "
            "answer), so the prompt must be shorter",
            param=param,
            code="context_length_exceeded",
        )
    if req.max_tokens is None:
        return room if req.chat else min(DEFAULT_COMPLETION_TOKENS, room)
    if req.max_tokens > room:
        raise ApiError(
            400,
            f"{prompt_tokens} prompt tokens and max_tokens {req.max_tokens} pass the "
            f"{positions} tokens a row holds",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return req.max_tokens


def _job(engine, req, ids: list[int], max_tokens: int) -> tuple[Job, asyncio.Queue]:
    """The scheduler's job for a request, and the queue its updates arrive on (the
    scheduler thread hands them to this event loop)."""
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue[Update] = asyncio.Queue()

    def notify(update: Update) -> None:
        try:
            loop.call_soon_threadsafe(updates.put_nowait, update)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    job = Job(
        prompt=ids,
        max_tokens=max_tokens,
        sampler=Sampler(req.sampling),
        text=TextOut(engine.decode, req.stop),
        eos=frozenset() if req.ignore_eos else engine.eos,
        notify=notify,
    )
    return job, updates


async def _collect(request: Request, shape: Shape, job: Job, updates: asyncio.Queue):
    """The whole answer; a client that goes away cancels its job."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job, updates))
    try:
        while True:
            update = await updates.get()
            if update.error:
                return _error(ApiError(500, update.error, kind="server_error"))
            if update.finish_reason:
                break
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once the job is done
    body = shape.whole(
        job.text.text, update.finish_reason, usage(len(job.prompt), update.completion_tokens)
    )
    return JSONResponse(body)


async def _cancel_on_disconnect(request: Request, job: Job, updates: asyncio.Queue) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()
    updates.put_nowait(Update(error="the client disconnected"))  # ends the wait in _collect


async def _stream(
    shape: Shape, job: Job, updates: asyncio.Queue, prompt_tokens: int, include_usage: bool
):
    """Server-sent events: OpenAI's chunks, then `[DONE]`. Starlette cancels this generator
    when the client disconnects; `finally` then cancels the job, which frees its row."""
    try:
        if shape.chat:
            yield sse(shape.chunk(None, role=True))
        while True:
            update = await updates.get()
            if update.error:
                yield sse(ApiError(500, update.error, kind="server_error").body())
                break
            if update.text or update.finish_reason:
                yield sse(shape.chunk(update.text, update.finish_reason))
            if update.finish_reason:
                if include_usage:
                    yield sse(shape.usage_chunk(usage(prompt_tokens, update.completion_tokens)))
                break
        yield sse("[DONE]")
    finally:
        job.cancel()
