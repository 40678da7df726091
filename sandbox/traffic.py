"""A service's users, for tests and benches: a client that calls a Cloud Run service URL until stopped.

Short prompts, and one in three a long one (a candidate with the vLLM stand-in's ``fail_prompts_longer_than``
fault passes the probes' short chat but fails these). Each answer records when it was sent and received, its
status and the revision that answered (the front end's ``x-sandbox-revision`` header).
"""

from __future__ import annotations

import itertools
import threading
import time
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


@dataclass
class Traffic:
    """Calls ``url`` with an identity token until ``stop`` is set (run it in a thread); non-streamed chats, since a
    failure inside a stream reaches Cloud Run as a 2xx."""

    url: str
    token: str
    model: str = "sandbox/tiny-chat"
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as http:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                long_prompt = n % 3 == 2
                body = {"model": self.model, "max_tokens": 4, "stream": False,
                        "messages": [{"role": "user", "content": LONG_PROMPT if long_prompt else "hi"}]}  # fmt: skip
                started = time.monotonic()
                try:
                    response = http.post("/v1/chat/completions", json=body)
                    status, revision = response.status_code, response.headers.get("x-sandbox-revision", "")
                except httpx.HTTPError:
                    status, revision = 599, ""
                self.answers.append(Answer(started, time.monotonic(), status, revision, long_prompt))

    def errors(self) -> list[Answer]:
        return [a for a in self.answers if a.status >= 500]
