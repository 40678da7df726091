"""The Cloud Build stand-in's settings (changed through its admin API) and its record of one build."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from google.cloud.devtools import cloudbuild_v1 as cb
from pydantic import BaseModel, ConfigDict, Field

Status = cb.Build.Status
FINAL = {Status.SUCCESS, Status.FAILURE, Status.INTERNAL_ERROR, Status.TIMEOUT, Status.CANCELLED, Status.EXPIRED}
# OOM_KILLED: the first step's compiler is OOM-killed and the RUN fails, so the build ends FAILURE (not
# INTERNAL_ERROR) with the kill in its log ("Killed signal terminated program cc1plus", "exit code: 137").
ForcedOutcome = Literal["SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "OOM_KILLED", "AUTO"]


class BuildSettings(BaseModel):
    """How builds behave. Durations are simulated seconds, run on the sandbox clock (``config.time_scale``)."""

    model_config = ConfigDict(extra="forbid")

    build_seconds: float = Field(
        60.0, gt=0, description="how long a docker build step takes; an OOM kill comes halfway through it"
    )
    queue_seconds: float = Field(1.0, ge=0, description="time a build stays QUEUED before it starts WORKING")
    memory_per_job_gb: float = Field(
        2.5, gt=0, description="RAM one compile job takes: max_jobs x this above the machine's RAM OOM-kills the build"
    )
    internal_error_delivery: Literal["alternate", "error", "build"] = Field(
        "alternate",
        description="how an INTERNAL_ERROR build ends its operation: as an error (InternalServerError from "
        "result()), as a returned Build with that status, or alternating between the two (FACTS.md)",
    )


@dataclass
class BuildRecord:
    """One build: the resource clients read, where it lives, its operation and its log so far."""

    build: cb.Build
    location: str  # "global" or a region
    operation: str
    regional: bool  # its operation is in the shared store (projects/P/locations/L/operations/ID)
    request: cb.Build | None = None  # the create request as received, for :retry
    forced: ForcedOutcome | None = None
    log: list[str] = field(default_factory=list)
    task: asyncio.Task | None = None
    delivered_as: Literal["response", "error"] | None = None

    @property
    def final(self) -> bool:
        return self.build.status in FINAL
