"""Fault injection and request recording for every sandbox HTTP server.

Tests add rules through the admin API (``POST /_sandbox/faults``); a rule matches requests by server,
method and path regex and then answers with an error status, drops the connection after some body bytes,
delays, throttles or corrupts the body. Rules fire a number of times or on a fraction of matching requests
(seeded, so a run is repeatable). Product code never sees any of this: it only sees HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

FaultAction = Literal["status", "replace", "drop", "delay", "slow", "corrupt"]

# A Cloud Run service's front end, or one of its tag URLs (sandbox/control/run): they come and go with services, and
# a test may aim a rule at one before the promotion creates it, so these names are known by their shape.
FRONT_END = re.compile(r"run:[a-z](?:[a-z0-9-]*[a-z0-9])?(?::[a-z](?:[a-z0-9-]*[a-z0-9])?)?")
FRONT_END_SHAPE = "run:<service>[:<tag>]"


def front_end_server(service_id: str, tag: str | None = None) -> str:
    """The fault-rule ``server`` of a Cloud Run front end: one spelling for the server and for rules aimed at it."""
    return f"run:{service_id}" + (f":{tag}" if tag else "")


def unknown_server_message(server: str, known: Iterable[str]) -> str | None:
    """Why ``server`` names no server of this sandbox, or None when it does: a rule for a misspelt server would sit
    in the registry and never fire, and a test relying on it would pass without its fault."""
    known = sorted(known)
    if server in known or FRONT_END.fullmatch(server):
        return None
    return f"unknown server {server!r}: this sandbox's servers are {', '.join(known)} and {FRONT_END_SHAPE}"


class FaultRule(BaseModel):
    """One injected fault. ``server`` names the sandbox piece: hub, cdn, gcs, metadata, control, or a Cloud Run
    front end (``run:<service>[:<tag>]``).

    ``status`` answers instead of the app; ``replace`` lets the app do the work and then answers with the
    status instead (a create that "another caller" won: the resource exists, the caller sees 409).

    An unknown key is refused rather than ignored: ``{"delay": 5}`` for ``delay_s`` would otherwise be a delay of
    0 s, and the test would pass without the fault it meant. Validated with the context ``{"servers": names}``
    (what the admin API passes), an unknown server is refused too.
    """

    model_config = ConfigDict(extra="forbid")

    server: str
    path: str = Field(".*", description="regex searched in the request path (query excluded)")
    method: str | None = None
    action: FaultAction = "status"
    status: int = Field(503, ge=100, le=599)
    retry_after: str | None = Field(None, description="Retry-After header value for status faults")
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    times: int | None = Field(None, ge=1, description="fire this many times, then stop")
    fraction: float | None = Field(None, gt=0, le=1, description="fire on this share of matching requests")
    seed: int = 0
    after_bytes: int = Field(0, ge=0, description="drop: bytes of body sent before the connection is cut")
    delay_s: float = Field(0.0, ge=0, description="delay: seconds before answering; slow: per 64 KiB chunk")
    id: int = 0
    fired: int = 0

    @field_validator("server")
    @classmethod
    def _known_server(cls, server: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("servers")
        if known is not None and (problem := unknown_server_message(server, known)):
            raise ValueError(problem)
        return server

    @model_validator(mode="after")
    def _compile(self) -> FaultRule:
        re.compile(self.path)
        return self


class RecordedRequest(BaseModel):
    seq: int
    server: str
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: str | None = None
    status: int | None = None
    fault: int | None = None
    time: float


class FaultRegistry:
    """Rules and the request log, shared by every server of one sandbox process."""

    def __init__(self, log_limit: int = 50_000) -> None:
        self._lock = threading.Lock()
        self.servers: set[str] = set()  # the servers that apply rules, as FaultMiddleware names them
        self._rules: list[FaultRule] = []
        self._rngs: dict[int, random.Random] = {}
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self.log: deque[RecordedRequest] = deque(maxlen=log_limit)

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            rule.id = next(self._ids)
            rule.fired = 0  # counted here only: a client cannot post a rule that has "already fired"
            self._rules.append(rule)
            self._rngs[rule.id] = random.Random(rule.seed)
            return rule

    def clear(self, server: str | None = None) -> list[FaultRule]:
        """Remove the rules of ``server`` (all without one); returns them with what they fired, read in the same
        step, so a client's check that its rules fired cannot miss a request that came in between."""
        with self._lock:
            removed = [r for r in self._rules if server is None or r.server == server]
            self._rules = [r for r in self._rules if server is not None and r.server != server]
            return removed

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return [r.model_copy() for r in self._rules]

    def match(self, server: str, method: str, path: str) -> FaultRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.server != server or (rule.method and rule.method.upper() != method):
                    continue
                if not re.search(rule.path, path):
                    continue
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if rule.fraction is not None and self._rngs[rule.id].random() >= rule.fraction:
                    continue
                rule.fired += 1
                return rule.model_copy()
        return None

    def record(self, entry: dict) -> RecordedRequest:
        item = RecordedRequest(seq=next(self._seq), time=time.time(), **entry)
        self.log.append(item)
        return item

    def requests(self, server: str | None = None, since: int = 0) -> list[RecordedRequest]:
        return [r for r in list(self.log) if r.seq > since and (server is None or r.server == server)]


def _default_error_body(server: str, status: int) -> bytes:
    if server in ("hub", "cdn"):
        return json.dumps({"error": f"sandbox fault: HTTP {status}"}).encode()
    from sandbox.control.errors import google_error_body

    return google_error_body(status, f"sandbox fault: HTTP {status}")


class DropConnection(Exception):
    """Raised inside the ASGI send path to make uvicorn cut the connection mid-body."""


class FaultMiddleware:
    """ASGI middleware: records each request and applies the first matching fault rule."""

    def __init__(self, app, server: str, registry: FaultRegistry, record_bodies: bool = False) -> None:
        self.app = app
        self.server = server
        self.registry = registry
        self.record_bodies = record_bodies
        if not FRONT_END.fullmatch(server):
            registry.servers.add(server)  # what a rule may name (front ends are known by their shape)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_sandbox"):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body_parts: list[bytes] = []
        if self.record_bodies:
            receive = _teeing_receive(receive, body_parts)
        entry = {
            "server": self.server,
            "method": method,
            "path": path,
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": headers,
        }
        rule = self.registry.match(self.server, method, path)
        status_seen: list[int] = []

        async def recording_send(message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        try:
            if rule is None:
                await self.app(scope, receive, recording_send)
            else:
                await self._apply(rule, scope, receive, recording_send)
        finally:
            if self.record_bodies:
                body = b"".join(body_parts)[:65536].decode("utf-8", "replace") or None
                # The log is readable through the admin API: never keep a secret's payload in it.
                entry["body"] = "<secret payload not recorded>" if body and path.endswith(":addVersion") else body
            self.registry.record(
                {**entry, "status": status_seen[0] if status_seen else None, "fault": rule.id if rule else None}
            )

    async def _apply(self, rule: FaultRule, scope, receive, send) -> None:
        if rule.action == "status":
            body = rule.body.encode() if rule.body is not None else _default_error_body(self.server, rule.status)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            if rule.retry_after is not None:
                headers.append((b"retry-after", rule.retry_after.encode()))
            headers += [(k.lower().encode(), v.encode()) for k, v in rule.headers.items()]
            await send({"type": "http.response.start", "status": rule.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if rule.action == "replace":

            async def swallow(_message) -> None:
                return None

            await self.app(scope, receive, swallow)
            await self._apply(rule.model_copy(update={"action": "status"}), scope, receive, send)
            return
        if rule.action == "delay":
            await asyncio.sleep(rule.delay_s)
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _body_fault_send(rule, send))


def _teeing_receive(receive, parts: list[bytes]):
    async def wrapped():
        message = await receive()
        if message["type"] == "http.request":
            parts.append(message.get("body", b""))
        return message

    return wrapped


def _body_fault_send(rule: FaultRule, send):
    sent = 0
    flipped = False

    async def wrapped(message) -> None:
        nonlocal sent, flipped
        if message["type"] != "http.response.body":
            await send(message)
            return
        body: bytes = message.get("body", b"")
        if rule.action == "drop":
            room = rule.after_bytes - sent
            if len(body) >= room:
                if room > 0:
                    await send({"type": "http.response.body", "body": body[:room], "more_body": True})
                raise DropConnection(f"sandbox fault {rule.id}: connection dropped after {rule.after_bytes} bytes")
        elif rule.action == "corrupt" and body and not flipped:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
            flipped = True
        elif rule.action == "slow":
            for start in range(0, max(len(body), 1), 65536):
                await asyncio.sleep(rule.delay_s)
                chunk = body[start : start + 65536]
                more = start + 65536 < len(body) or message.get("more_body", False)
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
            sent += len(body)
            return
        sent += len(body)
        await send({**message, "body": body})

    return wrapped
