"""ASGI middleware that holds every control-plane call to Google's published schemas, in both directions.

Requests the real API would refuse for their shape are refused the same way (the product's or the client's
fault). Responses the sandbox sends are checked against the method's response schema and every violation is
recorded (the sandbox's fault): ``GET /_sandbox/conformance`` lists them and the test session fails on any.

Which API a path belongs to: all sandbox APIs share one control port, and several have ``/v1/projects/...``
paths (IAM, Secret Manager, Artifact Registry, Cloud Build). The real APIs are separate hosts, so the front end
matches a path only against its own API's methods. We keep one port (tests, fault rules and Compute's
``selfLink`` URLs all name it) and get the same routing by asking which sandbox module owns the Starlette route
the request will reach: that module implements exactly one API (``discovery_apis`` on the module, or the
served API named like the module), and the discovery match is restricted to it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any

from starlette.routing import BaseRoute, Match, Mount, Route

from sandbox import discovery
from sandbox.asgi import buffer_body, send_response
from sandbox.conformance.errors import bad_request_body, not_found_page
from sandbox.conformance.request import body_problems, query_problems
from sandbox.conformance.schema import walker
from sandbox.control.errors import google_error_body

ADMIN_PREFIX = "/_sandbox"
_EXEMPT_PREFIXES: set[str] = set()

# Modules whose routes serve more than the API they are named after.
_MODULE_APIS: dict[str, tuple[str, ...]] = {
    # The shared long-running operation store answers ``/v1/projects/*/locations/*/operations`` for the APIs
    # whose operations it holds.
    "operations": ("artifactregistry.v1", "cloudbuild.v1"),
    "resourcemanager": ("cloudresourcemanager.v3",),
}


def exempt_prefix(prefix: str) -> None:
    """Register a path prefix the sandbox serves that is not a Google REST API (a metadata server's
    ``/computeMetadata/``, an OAuth ``/token`` endpoint): requests under it that match no served API's method
    pass through unchecked instead of being answered 404."""
    _EXEMPT_PREFIXES.add(prefix)


def is_exempt(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or any(path.startswith(p) for p in _EXEMPT_PREFIXES)


def module_apis(module: Any) -> tuple[str, ...] | None:
    """The discovery APIs a sandbox API module implements."""
    declared = getattr(module, "discovery_apis", None)
    if declared:
        return tuple(declared)
    name = getattr(module, "name", None)
    if not isinstance(name, str):
        return None
    if name in _MODULE_APIS:
        return _MODULE_APIS[name]
    found = tuple(api for api in discovery.SERVED_APIS if api.split(".")[0] == name)
    return found or None


class ConformanceLog:
    """Response-side violations the sandbox committed, shared by the middlewares of one sandbox."""

    def __init__(self, limit: int = 1000) -> None:
        self._lock = threading.Lock()
        self._items: deque[dict[str, Any]] = deque(maxlen=limit)

    def record(self, item: dict[str, Any]) -> None:
        with self._lock:
            self._items.append({**item, "time": time.time()})

    def violations(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class ConformanceMiddleware:
    """Wraps a Starlette app of Google API routes (the control plane)."""

    def __init__(
        self, app: Any, log: ConformanceLog, apis: tuple[str, ...] | None = None, check_requests: bool = True
    ) -> None:
        """``apis`` fixes the APIs the app serves (one host, one API: the GCS front); ``check_requests=False``
        refuses nothing (the GCS front: no public source shows Cloud Storage refusing an unknown field, so the
        sandbox does not either) but still records every JSON request that breaks the schema as a violation, so
        the test session proves our clients send only what storage.v1 publishes."""
        self.app = app
        self.log = log
        self.apis = apis
        self.check_requests = check_requests
        # The Starlette app under any other middleware (permission checks sit between us and it).
        inner = app
        while not hasattr(inner, "routes") and hasattr(inner, "app"):
            inner = inner.app
        self.routes: list[BaseRoute] = getattr(inner, "routes", [])

    def _route_apis(self, scope: dict) -> tuple[bool, tuple[str, ...] | None]:
        """(a route will take it, the APIs its module implements; None when not known)."""
        partial: BaseRoute | None = None
        chosen: BaseRoute | None = None
        for route in self.routes:
            if isinstance(route, Mount) and route.path == ADMIN_PREFIX:
                continue
            found, _ = route.matches(scope)
            if found == Match.FULL:
                chosen = route
                break
            if found == Match.PARTIAL and partial is None:
                partial = route  # path matches, verb does not: Starlette's choice when nothing matches fully
        chosen = chosen or partial
        if chosen is None:
            return False, None
        if isinstance(chosen, Route):
            return True, module_apis(getattr(chosen.endpoint, "__self__", None))
        return True, None

    async def __call__(self, scope, receive, send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(ADMIN_PREFIX):
            await self.app(scope, receive, send)
            return
        raw_path = scope.get("raw_path") or path.encode()
        raw = raw_path.decode("latin-1").partition("?")[0]
        if not self.check_requests:
            matched = discovery.match(scope["method"], raw, self.apis)
            if matched is None or b"alt=media" in scope.get("query_string", b""):
                await self.app(scope, receive, send)  # a media download answers bytes, not a resource
                return
            body, receive = await buffer_body(receive)
            self._record_request(scope, matched, body)
            await self.app(scope, receive, self._checking_send(send, scope, matched))
            return
        routed, apis = (True, self.apis) if self.apis else self._route_apis(scope)
        matched = discovery.match(scope["method"], raw, apis) if routed else None
        if matched is None:
            if is_exempt(path):
                await self.app(scope, receive, send)
                return
            published = None if routed else discovery.match(scope["method"], raw)
            if published is not None:
                # Google serves this method; the sandbox does not implement it. Say so instead of pretending the
                # URL does not exist (501 UNIMPLEMENTED is the status Google uses for a method it does not serve).
                message = f"The sandbox does not implement {published.id} ({scope['method']} {path})."
                await send_response(send, 501, google_error_body(501, message), b"application/json")
                return
            await send_response(send, 404, not_found_page(path), b"text/html; charset=UTF-8")
            return
        method = matched.method
        body, replay = await buffer_body(receive)
        query = query_problems(method, scope.get("query_string", b"").decode("latin-1"))
        problems, parse_error = body_problems(method, body)
        if query or problems or parse_error:
            messages = [*query, *([parse_error] if parse_error else [])]
            await send_response(send, 400, bad_request_body(method.api, problems, messages), b"application/json")
            return
        await self.app(scope, replay, self._checking_send(send, scope, matched))

    def _record_request(self, scope: dict, matched: discovery.MethodMatch, body: bytes) -> None:
        """Record, without refusing, what a request sends beyond the method's published parameters and schema."""
        query = scope.get("query_string", b"").decode("latin-1")
        if "upload_id=" in query:
            return  # a resumable session's chunk: its URL is the session URI the front handed out, not an API call
        headers = dict(scope.get("headers", []))
        is_json = headers.get(b"content-type", b"").startswith(b"application/json")
        problems, parse_error = body_problems(matched.method, body) if is_json else ([], None)
        messages = [*query_problems(matched.method, query), *(p.message for p in problems)]
        if parse_error:
            messages.append(parse_error)
        if messages:
            where = {"method": matched.method.id, "http": f"{scope['method']} {scope['path']} (request)"}
            self.log.record({**where, "problems": messages})

    def _checking_send(self, send, scope: dict, matched: discovery.MethodMatch):
        status = 0
        is_json = False
        parts: list[bytes] = []

        async def wrapped(message) -> None:
            nonlocal status, is_json
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = dict(message.get("headers", []))
                is_json = headers.get(b"content-type", b"").startswith(b"application/json")
            elif message["type"] == "http.response.body" and 200 <= status < 300 and is_json:
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self._check_response(scope, matched, b"".join(parts))
            await send(message)

        return wrapped

    def _check_response(self, scope: dict, matched: discovery.MethodMatch, body: bytes) -> None:
        method = matched.method
        schema = method.response_schema
        if not schema:
            return
        where = {"method": method.id, "http": f"{scope['method']} {scope['path']}"}
        try:
            value = json.loads(body) if body.strip() else {}
        except ValueError:
            self.log.record({**where, "problems": ["response body is not JSON"]})
            return
        problems = walker(method.api, "response").check(schema, value)
        if problems:
            self.log.record({**where, "problems": [p.message for p in problems]})
