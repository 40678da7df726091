"""Cloud Run's scale-in, as the sandbox's Cloud Run (api.py) runs it: which revisions may keep an instance (manual
scaling, minimums) and when an idle one stops (``idle_instance_seconds``, with its source)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from google.cloud import run_v2

from sandbox.config import SandboxConfig
from sandbox.control.run.instances import Instance

if TYPE_CHECKING:
    from sandbox.control.run.api import ServiceRecord

# A request holds its instance up for at most Cloud Run's longest request timeout (simulated seconds): one the front
# end lost track of (a caller gone before the first byte) cannot keep an instance up for ever.
MAX_REQUEST_S = 3600


class ScaleIn:
    """The scale-in half of the sandbox's Cloud Run: its instances, and the requests each is answering."""

    config: SandboxConfig
    services: dict[str, ServiceRecord]
    instances: dict[str, Instance]
    _last_active: dict[str, float]  # by full revision name: time.time() of its last request
    _in_flight: dict[str, int]  # by full revision name: requests its instance is answering
    _reaper: asyncio.Task | None

    async def _stop_instance(self, revision_name: str) -> None:
        raise NotImplementedError

    def _manually_stopped(self, record: ServiceRecord) -> set[str]:
        """Revisions that may run no instance: those taking traffic in a service scaled manually to 0.

        Cloud Run docs, "Manual scaling": the manual instance count "is divided among all revisions with specified
        traffic based on the percent of traffic they are receiving"; revisions left with none answer "the same
        error as if the revisions were disabled" (no status given: the sandbox's 503 for a revision without an
        instance, unconfirmed). A revision active only through a tag is outside the count and scales to at most
        one instance on its tag URL's traffic (the page's zh-cn and ko versions, where the English excerpt is cut).
        """
        scaling = record.service.scaling
        if scaling.scaling_mode != run_v2.ServiceScaling.ScalingMode.MANUAL or scaling.manual_instance_count > 0:
            return set()
        return {revision for revision, percent in record.routes if percent > 0}

    async def _stop_manually_scaled(self, record: ServiceRecord) -> None:
        """Under manual scaling, instances run only where the count puts them: a count of 0 stops the instances of
        the revisions taking traffic, and a revision with neither traffic nor a tag gets none (the count "is divided
        among all revisions with specified traffic"; a tag-only revision scales to one on its tag URL's traffic:
        "Manual scaling"). Manual scaling has no autoscaler, so no idle instance is kept. How fast Cloud Run stops
        them is not documented: here before the update's operation ends."""
        scaling = record.service.scaling
        if scaling.scaling_mode != run_v2.ServiceScaling.ScalingMode.MANUAL:
            return
        idle = (
            {n.rsplit("/", 1)[1] for n in record.revisions} - set(dict(record.routes)) - set(record.tag_routes.values())
        )
        for short in self._manually_stopped(record) | idle:
            await self._stop_instance(f"{record.service.name}/revisions/{short}")

    def _routed(self, record: ServiceRecord) -> set[str]:
        return {r for r, pct in record.routes if pct} | set(record.tag_routes.values())

    # Idle instances ---------------------------------------------------------------------------------------
    def _kept_warm(self, record: ServiceRecord, name: str) -> bool:
        """Whether a minimum keeps the revision ``name``'s instance up. Cloud Run docs, "Set minimum instances for
        services" and "Revisions and minimum instances": a service-level minimum goes to the revisions serving
        traffic in proportion to the split (a tagged revision outside the split is not counted toward it); a
        revision-level minimum starts its instances whenever the revision is in the split, even at 0 %, or has a
        tag. A manual instance count keeps the revisions taking traffic up ("Manual scaling")."""
        revision = record.revisions.get(name)
        if revision is None:
            return False
        short = name.rsplit("/", 1)[1]
        in_split = dict(record.routes)
        scaling = record.service.scaling
        if scaling.scaling_mode == run_v2.ServiceScaling.ScalingMode.MANUAL:
            return scaling.manual_instance_count > 0 and in_split.get(short, 0) > 0
        kept_by_service = scaling.min_instance_count > 0 and in_split.get(short, 0) > 0
        tagged = short in set(record.tag_routes.values())
        return kept_by_service or (revision.scaling.min_instance_count > 0 and (short in in_split or tagged))

    def _record_of(self, revision_name: str) -> ServiceRecord | None:
        return self.services.get(revision_name.split("/revisions/", 1)[0])

    def _idle_for(self, name: str, instance: Instance) -> float:
        """Seconds (real) the ready instance has answered no request, or 0 while it starts or answers one."""
        if instance.ready_at is None:
            return 0.0
        now = time.time()
        last = max(self._last_active.get(name, 0.0), instance.ready_at)
        busy_for = MAX_REQUEST_S * self._clock(instance)
        if self._in_flight.get(name) and now - last < busy_for:
            return 0.0
        return now - last

    def _clock(self, instance: Instance) -> float:
        """Real seconds per simulated second for ``instance``: the real engine runs in real time (its probes too)."""
        return 1.0 if instance.spec.real_engine else self.config.time_scale

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_idle())

    async def _reap_idle(self) -> None:
        """Cloud Run's scale-in: an instance no minimum keeps up stops once it has been idle for
        ``idle_instance_seconds`` ("About instance autoscaling": idle instances are kept "for a maximum of 15
        minutes"), whether its revision still takes traffic or lost it. Its next request cold-starts one."""
        while self.instances:
            await asyncio.sleep(max(min(self.config.idle_instance_seconds * self.config.time_scale / 10, 1.0), 0.05))
            for name, instance in list(self.instances.items()):
                record = self._record_of(name)
                if record is not None and self._kept_warm(record, name):
                    continue
                if self._idle_for(name, instance) > self.config.idle_instance_seconds * self._clock(instance):
                    await self._stop_instance(name)

    def request_started(self, revision_name: str) -> None:
        self._in_flight[revision_name] = self._in_flight.get(revision_name, 0) + 1
        self._last_active[revision_name] = time.time()

    def request_ended(self, revision_name: str) -> None:
        self._in_flight[revision_name] = max(self._in_flight.get(revision_name, 0) - 1, 0)
        self._last_active[revision_name] = time.time()
