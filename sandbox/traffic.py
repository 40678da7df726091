"""A service's users, for tests and benches: a client that calls a Cloud Run service URL until stopped.

Short prompts, and one in three a long one (a candidate with the vLLM stand-in's ``fail_prompts_longer_than``
fault passes the probes' short chat but fails these). Each answer records when it was sent and received, its
status and the revision that answered (the front end's ``x-sandbox-revision`` header, also on the front end's own 429
for a revision with every slot busy). With ``stream``, chats stream as chat UIs do, and an answer also records whether
its stream carried an error event after the 200 (vLLM's ``data: {"error": ...}``).

By default one request follows another (closed loop: a slow service gets fewer requests). With ``rate_per_s`` the
users arrive at their own pace whatever the answers (open loop, each request on its own thread), as real users do: a
service too slow for that rate piles requests up until Cloud Run refuses them (sandbox/control/run/throttle.py).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

LONG_PROMPT = " ".join(["Summarise the quarterly report in detail please"] * 12)
OPEN_LOOP_THREADS = 64  # requests in flight at most in open loop: far above what a throttled revision holds
OPEN_LOOP_LIMITS = httpx.Limits(max_connections=OPEN_LOOP_THREADS, max_keepalive_connections=16)


@dataclass
class Answer:
    started: float  # time.monotonic()
    finished: float
    status: int  # 599: no answer at all
    revision: str
    long_prompt: bool
    stream_error: bool = False  # HTTP 200, then an error event inside the stream

    @property
    def failed(self) -> bool:
        """The user got no answer: a 5xx, Cloud Run's 429 (every instance busy), or a stream that failed."""
        return self.status >= 500 or self.status == 429 or self.stream_error


@dataclass
class Traffic:
    """Calls ``url`` with an identity token until ``stop`` is set (run it in a thread): non-streamed chats, or with
    ``stream`` streamed ones (a failure inside a stream reaches Cloud Run as a 2xx)."""

    url: str
    token: str
    model: str = "sandbox/tiny-chat"
    stream: bool = False
    max_tokens: int = 4
    rate_per_s: float | None = None
    """Requests started per (real) second whatever the answers; None: each after the last one's answer."""
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30, limits=OPEN_LOOP_LIMITS) as http:
            if self.rate_per_s is None:
                for n in itertools.count():
                    if self.stop.is_set():
                        return
                    self._call(http, n)
                return
            with ThreadPoolExecutor(OPEN_LOOP_THREADS) as pool:
                for n in itertools.count():
                    if self.stop.is_set():
                        return
                    pool.submit(self._call, http, n)
                    self.stop.wait(1 / self.rate_per_s)

    def _call(self, http: httpx.Client, n: int) -> None:
        """Request number ``n``, its answer appended to ``answers``."""
        long_prompt = n % 3 == 2
        body = {"model": self.model, "max_tokens": self.max_tokens, "stream": self.stream,
                "messages": [{"role": "user", "content": LONG_PROMPT if long_prompt else "hi"}]}  # fmt: skip
        started = time.monotonic()
        answer = Answer(started, started, 599, "", long_prompt)
        try:
            if self.stream:
                self._streamed(http, body, answer)
            else:
                response = http.post("/v1/chat/completions", json=body)
                answer.status, answer.revision = response.status_code, response.headers.get("x-sandbox-revision", "")
        except httpx.HTTPError:
            answer.stream_error = answer.status < 500  # no answer stays 599; a stream cut short failed
        answer.finished = time.monotonic()
        self.answers.append(answer)  # list.append is atomic: open-loop threads share the list

    @staticmethod
    def _streamed(http: httpx.Client, body: dict, answer: Answer) -> None:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            answer.status, answer.revision = response.status_code, response.headers.get("x-sandbox-revision", "")
            for data in _sse_data(response):
                if data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    answer.stream_error = True

    def errors(self) -> list[Answer]:
        return [a for a in self.answers if a.failed]


def _sse_data(response: httpx.Response) -> Iterator[str]:
    """The ``data:`` fields of a server-sent event stream. Lines end at LF or CRLF only (the SSE format), not at the
    other line breaks ``str.splitlines`` and httpx's ``iter_lines`` honour: a real model's text, which vLLM writes
    unescaped (``ensure_ascii=False``), may hold U+2028 or U+0085 inside a JSON string."""
    pending = b""
    for chunk in response.iter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.rstrip(b"\r").decode()
            if text.startswith("data: "):
                yield text.removeprefix("data: ")
