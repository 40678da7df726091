"""Cloud Logging API v2 ``entries.list`` for Cloud Run revision logs, as a REST client calls it.

``POST /v2/entries:list`` with ``{resourceNames: ["projects/P"], filter, orderBy, pageSize, pageToken}``
answers ``{entries: [LogEntry...], nextPageToken}`` (both omitted when empty, as proto3 JSON does). The
entries are the container logs of the Cloud Run stand-in's revisions, Cloud Run's own lines about their instances
(varlog/system) and its front ends' 429s (entries.py). Rules kept from the real API: only ``timestamp asc`` (the
default) and ``timestamp desc`` orderings; ``pageSize`` defaults to 50 and above 1000 is refused; a page token belongs
to the query that produced it; a project other than the sandbox's is 403, as for a caller without
``logging.logEntries.list`` there.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError, invalid_argument
from sandbox.control.logging import filters
from sandbox.control.logging.entries import (
    ABORTED,
    RESOURCE_TYPE,
    LogStore,
    RevisionLog,
    all_lines,
    entry_json,
    field_value,
    resource_value,
)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
PROJECT_RESOURCE = re.compile(r"^projects/([^/]+)$")
ORDERS = {"": False, "timestamp": False, "timestamp asc": False, "timestamp desc": True}


class Logging:
    """Reads the Cloud Run stand-in's revision logs through the Logging API surface."""

    name = "logging"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        # The Cloud Run module keeps its state here too; its ``state_dir`` attribute wins when it is loaded.
        self.store = LogStore(ctx.state_dir / "run", ctx.config.region)

    def routes(self) -> list[BaseRoute]:
        return [Route("/v2/entries:list", self.list_entries, methods=["POST"])]

    def admin_routes(self) -> list[BaseRoute]:
        return []

    async def shutdown(self) -> None:
        return None

    def record_request(self, location: str, service_id: str, revision: str, http_request: dict) -> None:
        """A request the Cloud Run front end answered itself (a 429 over capacity), into the revision's request log."""
        self.store.record_request(service_id, revision, location, http_request, ABORTED)

    # entries.list -----------------------------------------------------------------------------------------
    async def list_entries(self, request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise invalid_argument("Invalid JSON payload received.") from None
        if not isinstance(body, dict):
            raise invalid_argument("Invalid JSON payload received: expected an object.")
        names = self._resource_names(body)
        order_key = " ".join(str(body.get("orderBy", "")).lower().split())
        if order_key not in ORDERS:
            raise invalid_argument(
                f"Invalid orderBy '{body.get('orderBy')}': only 'timestamp asc' and 'timestamp desc' are supported."
            )
        descending = ORDERS[order_key]
        size = _page_size(body.get("pageSize"))
        filter_text = str(body.get("filter", ""))
        clauses = filters.parse(filter_text)
        query = hashlib.sha256(json.dumps([names, filter_text, descending]).encode()).hexdigest()[:16]
        cursor = _decode_token(str(body.get("pageToken", "")), query)

        project = self.config.project
        # The resource's clauses hold for a whole log or for none of its lines: only the logs they select are scanned
        # line by line (a session's many revisions, read at every watch period, would otherwise all be).
        of_resource = [c for c in clauses if c.field.startswith("resource.")]
        logs = [
            log
            for log in self._refresh()
            if filters.matcher(of_resource, lambda name, log=log: resource_value(log, project, name))
        ]
        matched = [
            (log, line)
            for log, line in all_lines(logs)
            if filters.matcher(clauses, lambda name, log=log, line=line: field_value(log, line, project, name))
        ]
        matched.sort(key=lambda pair: (pair[1].ts_ns, pair[1].seq), reverse=descending)
        if cursor is not None:
            # Keyset paging: entries strictly after the last one returned, so lines appended between pages
            # never shift or repeat what the caller already has.
            matched = [pair for pair in matched if _beyond((pair[1].ts_ns, pair[1].seq), cursor, descending)]
        page = matched[:size]
        answer: dict = {}
        if page:
            answer["entries"] = [entry_json(log, line, project) for log, line in page]
        if len(matched) > size:
            last = page[-1][1]
            answer["nextPageToken"] = _encode_token(last.ts_ns, last.seq, query)
        return JSONResponse(answer)

    def _resource_names(self, body: dict) -> list[str]:
        names = list(body.get("resourceNames") or [])
        names += [f"projects/{p}" for p in body.get("projectIds") or []]  # the deprecated spelling
        if not names:
            raise invalid_argument("resourceNames: at least one resource name is required.")
        for name in names:
            match = PROJECT_RESOURCE.match(str(name))
            if match is None:
                raise invalid_argument(
                    f"Unsupported resource name '{name}': the sandbox serves project logs (projects/PROJECT_ID) only."
                )
            if match.group(1) not in (self.config.project, self.config.project_number):
                raise GoogleApiError(
                    403, f"Permission 'logging.logEntries.list' denied on resource '{name}' (or it may not exist)."
                )
        return sorted(set(names))

    def _refresh(self) -> list[RevisionLog]:
        """Bring the store up to date with the Cloud Run stand-in's log files and what it knows of them."""
        run = self.ctx.module("run")
        if run is None:
            return self.store.refresh({}, {})
        self.store.run_state_dir = run.state_dir
        locations: dict[tuple[str, str], str] = {}
        for record in run.services.values():
            location = record.service.name.split("/")[3]
            for revision_name in record.revisions:
                locations[(record.service_id, revision_name.rsplit("/", 1)[1])] = location
        writers = {instance.log_path: (instance.instance_id, instance.running) for instance in run.instances.values()}
        return self.store.refresh(locations, writers)

    def revision_text(self, revision: str) -> str | None:
        """Every entry of the Cloud Run revision ``revision`` (its short name), oldest first, one text a line: what
        the revision's Logs URL lists (its container's lines, Cloud Run's own, its request log's); None when it has
        logged nothing."""
        logs = [log for log in self._refresh() if log.resource_type == RESOURCE_TYPE and log.revision == revision]
        lines = sorted((line for log in logs for line in log.lines), key=lambda line: (line.ts_ns, line.seq))
        return "".join(f"{line.text}\n" for line in lines) if lines else None


def _beyond(key: tuple[int, int], cursor: tuple[int, int], descending: bool) -> bool:
    return key < cursor if descending else key > cursor


def _page_size(value: object) -> int:
    try:
        size = int(value or 0)  # int32 may arrive as a JSON number or string
    except (TypeError, ValueError):
        raise invalid_argument(f"Invalid pageSize '{value}'.") from None
    if size < 0 or size > MAX_PAGE_SIZE:
        raise invalid_argument(f"pageSize must be between 0 and {MAX_PAGE_SIZE}, got {size}.")
    return size or DEFAULT_PAGE_SIZE


def _encode_token(ts_ns: int, seq: int, query: str) -> str:
    raw = json.dumps({"t": ts_ns, "s": seq, "q": query}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str, query: str) -> tuple[int, int] | None:
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        cursor = (int(data["t"]), int(data["s"]))
        same_query = data["q"] == query
    except (ValueError, KeyError, TypeError):
        raise invalid_argument("Invalid page token.") from None
    if not same_query:
        raise invalid_argument(
            "The page token does not match the request: resourceNames, filter and orderBy must not change."
        )
    return cursor
