"""A service's users, for tests and benches: a client that calls a Cloud Run service URL until stopped.

Short prompts, and one in three a long one (a candidate with the vLLM stand-in's ``fail_prompts_longer_than``
fault passes the probes' short chat but fails these). Each answer records when it was sent and received, its
status and the revision that answered (the front end's ``x-sandbox-revision`` header). With ``stream``, chats stream
as chat UIs do, and an answer also records whether its stream carried an error event after the 200 (vLLM's
``data: {"error": ...}``).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

LONG_PROMPT = " ".join(["Summarise the quarterly report in detail please"] * 12)


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
        return self.status >= 500 or self.stream_error


@dataclass
class Traffic:
    """Calls ``url`` with an identity token until ``stop`` is set (run it in a thread): non-streamed chats, or with
    ``stream`` streamed ones (a failure inside a stream reaches Cloud Run as a 2xx)."""

    url: str
    token: str
    model: str = "sandbox/tiny-chat"
    stream: bool = False
    max_tokens: int = 4
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as http:
            for n in itertools.count():
                if self.stop.is_set():
                    return
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
                        answer.status, answer.revision = (
                            response.status_code,
                            response.headers.get("x-sandbox-revision", ""),
                        )
                except httpx.HTTPError:
                    answer.stream_error = answer.status < 500  # no answer stays 599; a stream cut short failed
                answer.finished = time.monotonic()
                self.answers.append(answer)

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
