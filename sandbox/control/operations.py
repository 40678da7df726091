"""The shared long-running operation store for v1 APIs whose operations live under a location.

Artifact Registry (and Cloud Build's regional builds) name operations
``projects/{p}/locations/{l}/operations/{id}`` and poll them with ``GET /v1/{name}``. API modules create an
operation, return its JSON, and finish or fail it later; this module serves the operation methods those APIs
publish over REST, get and cancel (their discovery documents have no wait, list or delete), for all of them.

The JSON must parse with google-api-core's strict rules (FACTS.md): the operations client parses with
``ignore_unknown_fields=False``, ``response``/``metadata`` carry ``@type`` and only fields of that type, and
an operation that is ``done`` must carry ``response`` or ``error``. Building every operation as an
``operations_pb2.Operation`` and rendering it with ``json_format`` guarantees all three.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import proto
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, empty_pb2, json_format
from google.protobuf.message import Message
from google.rpc import status_pb2
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.control import ControlContext
from sandbox.control.errors import GRPC_CODES, GoogleApiError, invalid_argument, not_found

CANCELLED = 1  # google.rpc.Code.CANCELLED; not in GRPC_CODES because no HTTP error maps to it
UNKNOWN = 2
DEFAULT_PAGE_SIZE = 100


@dataclass
class _Entry:
    op: operations_pb2.Operation
    # Set once the operation is done, so ``wait()`` needs no polling loop.
    done: asyncio.Event = field(default_factory=asyncio.Event)
    on_cancel: Callable[[str], None] | None = None
    timer: asyncio.TimerHandle | None = None


def pack(message: proto.Message | Message | None) -> any_pb2.Any:
    """An Any holding ``message`` (proto-plus or pb2); None packs google.protobuf.Empty."""
    if message is None:
        message = empty_pb2.Empty()
    if isinstance(message, proto.Message):
        message = type(message).pb(message)
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def operation_json(op: operations_pb2.Operation) -> dict:
    """The REST JSON of an operation, as google-api-core's operations client parses it."""
    return json_format.MessageToDict(op)


class Operations:
    """Long-running operations of every location-scoped v1 API in the sandbox.

    Python API for other modules (all on the control plane's event loop):
    ``create(parent, metadata=None, on_cancel=None)``, ``finish(name, response)``,
    ``finish_later(name, response, delay_s)``, ``fail(name, error)``, ``cancel(name)``, ``get(name)``,
    ``await wait(name, timeout_s)``, and ``response(op)`` to answer an API call with the operation.
    """

    name = "operations"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self._ops: dict[str, _Entry] = {}

    # Python API -------------------------------------------------------------------------------------------
    def create(
        self,
        parent: str,
        metadata: proto.Message | Message | None = None,
        on_cancel: Callable[[str], None] | None = None,
    ) -> operations_pb2.Operation:
        """A new, running operation ``{parent}/operations/{uuid}``; ``parent`` is ``projects/P/locations/L``.

        ``on_cancel(name)`` is called when a client cancels it while it runs (before it is marked done),
        so the owning module can stop the work (e.g. a build).
        """
        op = operations_pb2.Operation(name=f"{parent}/operations/{uuid.uuid4()}")
        if metadata is not None:
            op.metadata.CopyFrom(pack(metadata))
        self._ops[op.name] = _Entry(op=op, on_cancel=on_cancel)
        snapshot = self.get(op.name)
        assert snapshot is not None
        return snapshot

    def finish(self, name: str, response: proto.Message | Message | None = None) -> bool:
        """Mark the operation done with ``response`` (None = Empty). False if unknown or already done."""
        entry = self._ops.get(name)
        if entry is None or entry.op.done:
            return False
        entry.op.response.CopyFrom(pack(response))
        self._mark_done(entry)
        return True

    def finish_later(self, name: str, response: proto.Message | Message | None, delay_s: float) -> None:
        """Finish after ``delay_s`` real seconds, so clients see a running operation and poll it."""
        entry = self._ops.get(name)
        if entry is None:
            raise KeyError(name)
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(max(delay_s, 0.0), self.finish, name, response)

    def fail(self, name: str, error: GoogleApiError) -> bool:
        """Mark the operation done with ``error`` (its gRPC code from the error's status name)."""
        return self.fail_with_code(name, GRPC_CODES.get(error.status, UNKNOWN), error.message)

    def update_metadata(self, name: str, metadata: proto.Message | Message) -> bool:
        """Refresh a running operation's metadata (e.g. a build's progress). False if unknown or done."""
        entry = self._ops.get(name)
        if entry is None or entry.op.done:
            return False
        entry.op.metadata.CopyFrom(pack(metadata))
        return True

    def fail_with_code(self, name: str, code: int, message: str) -> bool:
        """Mark the operation done with a raw gRPC ``code`` (e.g. 4 DEADLINE_EXCEEDED for a timed-out build)."""
        entry = self._ops.get(name)
        if entry is None or entry.op.done:
            return False
        entry.op.error.CopyFrom(status_pb2.Status(code=code, message=message))
        self._mark_done(entry)
        return True

    def cancel(self, name: str) -> bool:
        """Cancel a running operation: ``on_cancel`` runs, then it ends with CANCELLED. False if done/unknown.

        Cancelling a finished operation does nothing, as google.longrunning allows ("best effort").
        """
        entry = self._ops.get(name)
        if entry is None or entry.op.done:
            return False
        if entry.on_cancel is not None:
            entry.on_cancel(name)
        return self.fail_with_code(name, CANCELLED, "Operation was cancelled.")

    def get(self, name: str) -> operations_pb2.Operation | None:
        """A snapshot of the operation, or None if there is none by that name."""
        entry = self._ops.get(name)
        if entry is None:
            return None
        copy = operations_pb2.Operation()
        copy.CopyFrom(entry.op)
        return copy

    async def wait(self, name: str, timeout_s: float) -> operations_pb2.Operation | None:
        """The operation once done, or as it is after ``timeout_s``; None if unknown."""
        entry = self._ops.get(name)
        if entry is None:
            return None
        if not entry.op.done:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.done.wait(), timeout=max(timeout_s, 0.0))
        return self.get(name)

    @staticmethod
    def response(op: operations_pb2.Operation) -> JSONResponse:
        """An HTTP answer carrying ``op``, for API methods that return an operation."""
        return JSONResponse(operation_json(op))

    def _mark_done(self, entry: _Entry) -> None:
        entry.op.done = True
        entry.done.set()
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None

    # HTTP -------------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        base = "/v1/projects/{project}/locations/{location}/operations"
        # ":cancel" ends the last path segment (a Google custom method), so it is routed before the plain name,
        # which would otherwise swallow it.
        return [
            Route(base + "/{operation}:cancel", self.http_cancel, methods=["POST"]),
            Route(base + "/{operation}", self.http_get, methods=["GET"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [Route("/state", self.admin_state, methods=["GET"])]

    async def shutdown(self) -> None:
        for entry in self._ops.values():
            if entry.timer is not None:
                entry.timer.cancel()

    def _parent(self, request: Request) -> str:
        project, location = request.path_params["project"], request.path_params["location"]
        if project != self.ctx.config.project:
            raise GoogleApiError(
                403, f"Permission denied on resource project {project} (or it may not exist).", "PERMISSION_DENIED"
            )
        return f"projects/{project}/locations/{location}"

    def _entry(self, request: Request) -> _Entry:
        name = f"{self._parent(request)}/operations/{request.path_params['operation']}"
        entry = self._ops.get(name)
        if entry is None:
            raise not_found(f"Operation '{name}' not found.")
        return entry

    async def http_get(self, request: Request) -> JSONResponse:
        return self.response(self._entry(request).op)

    async def http_cancel(self, request: Request) -> JSONResponse:
        self.cancel(self._entry(request).op.name)
        return JSONResponse({})

    async def admin_state(self, _: Request) -> JSONResponse:
        return JSONResponse([operation_json(e.op) for e in self._ops.values()])


def paginate(items: list, request: Request, default_size: int = DEFAULT_PAGE_SIZE) -> tuple[list, str]:
    """One page of ``items`` for ``pageSize``/``pageToken`` query parameters, and the next page token.

    Tokens are plain offsets: opaque to clients, and stable enough for a store that only appends.
    """
    try:
        size = int(request.query_params.get("pageSize") or default_size)
        start = int(request.query_params.get("pageToken") or 0)
    except ValueError:
        raise invalid_argument("Invalid page_size or page_token.") from None
    if size < 0 or start < 0:
        raise invalid_argument("Invalid page_size or page_token.")
    size = min(size or default_size, 1000)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")
