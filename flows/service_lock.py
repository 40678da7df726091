"""The per-service lock: one run at a time changes a service (promote-model, scale, rollback, teardown).

A Prefect global concurrency limit of one slot per service, held through a lease that a thread renews. Prefect's own
``concurrency(strict=True)`` cancels the run once three renewals in a row fail (Prefect #21064, #18893, #19068,
#21925: server restarts and network blips crashed long runs, mid-deploy); with ``strict=False`` it stops renewing
after those three and lets the lease lapse unnoticed, so a second run could take the lock while the first still
writes. A promotion holds the lock for up to an hour, sometimes with traffic split, so neither will do. Here:

- a failed renewal (the server out of reach, a 5xx) is tried again on the thread's next turn, however long the
  outage lasts, while a ``fence()`` retries it there and then for up to the lock's timeout;
- a lease the server no longer knows (410 Gone: it lapsed while the server was out of reach for longer than the
  lease, or a server restart lost in-memory lease storage) is taken again as soon as the slot is free;
- before each write to the service the flow calls ``fence()``, which renews there and then, so the write is made
  under a lease good for another ``LOCK_LEASE_S``, and says whether another run may have held the lock meanwhile:
  the flow then goes on only if the service is as it left it (flows/delivery.py).

A Prefect server with several replicas must keep leases in Redis (``PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE``,
Prefect #18839): the default in-memory storage is per replica, so a lease taken on one is unknown to the others.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from tasks.common.logs import run_logger

LOCK_LEASE_S = 60  # the server accepts no shorter lease: a run killed holding the lock frees it after a minute
RENEW_EVERY_S = LOCK_LEASE_S / 4  # three tries fit in one lease before it could lapse
# Each turn is one request (POST /v2/concurrency_limits/leases/{id}/renew), as is each fence: 4 a minute per lock
# held, 1.6 % of the 250 a minute of Prefect Cloud's Hobby plan, the smallest ("Rate limits and data retention",
# https://docs.prefect.io/v3/concepts/rate-limits). The whole promotion's busiest minute, renewals included, is
# measured by tests/e2e/test_api_budget.py (docs/production.md, "Prefect Cloud's rate limits").
RETRY_CAP_S = 10  # the longest pause between two tries while the server is out of reach


class ServiceLockTimeout(TimeoutError):
    """Another run held the service's lock for longer than this run would wait."""


class ServiceLock:
    """The lock on one service, held: ``fence()`` before each write says whether it lapsed since the last one."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.lease_id: UUID | None = None
        self._may_have_changed = False  # set on a lapse, cleared when fence() reports it
        self._last_renewed = 0.0
        self._outage_since: float | None = None  # when renewals began to fail, until one succeeds
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        run = FlowRunContext.get()
        self._holder = ConcurrencyLeaseHolder(type="flow_run", id=run.flow_run.id) if run and run.flow_run else None

    def acquire(self, client: SyncPrefectClient) -> None:
        """Wait for the slot, up to ``timeout_s``."""
        if not self._take(client, wait=True):
            raise ServiceLockTimeout(
                f"the lock {self.name} stayed held by another run for {self.timeout_s:.0f} s; see who holds it with "
                f"`prefect gcl inspect {self.name}` and run again when it is done"
            )

    def release(self, client: SyncPrefectClient) -> None:
        self._stop.set()
        if self.lease_id is not None:
            with contextlib.suppress(Exception):  # an unreachable server lets the lease lapse within LOCK_LEASE_S
                client.release_concurrency_slots_with_lease(self.lease_id)

    def fence(self) -> bool:
        """Renew now, before a write to the service; taken again if it lapsed (waiting for another holder to finish).

        True when the lease lapsed since the last fence: another run may have held the lock and changed the
        service in between, so the caller must check the service is as it left it before writing."""
        with self._mutex, get_client(sync_client=True) as client:
            if not self._keep(client, wait=True):
                raise ServiceLockTimeout(
                    f"the lock {self.name} lapsed and another run has held it for over {self.timeout_s:.0f} s since; "
                    "this run made no change after that: check the service, then run again"
                )
            changed, self._may_have_changed = self._may_have_changed, False
            return changed

    def _take(self, client: SyncPrefectClient, wait: bool) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                response = client.increment_concurrency_slots_with_lease(
                    names=[self.name], slots=1, mode="concurrency", lease_duration=LOCK_LEASE_S, holder=self._holder
                )
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 423:  # 423 Locked: another run holds the slot
                    raise
                pause = float(exc.response.headers.get("Retry-After") or 1)
                if not wait or time.monotonic() + pause > deadline:
                    return False
                time.sleep(pause)
                continue
            self.lease_id = UUID(response.json()["lease_id"])
            self._last_renewed = time.monotonic()
            return True

    def _renewed(self, client: SyncPrefectClient) -> bool:
        """True when renewed; False when the server no longer knows the lease (it lapsed)."""
        assert self.lease_id is not None
        try:
            client.renew_concurrency_lease(self.lease_id, LOCK_LEASE_S)
        except httpx.HTTPStatusError as exc:
            # Prefect 3.9's server: 410 "Lease not found - it may have expired or been revoked"; 404 from older ones
            if exc.response.status_code in (404, 410):
                return False
            raise
        self._last_renewed = time.monotonic()
        return True

    def _keep(self, client: SyncPrefectClient, wait: bool) -> bool:
        """Renew; take the lock again if the lease lapsed. With ``wait`` (a fence), a failed renewal is retried until
        the server answers, up to ``timeout_s``; without (the thread's turn), it is tried once, so that the thread
        never holds the mutex through an outage and a fence meanwhile keeps its own deadline. False when the renewal
        failed or the lease lapsed while another run holds the slot, without ``wait``: the next turn tries again."""
        pause = 1.0
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if self._renewed(client):
                    self._outage_ended()
                    return True
                break
            except Exception as exc:  # out of reach, 5xx: the lease is good until LOCK_LEASE_S after the last renewal
                self._outage_began(exc)
                if not wait:
                    return False
                if time.monotonic() > deadline:
                    raise ServiceLockTimeout(
                        f"the lock {self.name} could not be renewed for {self.timeout_s:.0f} s (the Prefect server is "
                        f"out of reach: {exc}); this run made no change after that"
                    ) from exc
                time.sleep(pause)
                pause = min(pause * 2, RETRY_CAP_S)
        self._outage_ended(renewed=False)  # the server answered: it no longer knows the lease
        log = run_logger()
        # The lease lapsed: this run held no lock for a while, and another run may have changed the service.
        lapsed_for = time.monotonic() - self._last_renewed
        if not self._take(client, wait=wait):
            log.warning(
                "service lock %s: the lease lapsed (last renewed %.0f s ago) and another run holds the lock; this run "
                "makes no change to the service until it has the lock again", self.name, lapsed_for,
            )  # fmt: skip
            self._may_have_changed = True
            return False
        self._may_have_changed = True
        log.warning("service lock %s: the lease lapsed (last renewed %.0f s ago) and was taken again; the service is "
                    "checked before the next change", self.name, lapsed_for)  # fmt: skip
        return True

    def _outage_began(self, exc: Exception) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            run_logger().warning("service lock %s: renewal failed (%s); retrying until the server answers", self.name,
                                 exc)  # fmt: skip

    def _outage_ended(self, renewed: bool = True) -> None:
        if self._outage_since is not None:
            run_logger().info("service lock %s: the server answers again after %.0f s%s", self.name,
                              time.monotonic() - self._outage_since, "; renewed" if renewed else "")  # fmt: skip
            self._outage_since = None

    def _renew_in_background(self) -> None:
        # One short try per turn: the client's own retries (PREFECT_CLIENT_MAX_RETRIES, backing off for a minute) and
        # its 60 s request timeout would hold the mutex, and a fence waiting on it, for minutes of an outage.
        with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0, PREFECT_API_REQUEST_TIMEOUT: RENEW_EVERY_S}):
            self._renew_turns()

    def _renew_turns(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            with self._mutex, get_client(sync_client=True) as client:
                if self._stop.is_set():
                    return
                with contextlib.suppress(Exception):  # the lapse's own failures: the next turn tries again
                    self._keep(client, wait=False)

    @contextlib.contextmanager
    def renewed(self) -> Iterator[None]:
        context = contextvars.copy_context()  # the run logger in the thread too, so its warnings reach the UI
        thread = threading.Thread(target=context.run, args=(self._renew_in_background,), daemon=True,
                                  name=f"service-lock-{self.name}")  # fmt: skip
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(timeout=RENEW_EVERY_S)


def service_lock_name(project: str, region: str, service_id: str) -> str:
    """The global concurrency limit that serializes the runs changing one service (`prefect gcl inspect NAME`)."""
    return f"cloudrun-service:{project}:{region}:{service_id}"


@contextlib.contextmanager
def held(name: str, timeout_s: float = 3600) -> Iterator[ServiceLock]:
    """The lock ``name`` held for the block: created on first use, waited for up to ``timeout_s``."""
    lock = ServiceLock(name, timeout_s)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run created it first: fine
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        lock.acquire(client)
    run_logger().info("service lock %s held (lease %s, renewed every %.0f s)", name, lock.lease_id, RENEW_EVERY_S)
    try:
        with lock.renewed():
            yield lock
    finally:
        with get_client(sync_client=True) as client:
            lock.release(client)
