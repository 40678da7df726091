"""The service lock's lease lapses in the middle of a canary's watch (what the Prefect server does when a lease goes
unrenewed for its whole duration: it frees the slot and forgets the lease). Prefect's strict ``concurrency()``
cancelled the run on the failed renewals that follow (Prefect #21064, #18893); here the promotion recovers: it
takes the lock again and goes on if the service is as it left it, and never writes over another run's change."""

from __future__ import annotations

import contextvars
import itertools
import logging
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from flows.common import service_lock_name
from flows.promote import promote_model
from flows.service_lock import LOCK_LEASE_S, ServiceLockTimeout, held
from tasks.common.logs import PACKAGE_LOGGER
from tasks.deploy.cloudrun import rollback
from tasks.deploy.probe import VerifyOptions
from tests.support.artifacts import artifact
from tests.support.locks import lock_slots, wait_until
from tests.support.promotion import run_service
from tests.support.run_log import RunLog, run_logs
from tests.support.tcp_proxy import cuttable_proxy

pytestmark = [
    pytest.mark.prefect,
    # The canary keeps its candidate beside the serving revision (64 GiB of a new project's 40): the lock is what is
    # tested here, with the quota a team delivering this way requested.
    pytest.mark.usefixtures("raised_quota"),
]
FAST = VerifyOptions(health_period_s=0.05)
SLO = {"max_error_ratio": 0.02, "max_p95_ms": "off", "min_requests": 5}
# Sampling periods the canary is watched for: long enough (about 25 s real on the sandbox's clock) that the test's
# few calls to the Prefect server land inside the watch even on a busy machine; a breach would end it sooner.
WATCH_SAMPLES = 40
_ids = itertools.count()


@pytest.fixture
def run_log() -> Iterator[RunLog]:
    with run_logs() as handler:
        yield handler


def promote(service: str, **kwargs):
    params = {"model": "sandbox/tiny-chat", "service": service, "token_secret_block": "sandbox-hf-token",
              "verify": FAST, **kwargs}  # fmt: skip
    return promote_model(**params)


def serving(flow_env, service: str) -> list[tuple[str, int]]:
    return [(s.revision, s.percent) for s in run_service(flow_env, service).traffic_statuses if s.percent]


def canary_in_its_watch(flow_env, service: str, run_log: RunLog) -> tuple[Future, UUID]:
    """A re-promotion of ``service`` with a 10 % canary, started in a thread; returns once the canary's watch runs,
    with the lease id the run holds the lock by."""
    pool = ThreadPoolExecutor(1)
    run = pool.submit(promote, service, revision="dev", canary=[10], watch={"samples": WATCH_SAMPLES, **SLO})
    pool.shutdown(wait=False)
    wait_until(lambda: run.done() or "canary 10 %: " in run_log.text(), 600, "the canary's watch to start")
    assert not run.done(), run.exception()
    held = re.findall(rf"service lock {re.escape(service_lock_name(flow_env, service))} held \(lease ([0-9a-f-]{{36}})",
                      run_log.text())  # fmt: skip
    return run, UUID(held[-1])


def lapse(lease_id: UUID) -> None:
    """What the server does to a lease left unrenewed for LOCK_LEASE_S: the slot freed, the lease forgotten."""
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(lease_id)


def test_a_lease_that_lapses_mid_watch_is_taken_again_and_the_promotion_completes(sb, flow_env, traffic, run_log):
    service = f"lock-{next(_ids)}"
    old = promote(service, watch={"samples": 0}).serving_revision
    traffic(service)
    run, lease = canary_in_its_watch(flow_env, service, run_log)
    lapse(lease)

    report = run.result(timeout=900)
    assert report.outcome == "promoted" and report.serving_revision != old
    assert serving(flow_env, service) == [(report.serving_revision, 100)]
    log = run_log.text()
    assert "the lease lapsed" in log and "was taken again" in log, log[-3000:]
    assert "the service is as this run left it after its lock lapsed" in log
    assert lock_slots(flow_env, service) == 0  # released at the end, once: no slot leaked by the second lease


def test_a_run_whose_lease_lapsed_never_writes_over_the_run_that_took_the_lock(sb, flow_env, traffic, run_log):
    """Another run takes the lock while this one's lease has lapsed, and sends all traffic back to the old revision.
    The promotion waits for the lock, sees the change and stops: it does not move traffic to its candidate, nor
    back to its split."""
    service = f"lock-{next(_ids)}"
    old = promote(service, watch={"samples": 0}).serving_revision
    traffic(service)
    run, lease = canary_in_its_watch(flow_env, service, run_log)
    name = service_lock_name(flow_env, service)
    with get_client(sync_client=True) as client:
        # The other run takes the lock the moment the lease lapses, as a run waiting for it would: a second slot
        # for a moment, so that the promotion cannot take it back in between.
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=2))
        taken = client.increment_concurrency_slots_with_lease([name], 1, "concurrency", LOCK_LEASE_S).json()
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=1))
        lapse(lease)
        # Holding it, the other run sends all traffic back to the old revision (rollback-model's own step).
        rollback(flow_env, service, to_revision=old)
        client.release_concurrency_slots_with_lease(UUID(taken["lease_id"]))

    with pytest.raises(Exception, match=r"another run changed the service meanwhile") as failed:
        run.result(timeout=900)
    assert f"{old} 100 %" in str(failed.value)
    assert serving(flow_env, service) == [(old, 100)]  # not split, and not moved back under the other run
    assert "NOT promoted" in artifact(f"promotion-{service}")


def test_a_fence_during_a_prefect_server_outage_gives_up_at_the_locks_timeout_instead_of_hanging(prefect_api, caplog):
    """The Prefect server out of reach while a run holds a service's lock: the renewal thread keeps failing, and a
    write's fence must still end, at the lock's timeout, with an error saying the run made no change after it (the
    thread once retried inside the lock's mutex for as long as the outage lasted, so the fence waited for the server).
    Once the server answers again the run holds the lock."""
    caplog.set_level(logging.INFO, logger=PACKAGE_LOGGER)
    api = urlsplit(PREFECT_API_URL.value())
    name = f"lock-outage-{next(_ids)}-{uuid4().hex[:8]}"
    with cuttable_proxy(api.port) as proxy:
        via_proxy = f"{api.scheme}://127.0.0.1:{proxy.port}{api.path}"
        settings = {PREFECT_API_URL: via_proxy, PREFECT_CLIENT_MAX_RETRIES: 0}
        with temporary_settings(settings), held(name, timeout_s=5) as lock:
            proxy.cut()
            pool = ThreadPoolExecutor(1)
            try:
                wait_until(lambda: "renewal failed" in caplog.text, 120, "the renewal thread to meet the outage")
                fenced = pool.submit(contextvars.copy_context().run, lock.fence)  # the proxied settings too
                with pytest.raises(ServiceLockTimeout, match=r"could not be renewed .* made no change after that"):
                    fenced.result(timeout=120)
            finally:
                proxy.mend()  # a fence still waiting (the bug) ends once the server answers, and the test with it
                pool.shutdown(wait=False)
            lock.fence()  # renewed, or taken again if the lease lapsed meanwhile: held either way
            with get_client(sync_client=True) as client:
                assert client.read_global_concurrency_limit_by_name(name).active_slots == 1
