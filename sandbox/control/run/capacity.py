"""The region's Cloud Run quotas at run time: what running instances and job tasks hold, and who may start.

Cloud Run checks a deploy's max instances against the regional quotas (validation.py), and it also counts what is in
use: its quotas "are also accounted as a sum of all in-use resources in the region across of your Cloud Run
resources" (Cloud Run docs, "About maximum instances"). An instance that would take the region past a quota does
not start, and the revision fails with Cloud Run's words (``SandboxConfig.runtime_quota``):

- GPUs: "Revision '...' is not ready and cannot serve traffic. Quota exceeded for total allowable count of GPUs per
  project per region." (GoogleCloudPlatform/magic-modules PR 17149);
- vCPU: "Quota exceeded for total allowable CPU per project per region." (public deploy notes of Cloud Run
  functions quote it after "Container Healthcheck failed.", on a 20 000 milli-vCPU project: the revision's new
  instance could not start);
- memory: "Quota exceeded for total allowable memory per project per region." (public deploy notes of a project
  redeploying 8 GiB services "with instances running" on a 40 GiB us-central1 quota).

A stopped instance's GPU counts a while longer (``gpu_release_seconds``, with its source). A job's task holds its
container's vCPU and memory while it runs; one that would exceed a quota fails with the same words.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from google.cloud import run_v2

from sandbox.config import SandboxConfig
from sandbox.control.run.validation import DEFAULT_CPU, DEFAULT_MEMORY, GPU_LIMIT_KEY, parse_quantity

GIB = 2**30


@dataclass(frozen=True)
class Footprint:
    """What one instance (all its containers) or one job task holds of the region's quotas."""

    cpu: float
    memory_gib: float
    accelerator: str = ""  # the GPU type, "" for none
    gpus: int = 0


def footprint_of(containers: Iterable[run_v2.Container], accelerator: str = "") -> Footprint:
    """The sum of the containers' limits, a container without them counting Cloud Run's defaults (1 vCPU, 512 MiB)."""
    cpu = memory = 0.0
    gpus = 0
    for container in containers:
        limits = dict(container.resources.limits)
        cpu += parse_quantity(limits.get("cpu", DEFAULT_CPU), "cpu")
        memory += parse_quantity(limits.get("memory", DEFAULT_MEMORY), "memory") / GIB
        gpus += int(float(limits.get(GPU_LIMIT_KEY, "0") or 0))
    return Footprint(cpu, memory, accelerator if gpus else "", gpus)


def exceeded(config: SandboxConfig, held: Iterable[Footprint], releasing: Iterable[str], want: Footprint) -> str | None:
    """Which quota ``want`` would take past its limit beside what is ``held`` (and the GPUs still ``releasing``), in
    Cloud Run's words; None when it fits or run-time counting is off. GPUs first, then vCPU, then memory."""
    if not config.runtime_quota:
        return None
    held = list(held)
    if want.gpus:
        in_use = sum(f.gpus for f in held if f.accelerator == want.accelerator)
        in_use += sum(1 for gpu in releasing if gpu == want.accelerator)
        if in_use + want.gpus > config.gpu_quota.get(want.accelerator, 0):
            return "Quota exceeded for total allowable count of GPUs per project per region."
    # A thousandth of a vCPU or a byte of slack: limits are summed from decimal strings.
    if sum(f.cpu for f in held) + want.cpu > config.cpu_quota + 1e-6:
        return "Quota exceeded for total allowable CPU per project per region."
    if sum(f.memory_gib for f in held) + want.memory_gib > config.memory_quota_gib + 1e-9:
        return "Quota exceeded for total allowable memory per project per region."
    return None


class GpuReleases:
    """GPUs of stopped instances that Cloud Run has not released yet (``gpu_release_seconds``)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._until: list[tuple[str, float]] = []  # (accelerator, monotonic time it is released)

    def add(self, accelerator: str) -> None:
        if accelerator and self.config.gpu_release_seconds:
            until = time.monotonic() + self.config.gpu_release_seconds * self.config.time_scale
            self._until.append((accelerator, until))

    def pending(self) -> list[str]:
        now = time.monotonic()
        self._until = [(gpu, until) for gpu, until in self._until if until > now]
        return [gpu for gpu, _ in self._until]

    def release_all(self) -> None:
        """Time has passed (the admin's idle call): every GPU is released."""
        self._until.clear()
