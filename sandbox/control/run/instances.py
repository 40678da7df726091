"""Revision instances: the container launched as a local process, and Cloud Run's startup and liveness probes.

The container is the vLLM stand-in (``python -m sandbox.vllm ARGS``, contract in sandbox/vllm). Its container
port is mapped to a free loopback port; the probe and the front ends reach it there. Probe timing follows
Cloud Run: initial delay, then one probe per period, failure after ``failureThreshold`` consecutive misses; a
TCP probe succeeds when the port accepts a connection within its timeout, an HTTP probe when ``GET path``
answers 2xx/3xx within its timeout.

The probe's schedule runs on the container's own simulated clock, which the stand-in publishes
(``SANDBOX_CLOCK_FILE``, sandbox/vllm/timing.SimClock), not on the host's wall clock. At 1/100 of real time a
240 s window is 2.4 real seconds, and a host busy with other work (a laptop, a shared CI runner) can spend
that much just starting the stand-in's interpreter: judged on the wall clock, the same revision would start
on an idle machine and fail its probe on a busy one. On the container's clock, only what the stand-in models
(engine init, weight loading, compile, hangs) counts against the window, so a revision starts or fails the
same way at any host load. A container whose clock never moves (a script that hangs before the stand-in runs)
is failed after the window plus ``STALLED_CONTAINER_S`` of real time.

A revision served by the real engine (``--engine vllm``, sandbox/vllm/real_engine.py) publishes no clock: it loads,
profiles and starts in real seconds, so its probe runs on the wall clock, unscaled, as Cloud Run's does. Its
window is the revision's own (initial delay + period x threshold: 245 s and more for the cpu preset) against a real
start of about 30 s here, so a busy host has minutes of margin; its probe timeout is the configured one.

Once started, an instance is watched until it stops: Cloud Run's liveness probe, when the ingress container has one,
and the container's own exit. The liveness probe starts after the startup probe passed ("When you configure a startup
probe, liveness checks are disabled until the startup probe determines that the container is started", Cloud Run docs,
"Configure container health checks") and counts misses in a row (a miss: no 2xx/3xx answer within the timeout, for an
HTTP probe); at ``failureThreshold`` misses Cloud Run shuts the instance down and logs, at severity ERROR,
``LIVENESS HTTP probe failed 3 times consecutively for container "NAME" on port 8080 path "/health". The instance has
been shut down.`` (Cloud Run's line as public reports quote it: find_string "LIVENESS HTTP probe failed" in the
reference corpus, e.g. "... for container agent on port 8080 path /livez ... instance has been shut down"). A
container that exits after its start ends the instance too, logged at WARNING as Cloud Run logs it ("Container called
exit(0)."). Either way the launcher's owner (api.py) is told and starts a new instance for a revision that serves
traffic. For the stand-in the probe follows the container's clock, which runs with the host's once it listens
(``SimClock.idle``): a scaled period and timeout, but never below ``LIVENESS_MIN_REAL_PERIOD_S`` /
``LIVENESS_MIN_REAL_TIMEOUT_S`` of real time, so that a test session's instances are not probed many times a real
second, and a host busy with other work cannot make a healthy stand-in miss three probes in a row (a dead engine
answers 503 at once: only a hang waits the timeout out). The real engine's probe runs on the wall clock with the
configured figures, as Cloud Run's does.

An instance with sidecars (several containers) is this process, the ingress container, plus the sidecars the sandbox
emulates in-process (``sidecars``: so far the GMP collector, gmp_sidecar.py); api.py starts them in dependsOn order,
and ``stop`` stops them before the ingress container, so a sidecar's last act (the collector's shut-down scrape)
still finds it running.

A real engine's read-write Cloud Storage volume is written back to its bucket while the instance runs and once more
when it stops (volume_sync.py: files that stopped changing, as gcsfuse uploads a file when it is closed).

What the container writes and what Cloud Run says about the instance are logged as Cloud Logging receives them
(container_log.py): each line of stdout and stderr stamped when the launcher reads it, and Cloud Run's own lines
(system_lines.py: why the instance started, its startup probe passing, its end) in the revision's varlog/system log,
not in the container's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from sandbox.control.run.container_log import ContainerLog
from sandbox.control.run.system_lines import (
    StartReason,
    exit_line,
    liveness_failed_line,
    start_line,
    startup_passed_line,
)
from sandbox.control.run.volume_sync import VolumeSync, volume_syncs
from sandbox.serving import LOOPBACK, free_port, stop_process_group
from sandbox.vllm.timing import PublishedClock

# Real timeouts are not shrunk below this: host scheduling noise on a busy 2-core machine is not simulated time.
MIN_REAL_PROBE_TIMEOUT_S = 1.0
# How often the launcher looks at the container's clock (real seconds).
CLOCK_POLL_S = 0.01
# How often the launcher looks for a real engine's exit between its probes (real seconds).
REAL_ENGINE_POLL_S = 0.1
# Real seconds a container may take beyond its window when its clock does not move (it never published one).
STALLED_CONTAINER_S = 120.0
# Real-time floors of the stand-in's liveness probe (see the module docstring).
LIVENESS_MIN_REAL_PERIOD_S = 0.5
LIVENESS_MIN_REAL_TIMEOUT_S = 5.0
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", "SYSTEMROOT")


@dataclass(frozen=True)
class ProbeSpec:
    kind: str  # "tcp" or "http"
    port: int
    path: str = "/"
    initial_delay_s: float = 0
    period_s: float = 240
    timeout_s: float = 240
    failure_threshold: int = 1
    default: bool = False  # Cloud Run's own TCP startup probe, for a container that configures none

    @property
    def window_s(self) -> float:
        return self.initial_delay_s + self.period_s * self.failure_threshold

    def due_at(self, attempt: int) -> float:
        """When probe number ``attempt`` (1-based) is sent, in seconds since the container started."""
        return self.initial_delay_s + (attempt - 1) * self.period_s

    def due_by(self, seconds: float) -> int:
        """How many probes have been sent ``seconds`` after the container started."""
        return 0 if seconds < self.initial_delay_s else int((seconds - self.initial_delay_s) // self.period_s) + 1

    def first_due_at_or_after(self, seconds: float) -> int:
        """The number of the first probe sent at or after ``seconds``."""
        return max(math.ceil((seconds - self.initial_delay_s) / self.period_s), 0) + 1


@dataclass(frozen=True)
class InstanceSpec:
    revision: str
    argv: list[str]
    env: dict[str, str]
    entrypoint: str
    image_cuda: int
    accelerator: str
    driver_cuda: int
    container_port: int
    probe: ProbeSpec
    mounts: list[dict]
    faults: dict = field(default_factory=dict)
    # The real vLLM engine's venv when the revision runs on it (``--engine vllm``); None for the stand-in.
    engine_venv: str | None = None
    note: str = ""  # a line the sandbox writes to the container's log before it starts (why it runs what it runs)
    # Where the container reaches Cloud Storage, when not the storage backend itself (egress.py: a black hole for
    # all-traffic egress through a subnet without Private Google Access).
    storage_url: str | None = None
    liveness: ProbeSpec | None = None  # the ingress container's liveness probe, if it has one
    container_name: str = ""  # the ingress container's name, as Cloud Run's probe log lines give it

    @property
    def real_engine(self) -> bool:
        return self.engine_venv is not None


class Sidecar(Protocol):
    """A sidecar container the sandbox runs beside an instance's ingress container."""

    async def stop(self) -> None: ...

    def status(self) -> dict: ...


@dataclass
class StartOutcome:
    ready: bool
    exit_code: int | None = None
    probe_failures: int = 0
    elapsed_sim_s: float = 0.0


class Instance:
    """One running container of a revision."""

    def __init__(self, spec: InstanceSpec, workdir: Path, gcs_url: str, time_scale: float) -> None:
        self.spec = spec
        self.workdir = workdir
        self.gcs_url = gcs_url
        # The real engine runs in real time: its probe's periods and timeouts are not scaled.
        self.time_scale = 1.0 if spec.real_engine else time_scale
        self.host_port = free_port()
        self.process: asyncio.subprocess.Process | None = None
        # Cloud Run's instanceId label: hex, one per instance (a real one is about 160 hex digits).
        self.instance_id = secrets.token_hex(32)
        self.log = ContainerLog(workdir, self.instance_id, spec.container_name)
        self.log_path = self.log.path
        self.clock_path = workdir / "clock"
        self.scratch: Path | None = None  # the real engine's HOME and TMPDIR, removed when it stops
        self.sidecars: list[Sidecar] = []
        # The real engine's read-write volumes, written back to their buckets while it runs and when it stops.
        self.volume_syncs: list[VolumeSync] = []
        self._sync_tasks: list[asyncio.Task] = []
        self.started_at: float | None = None  # real epoch seconds: the ingress container was launched
        self.ready_at: float | None = None  # real epoch seconds: its startup probe passed
        # Called once when the instance shuts down by itself (a failed liveness probe, the container's exit), with
        # Cloud Run's log line for it; not when it is stopped (scale-in, deletion).
        self.on_ended: Callable[[Instance, str], Awaitable[None]] | None = None
        self._watch: asyncio.Task | None = None
        self._launched = 0.0  # the event loop's time when the ingress container was launched
        # Seconds on its own clock until the startup probe passed (Cloud Run's startup latency; throttle.py).
        self.startup_s: float | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.host_port}"

    def url_of_port(self, container_port: int) -> str | None:
        """Where another container of the instance reaches ``localhost:container_port``: the ingress container's
        port when it listens there and runs, else None (nothing listens on that port in the instance)."""
        return self.url if container_port == self.spec.container_port and self.running else None

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        env.update(self.spec.env)
        env.update(
            {
                "PORT": str(self.spec.container_port),
                "K_REVISION": self.spec.revision,
                "PYTHONUNBUFFERED": "1",
                "SANDBOX_IMAGE_ENTRYPOINT": self.spec.entrypoint,
                "SANDBOX_PORT_MAP": json.dumps({str(self.spec.container_port): self.host_port}),
                "SANDBOX_ACCELERATOR": self.spec.accelerator,
                "SANDBOX_DRIVER_CUDA": str(self.spec.driver_cuda),
                "SANDBOX_IMAGE_CUDA": str(self.spec.image_cuda),
                "SANDBOX_MOUNTS": json.dumps(self.spec.mounts),
                "SANDBOX_ROOT": str(self.workdir / "root"),
                "SANDBOX_TIME_SCALE": repr(self.time_scale),
                "SANDBOX_CLOCK_FILE": str(self.clock_path),
                # The platform's own plumbing, like the metadata server: how the container reaches storage. The
                # Python client reads the first; runai-model-streamer's C++ client the other two (FACTS.md).
                "STORAGE_EMULATOR_HOST": self.spec.storage_url or self.gcs_url,
                "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.spec.storage_url or self.gcs_url,
                "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1",
            }
        )
        if self.spec.engine_venv is not None:
            env["SANDBOX_ENGINE_VENV"] = self.spec.engine_venv
        if self.scratch is not None:
            # The container's own home and /tmp: vLLM's /tmp/vllm_dist_* and caches go with the instance. A short
            # host path, because vLLM binds ZeroMQ unix sockets under TMPDIR (107 bytes at most, sun_path).
            env.update({"HOME": str(self.scratch / "home"), "TMPDIR": str(self.scratch / "tmp")})
        if self.spec.faults:
            env["SANDBOX_VLLM_FAULTS"] = json.dumps(self.spec.faults)
        return env

    def announce(self, reason: StartReason) -> None:
        """Cloud Run's line for the instance starting (before its containers start, sidecars included)."""
        self.log.system(start_line(reason), "INFO")

    async def start(self) -> StartOutcome:
        """Launch the container and run the startup probe until it passes, fails, or the container exits."""
        (self.workdir / "root").mkdir(parents=True, exist_ok=True)
        self.clock_path.unlink(missing_ok=True)  # a restarted instance starts its clock again
        self.started_at = time.time()
        self._launched = asyncio.get_running_loop().time()
        if self.spec.real_engine:
            self.scratch = Path(tempfile.mkdtemp(prefix="sbx-engine-"))
            (self.scratch / "home").mkdir()
            (self.scratch / "tmp").mkdir()
        if self.spec.note:
            self.log.write(f"[sandbox] {self.spec.note}")
        stdout, stderr = self.log.open_pipes()
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sandbox.vllm",
                *self.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=self._env(),
                cwd=self.workdir / "root",
                start_new_session=True,
            )
        except BaseException:
            self.log.close()
            raise
        self.log.attach()
        if self.spec.real_engine:
            self.volume_syncs = volume_syncs(self.spec.mounts, self.workdir / "root", self.gcs_url)
            write = functools.partial(self.log.write, stream="stderr")
            self._sync_tasks = [asyncio.create_task(sync.run(write)) for sync in self.volume_syncs]
        outcome = await self._probe_until_started()
        if outcome.ready:
            self.ready_at, self.startup_s = time.time(), outcome.elapsed_sim_s
            attempts = outcome.probe_failures + 1
            self.log.system(startup_passed_line(self.spec.probe, attempts, self.spec.container_name), "INFO")
            self._watch = asyncio.create_task(self._watch_running())
        else:
            self.log.pump()  # its last words, before anyone reads the revision's log for the failure
        return outcome

    async def _probe_until_started(self) -> StartOutcome:
        probe = self.spec.probe
        loop = asyncio.get_running_loop()
        launched = loop.time()
        stalled_at = launched + probe.window_s * self.time_scale + STALLED_CONTAINER_S
        failures = 0
        async with httpx.AsyncClient() as client:
            while True:
                if self.spec.real_engine:
                    clock, now = None, loop.time() - launched
                else:
                    clock = PublishedClock.read(self.clock_path)
                    now = clock.now(self.time_scale) if clock else 0.0
                if probe.due_by(now) > failures:
                    if await self._probe_once(probe, client):
                        # Passed now; Cloud Run's probe would have passed at its first one after the container
                        # began listening, and only if that one fell within the window.
                        listening = clock.listening_since if clock and clock.listening_since is not None else now
                        attempt = probe.first_due_at_or_after(listening)
                        if attempt <= probe.failure_threshold:
                            return StartOutcome(True, probe_failures=attempt - 1, elapsed_sim_s=probe.due_at(attempt))
                        failures = probe.failure_threshold
                    else:
                        # Every probe due since the last one missed too: the container was not up for any of them.
                        failures = min(probe.due_by(now), probe.failure_threshold)
                    if self._exit_code() is not None:
                        return StartOutcome(False, self._exit_code(), failures)
                if failures >= probe.failure_threshold or now >= probe.window_s or loop.time() >= stalled_at:
                    await self.stop()
                    return StartOutcome(False, None, failures, now)
                if await self._exited_within(REAL_ENGINE_POLL_S if self.spec.real_engine else CLOCK_POLL_S):
                    return StartOutcome(False, self._exit_code(), failures)

    def _exit_code(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    async def _exited_within(self, seconds: float) -> bool:
        assert self.process is not None
        try:
            await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout=seconds)
        except TimeoutError:
            return False
        return True

    async def _watch_running(self) -> None:
        """Until the instance ends by itself: then log why, shut it down (sidecars too) and tell ``on_ended``."""
        why, severity = await self._until_ended()
        self.log.system(why, severity)
        self._watch = None  # from here on, stop() must not cancel this task: it is what stops the instance
        await self.stop()
        if self.on_ended is not None:
            await self.on_ended(self, why)

    async def _until_ended(self) -> tuple[str, str]:
        """Cloud Run's line, and its severity, for how the running instance ended: its liveness probe failed (ERROR)
        or its container exited (WARNING)."""
        assert self.process is not None
        probe = self.spec.liveness
        if probe is None:
            return exit_line(await self.process.wait()), "WARNING"
        loop = asyncio.get_running_loop()
        real = self.spec.real_engine
        period = max(probe.period_s * self.time_scale, 0.0 if real else LIVENESS_MIN_REAL_PERIOD_S)
        floor = MIN_REAL_PROBE_TIMEOUT_S if real else LIVENESS_MIN_REAL_TIMEOUT_S
        # The initial delay counts from the container's start; liveness never begins before the startup probe passed.
        due, misses = max(loop.time(), self._launched + probe.initial_delay_s * self.time_scale), 0
        async with httpx.AsyncClient() as client:
            while True:
                if await self._exited_within(max(due - loop.time(), 0.0)):
                    return exit_line(self._exit_code()), "WARNING"
                passed = await self._probe_once(probe, client, floor)
                if self._exit_code() is not None:
                    return exit_line(self._exit_code()), "WARNING"
                misses = 0 if passed else misses + 1
                if misses >= probe.failure_threshold:
                    return liveness_failed_line(probe, misses, self.spec.container_name), "ERROR"
                due = max(due + period, loop.time())

    async def _probe_once(
        self, probe: ProbeSpec, client: httpx.AsyncClient, min_timeout_s: float = MIN_REAL_PROBE_TIMEOUT_S
    ) -> bool:
        timeout = max(probe.timeout_s * self.time_scale, min_timeout_s)
        port = self.host_port if probe.port == self.spec.container_port else None
        if port is None:
            # Nothing is mapped for that port: the probe can never connect (like probing a closed port).
            await asyncio.sleep(timeout)
            return False
        if probe.kind == "tcp":
            return await self._tcp_within(port, timeout)
        try:
            response = await client.get(f"http://{LOOPBACK}:{port}{probe.path}", timeout=timeout)
            return 200 <= response.status_code < 400
        except httpx.HTTPError:
            return False

    async def _tcp_within(self, port: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.process is not None and self.process.returncode is not None:
                return False
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), timeout=timeout)
            except (OSError, TimeoutError):
                await asyncio.sleep(min(0.01, max(deadline - loop.time(), 0)))
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        return False

    async def stop_sidecars(self) -> None:
        await asyncio.gather(*(sidecar.stop() for sidecar in self.sidecars))

    async def stop(self) -> None:
        """SIGTERM, as Cloud Run stops instances, then SIGKILL after a grace period; sidecars first."""
        watch, self._watch = self._watch, None
        if watch is not None:  # stopped from outside: no liveness verdict, no exit to report
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        try:
            try:
                await self.stop_sidecars()
            finally:
                await self._stop_process()
        finally:
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)
                self.scratch = None

    async def _stop_process(self) -> None:
        # The real engine's EngineCore child may hold the listening socket it inherited: the whole group goes.
        if self.process is not None:
            await stop_process_group(self.process, 5)
        await self._final_sync()
        self.log.close()  # what it wrote before it went is logged; a line it was cut off in is logged as it is

    async def _final_sync(self) -> None:
        """The volumes' last write-back, once the container is gone: what it wrote and no poll sent yet."""
        tasks, self._sync_tasks = self._sync_tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sync in self.volume_syncs:
            await asyncio.to_thread(sync.final)
            for line in sync.take_lines():
                self.log.write(line, "stderr")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
