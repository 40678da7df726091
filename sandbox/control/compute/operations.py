"""Compute operations (``compute#operation``): global for networks, regional for subnetworks.

A mutation is checked and applied when its request arrives (the errors real Compute reports synchronously
are HTTP errors here too), and its operation then runs on the sandbox clock: PENDING, RUNNING, DONE after
``OPERATION_SECONDS`` simulated seconds (50 ms real time at the default time scale), or at once when a caller
POSTs ``.../wait``. Status is derived from the clock when the operation is read, so no task has to tick it.
An operation that an admin fault makes fail applies nothing and ends DONE with Compute's ``error`` block.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field

from sandbox.control.compute.resources import new_id, timestamp

# Simulated duration of a network or subnetwork change (real ones take a few seconds to tens of seconds).
OPERATION_SECONDS = 5.0
# Share of the duration spent PENDING before the operation shows RUNNING.
PENDING_SHARE = 0.2
USER = "sandbox-user@example.com"
HTTP_REASONS = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT", 412: "PRECONDITION FAILED",
                429: "TOO MANY REQUESTS", 500: "INTERNAL SERVER ERROR", 503: "SERVICE UNAVAILABLE"}  # fmt: skip


class OperationFault(BaseModel):
    """Makes the next matching operations fail inside the operation (HTTP 200, then ``error`` when DONE).

    Real Compute reports quota, rate and internal failures this way, after the insert itself succeeded.
    """

    operation_type: str | None = Field(None, alias="operationType", description="insert, delete, patch, ...")
    target: str = Field(".*", description="regex searched in the operation's targetLink")
    code: str = Field("QUOTA_EXCEEDED", description="errors[].code, e.g. QUOTA_EXCEEDED, INTERNAL_ERROR")
    message: str = "Quota 'NETWORKS' exceeded.  Limit: 15.0 globally."
    http_status: int = Field(403, alias="httpErrorStatusCode")
    times: int = Field(1, ge=1)
    fired: int = 0

    model_config = {"populate_by_name": True}

    def matches(self, operation_type: str, target_link: str) -> bool:
        if self.fired >= self.times:
            return False
        if self.operation_type and self.operation_type != operation_type:
            return False
        return re.search(self.target, target_link) is not None


@dataclass
class ComputeOperation:
    """One operation; ``region`` is empty for global operations."""

    name: str
    project: str
    region: str
    operation_type: str
    target_link: str
    target_id: str
    self_link: str
    region_link: str = ""
    id: str = field(default_factory=new_id)
    created_wall: datetime = field(default_factory=lambda: datetime.now(UTC))
    created: float = field(default_factory=time.monotonic)
    finish_at: float = 0.0
    error: dict | None = None  # {"code", "message", "httpErrorStatusCode"}

    def status(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        if now >= self.finish_at:
            return "DONE"
        if now - self.created < (self.finish_at - self.created) * PENDING_SHARE:
            return "PENDING"
        return "RUNNING"

    def finish_now(self) -> None:
        self.finish_at = min(self.finish_at, time.monotonic())

    def to_json(self) -> dict:
        now = time.monotonic()
        status = self.status(now)
        body: dict = {
            "kind": "compute#operation",
            "id": self.id,
            "name": self.name,
            "operationType": self.operation_type,
            "targetLink": self.target_link,
            "targetId": self.target_id,
            "status": status,
            "user": USER,
            "progress": 100 if status == "DONE" else 0,
            "insertTime": timestamp(self.created_wall),
            "selfLink": self.self_link,
        }
        if self.region_link:
            body["region"] = self.region_link
        duration = self.finish_at - self.created
        if status != "PENDING":
            body["startTime"] = timestamp(self.created_wall + timedelta(seconds=duration * PENDING_SHARE))
        if status == "DONE":
            body["endTime"] = timestamp(self.created_wall + timedelta(seconds=duration))
            if self.error:
                body["error"] = {"errors": [{"code": self.error["code"], "message": self.error["message"]}]}
                code = self.error["httpErrorStatusCode"]
                body["httpErrorStatusCode"] = code
                body["httpErrorMessage"] = HTTP_REASONS.get(code, "ERROR")
        return body


def new_operation_name() -> str:
    """``operation-<ms>-<hex>-<hex>-<hex>``, the shape of real Compute operation names."""
    millis = int(time.time() * 1000)
    return f"operation-{millis}-{secrets.token_hex(6)}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
