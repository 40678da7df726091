"""A promotion stays well inside Prefect Cloud's smallest plan: its API requests and its logs, counted in the
busiest minute, against Hobby's limits ("Rate limits and data retention", https://docs.prefect.io/v3/concepts/
rate-limits: 250 requests a minute on the flow_runs, task_runs and flows endpoints, 500 logs a minute; a newer edition
of the page counts every orchestration call, concurrency leases included, against 625 a minute). Counted against the
strictest reading: every HTTP request the run makes, whatever its endpoint, against 250."""

from __future__ import annotations

import asyncio
import itertools
from urllib.parse import urlsplit

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.promote import promote_model
from flows.service_lock import RENEW_EVERY_S
from tests.support.api_count import counting_proxy
from tests.support.promotion import FAST

pytestmark = pytest.mark.prefect
HOBBY_REQUESTS_PER_MINUTE = 250
HOBBY_LOGS_PER_MINUTE = 500
_ids = itertools.count()


def _log_times(flow_run_ids) -> list[float]:
    async def read():
        async with get_client() as client:
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=flow_run_ids)))
        return sorted(log.timestamp.timestamp() for log in logs)

    return asyncio.run(read())


def _busiest_minute(times: list[float]) -> int:
    return max((sum(1 for t in times[i:] if t - start < 60) for i, start in enumerate(times)), default=0)


@pytest.mark.usefixtures("raised_quota")  # the re-promotion's candidate beside the serving revision
def test_a_promotion_and_a_watched_re_promotion_use_a_fraction_of_the_hobby_plans_rate(flow_env):
    service = f"budget-{next(_ids)}"
    api = urlsplit(PREFECT_API_URL.value())
    params = {"model": "sandbox/tiny-chat", "service": service, "token_secret_block": "sandbox-hf-token",
              "verify": FAST}  # fmt: skip
    with (
        counting_proxy(api.port) as proxy,
        temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{proxy.port}{api.path}"}),
    ):
        first = promote_model(**params, return_state=True)
        second = promote_model(**params, revision="dev", canary=[50], return_state=True)  # watched, under the lock
        APILogWorker.drain_all()  # the runs' last log batches, through the relay too
    assert [s.result().outcome for s in (first, second)] == ["promoted", "promoted"]
    busiest = proxy.busiest_minute()
    renewals = [r for r in proxy.requests if r.path.endswith("/renew")]
    logs = _busiest_minute(_log_times([s.state_details.flow_run_id for s in (first, second)]))
    figures = (f"{len(proxy.requests)} requests in all, {len(busiest)} in the busiest minute "
               f"({len(renewals)} lease renewals, one per {RENEW_EVERY_S:.0f} s or fence); {logs} logs in the busiest "
               "minute")  # fmt: skip
    print(figures)
    assert len(busiest) <= HOBBY_REQUESTS_PER_MINUTE / 2, figures
    assert logs <= HOBBY_LOGS_PER_MINUTE / 2, figures
    assert renewals, "the lock's renewals went through the relay: the count covers them"
