"""Cloud Run's admission of requests to a revision whose instances are all busy: the request pends, then fails 429.

Cloud Run docs, "About instance autoscaling", Exceeding maximum instances: when the maximum instances cannot meet the
traffic, "Requests will pend for up to 3.5 times average startup time of container instances of this service, or 10
seconds, whichever is greater" (the page's current wording, as quoted in the 2025-05-19 post "Cloud Run startup probes
default values can lead to unexpected errors"; earlier versions said 60 s, then 10 s: copies of the page from those
years); "During this time window, if an instance finishes processing requests, it becomes available to process queued
requests. If no instances become available during the window, the request fails with a 429 error code."

A revision takes ``max_instance_request_concurrency`` requests per instance at once ("Maximum concurrent requests per
instance"), so all of them are busy at max instances x concurrency requests in flight. The sandbox runs ONE instance
per revision whatever its maximum (api.py ``instances`` is keyed by revision), so a revision's capacity here is its
concurrency x 1: stricter than Cloud Run for a revision with max_instance_count above 1, which could scale out, and
the same for the product's GPU profiles (max instances 1, as on an L4 quota of 1). A request that finds its revision
without a running instance is cold-started (api.py ``_instance_url``) and admitted as before: the pending window of a
scale-from-zero is not modelled.

Pending requests are served in arrival order as slots free up. The window is measured against start-up times: the
seconds on the container's own clock its instances took to pass their startup probe (instances.py
``StartOutcome.elapsed_sim_s``, what Cloud Run's ``container/startup_latencies`` measures), averaged over the
service's instances as the docs say ("of this service": every revision's; a restart is another instance). The floor of
10 s is simulated seconds, so at the default time_scale a request pends for at least 0.1 real s.

The answer: HTTP 429 with the body "Rate exceeded." from Google's front end, before the container
(CarlosSalesNaturalTec/GDoc infra/terraform/variables.tf: "o Google Front End não acha instância livre e devolve `429
Rate exceeded.` sem chegar ao container"; the same words in other public incident notes), and a WARNING entry in the
revision's request log (cal-itp/data-infra's runbook for its Cloud Run archiver: "HTTP Status 429: The request was
aborted because there was no available instance. Additional troubleshooting documentation can be found at:
https://cloud.google.com/run/docs/troubleshooting#abort-request"; sandbox/control/logging/entries.py ``ABORTED``).
It is NOT counted in Monitoring's request_count, whose description excludes "requests that are not reaching your
container instances (e.g. unauthorized requests or when maximum number of instances is reached)"
(sandbox/control/monitoring/metrics.py): a reader finds the 429s in the request log.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from google.cloud import run_v2

from sandbox.control.run.instances import Instance
from sandbox.control.run.resources import DEFAULT_CONCURRENCY

PENDING_STARTUPS = 3.5
PENDING_FLOOR_S = 10.0
THROTTLED_BODY = "Rate exceeded."


@dataclass(frozen=True)
class Capacity:
    """What one revision's running instance takes at once, and the clock its start-up was measured on."""

    concurrency: int
    """max_instance_request_concurrency (Cloud Run fills in 80 when unset)."""
    instances: int
    """The instances the sandbox runs for it: one, whatever its max_instance_count (see the module docstring)."""
    instance_id: str
    """Which instance serves it now: its start-up time is one of the service's."""
    startup_s: float | None
    """Seconds on the instance's clock until its startup probe passed; None while it is starting."""
    time_scale: float
    """Real seconds per second of the instance's clock (1 for the real engine, which runs in real time)."""

    @property
    def limit(self) -> int:
        return max(self.concurrency, 1) * max(self.instances, 1)


@dataclass
class _Gate:
    in_flight: int = 0
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)


class Throttle:
    """The in-flight requests of one service's revisions, shared by its front ends (the service URL and every tag URL
    reach the same instances)."""

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}
        self._startups: dict[str, float] = {}  # the service's instances' start-up times, by instance id

    def pending_s(self, revision: str, capacity: Capacity) -> float:
        """Real seconds a request over ``capacity`` pends: 3.5 x the service's mean start-up, at least 10 s."""
        self._gates.setdefault(revision, _Gate())
        if capacity.startup_s is not None:
            self._startups[capacity.instance_id] = capacity.startup_s
        mean = sum(self._startups.values()) / len(self._startups) if self._startups else 0.0
        return max(PENDING_STARTUPS * mean, PENDING_FLOOR_S) * capacity.time_scale

    async def admit(self, revision: str, capacity: Capacity) -> bool:
        """Take one of ``revision``'s slots, pending up to its window for one to free up; False: the window passed
        with every slot busy (the caller answers 429)."""
        window = self.pending_s(revision, capacity)
        gate = self._gates[revision]
        if gate.in_flight < capacity.limit and not gate.waiting:
            gate.in_flight += 1
            return True
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gate.waiting.append(handed)
        try:
            await asyncio.wait_for(asyncio.shield(handed), window)
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # the caller went away while pending
            if handed.done() and not handed.cancelled():
                self.release(revision)  # a slot was handed over just now: pass it on
            else:
                self._forget(gate, handed)
            raise
        if handed.done() and not handed.cancelled():
            return True
        self._forget(gate, handed)
        return False

    def release(self, revision: str) -> None:
        """A request of ``revision`` finished: its slot goes to the oldest pending request, else frees up."""
        gate = self._gates.get(revision)
        if gate is None:
            return
        while gate.waiting:
            handed = gate.waiting.popleft()
            if not handed.done():
                handed.set_result(None)
                return
        gate.in_flight = max(gate.in_flight - 1, 0)

    @staticmethod
    def _forget(gate: _Gate, handed: asyncio.Future[None]) -> None:
        if handed in gate.waiting:
            gate.waiting.remove(handed)
        handed.cancel()


def revision_capacity(revision: run_v2.Revision | None, instance: Instance | None) -> Capacity | None:
    """What ``revision``'s running ``instance`` takes at once; None when it has no running instance (a cold start is
    not throttled here)."""
    if revision is None or instance is None or not instance.running or instance.process is None:
        return None
    return Capacity(
        concurrency=revision.max_instance_request_concurrency or DEFAULT_CONCURRENCY,
        instances=1,
        instance_id=instance.instance_id,
        startup_s=instance.startup_s,
        time_scale=instance.time_scale,
    )
