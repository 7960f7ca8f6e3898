"""OpenAI request bodies checked field by field into `Request`; every mistake is an
`ApiError` whose body is OpenAI's error JSON, naming the field.

Fields Linnet does not implement (`n > 1`, `logprobs`, penalties, tools, ...) are refused with
a 400 that names them, never ignored; a few are accepted at their neutral value only (`n: 1`,
`echo: false`, penalties of 0)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from linnet.serve.sampling import SamplingParams

MAX_STOPS = 4  # as OpenAI's API


class ApiError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param=None, kind=None, code=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or _KINDS.get(status, "invalid_request_error")
        self.code = code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


_KINDS = {404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}


@dataclass
class Request:
    chat: bool
    model: str
    prompt: str | list[int] | None = None  # completions
    messages: list[dict] | None = None  # chat: {"role", "content"} with text content
    max_tokens: int | None = None  # None: the default of the endpoint (see app)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False  # vLLM's extension: end-of-sequence tokens do not end the answer


_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "ignore_eos",
}
# Accepted at these values only: anything else is a feature Linnet does not have.
_NEUTRAL = {
    "n": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": (None, {}),
    "logprobs": (None, False),
}
_COMPLETIONS = {"prompt"}
_COMPLETIONS_NEUTRAL = {"echo": (False,), "best_of": (1,), "suffix": (None, "")}
_CHAT = {"messages", "max_completion_tokens"}
_CHAT_NEUTRAL = {
    "top_logprobs": (None,),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "response_format": (None, {"type": "text"}),
}


def parse_request(body, chat: bool) -> Request:
    """A request body (already decoded JSON) as a `Request`; ApiError(400) at the first
    mistake."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_fields(body, chat)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "`model` is required: a string", param="model")
    req = Request(chat=chat, model=model)
    if chat:
        req.messages = _messages(body.get("messages"))
        req.max_tokens = _max_tokens(body, "max_completion_tokens")
    else:
        req.prompt = _prompt(body.get("prompt"))
        req.max_tokens = _max_tokens(body, None)
    req.sampling = _sampling(body)
    req.stop = _stop(body.get("stop"))
    req.stream = _boolean(body, "stream")
    req.include_usage = _stream_options(body, req.stream)
    req.ignore_eos = _boolean(body, "ignore_eos")
    if "user" in body and not isinstance(body["user"], (str, type(None))):
        raise ApiError(400, "`user` must be a string", param="user")
    return req


def _check_fields(body: dict, chat: bool) -> None:
    known = _COMMON | (_CHAT if chat else _COMPLETIONS)
    neutral = {**_NEUTRAL, **(_CHAT_NEUTRAL if chat else _COMPLETIONS_NEUTRAL)}
    for name, value in body.items():
        if name in known:
            continue
        if name not in neutral:
            raise ApiError(400, f"unsupported field `{name}`", param=name)
        if not any(_same(value, ok) for ok in neutral[name]):
            raise ApiError(
                400,
                f"`{name}` = {value!r} is not supported (only {neutral[name][0]!r})",
                param=name,
            )


def _same(value, ok) -> bool:
    """Equal and of the same kind (JSON `true` is not `1`)."""
    return value == ok and isinstance(value, bool) == isinstance(ok, bool)


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"`{where}` must be an object with a `role`", param=where)
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise ApiError(400, f"`{where}`: unsupported field `{sorted(extra)[0]}`", param=where)
        if m["role"] not in ("system", "developer", "user", "assistant"):
            raise ApiError(400, f"`{where}.role` {m['role']!r} is not supported", param=where)
        out.append({"role": m["role"], "content": _content(m.get("content"), where)})
    return out


def _content(content, where: str) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"`{where}.content` must be text (a string or text parts)", param=where)


def _prompt(prompt) -> str | list[int]:
    """One prompt: a string or a list of token ids (a list holding one of them is the same)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "`prompt` is empty", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "one prompt per request (a list of prompts is n > 1)", param="prompt")
    raise ApiError(
        400, "`prompt` must be a non-empty string or a list of token ids", param="prompt"
    )


def _max_tokens(body: dict, alias: str | None) -> int | None:
    value = _integer(body, "max_tokens", 1)
    if alias is not None:
        other = _integer(body, alias, 1)
        if value is not None and other is not None and value != other:
            raise ApiError(400, f"`max_tokens` and `{alias}` disagree", param=alias)
        value = value if value is not None else other
    return value


def _sampling(body: dict) -> SamplingParams:
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p == 0:
        raise ApiError(400, "`top_p` must be greater than 0", param="top_p")
    top_k = _integer(body, "top_k", -1)
    seed = _integer(body, "seed", -(2**63), 2**64 - 1)
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=max(top_k or 0, 0),
        seed=seed,
    )


def _stop(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return []
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise ApiError(
            400,
            f"`stop` must be a non-empty string or a list of up to {MAX_STOPS} of them",
            param="stop",
        )
    return list(stops)


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise ApiError(400, "`stream_options` needs `stream: true`", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError(400, "`stream_options` takes `include_usage` only", param="stream_options")
    return _boolean(options, "include_usage")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _integer(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ApiError(400, f"`{name}` must be an integer {bound}", param=name)
    return value


def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not (_is_int(value) or isinstance(value, float)) or not (lo <= value <= hi):
        raise ApiError(400, f"`{name}` must be a number in [{lo:g}, {hi:g}]", param=name)
    if not math.isfinite(value):
        raise ApiError(400, f"`{name}` must be finite", param=name)
    return float(value)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"`{name}` must be true or false", param=name)
    return value
