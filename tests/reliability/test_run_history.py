"""What a user reads in the Prefect UI about a run: a refusal's report lists every finding, Hub waits are logged."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from blocks import ServingProfile
from flows.promote import promote_model
from tasks.deploy.probe import VerifyOptions
from tests.support.artifacts import report_artifact
from tests.support.delivery import NO_WATCH

pytestmark = pytest.mark.prefect
_ids = itertools.count()


def _promote(**kwargs):
    """promote-model as a user starts it, on a service of its own; the final state, not an exception."""
    params = {
        "model": "sandbox/tiny-chat",
        "service": f"rh-{next(_ids)}",
        "token_secret_block": "sandbox-hf-token",
        "verify": VerifyOptions(health_period_s=0.05),
        "watch": NO_WATCH,
        **kwargs,
    }
    return params["service"], promote_model(**params, return_state=True)


def _logs(flow_run_id) -> list[tuple[int, str]]:
    APILogWorker.drain_all()  # logs reach the API in batches

    async def read():
        async with get_client() as client:
            return await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))

    return [(log.level, log.message) for log in asyncio.run(read())]


@pytest.mark.usefixtures("raised_quota")  # the report's history is tested; its max_instances fix names the GPU bound
def test_a_preflight_refusal_reports_every_finding_with_its_fix(sb, flow_env):
    ServingProfile.preset("l4", max_instances=5, concurrency=8).save("rh-two-problems", overwrite=True)
    service, state = _promote(profile="rh-two-problems")
    assert state.is_failed()
    report = report_artifact(service)
    assert "NOT promoted" in report
    assert "preflight found 2 problems to fix first: " in report
    for setting, fix in [
        ("max_instances", "set max_instances to 3 or fewer"),
        ("concurrency", "leave concurrency empty for twice max_num_seqs"),
    ]:
        item = next((line for line in report.splitlines() if line.startswith(f"- error: `{setting}`")), "")
        assert fix in item, f"the report does not list {setting} with its fix:\n{report}"


def test_a_hub_rate_limit_wait_is_logged_in_the_run(sb, flow_env):
    sb.add_fault("hub", path="^/api/models/", status=429, retry_after="1", times=1)
    _, state = _promote(dry_run=True)  # the revision lookup is the first Hub call, before anything is staged
    assert state.is_completed(), state.message
    waits = [(level, m) for level, m in _logs(state.state_details.flow_run_id) if "rate limited by the Hub" in m]
    assert waits, "the Hub's 429 wait is not in the run's logs"
    assert any(level >= 20 and "waiting 1 s, attempt 2 of" in m for level, m in waits), waits


def test_a_hub_rate_limit_wait_while_downloading_is_logged_in_the_run(sb, flow_env):
    # The shards download on staging's worker threads: their waits must reach the run's logs too.
    repo_id = f"runhistory/rate-limited-{next(_ids)}"
    spec = {"weight_bytes": 200_000, "shards": 1, "include_bin_duplicate": False, "include_original": False}
    sb.hub("POST", "/repos", json={"repo_id": repo_id, **spec})
    sb.add_fault("hub", path=rf"^/{repo_id}/resolve/.*\.safetensors$", status=429, retry_after="1", times=1)
    _, state = _promote(model=repo_id)
    assert state.is_completed(), state.message
    waits = [(level, m) for level, m in _logs(state.state_details.flow_run_id) if "rate limited by the Hub" in m]
    assert any(level >= 20 and "(downloading " in m for level, m in waits), waits
