"""Secret hygiene and least privilege after a real promotion: the Hub token appears nowhere it should not."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from blocks import ServingProfile
from flows.promote import promote_model
from tasks import clients
from tasks.probe import VerifyOptions
from tasks.render import gcloud_command, service_yaml

pytestmark = pytest.mark.prefect
TOKEN = "hf_RecognizableHygieneToken7f3a9c2e51b8d4"
SERVICE = "hygiene-chat"


@pytest.fixture(scope="module")
def promoted(sandbox, flow_env):
    """A promotion of a gated model with a recognizable token, plus a failing one and a dry run."""
    sandbox.hub("POST", "/tokens", json={"token": TOKEN, "user": "hygiene-user"})
    sandbox.hub("POST", "/repos/sandbox/gated-chat/grants", json={"user": "hygiene-user"})
    Secret(value=TOKEN).save("hygiene-token", overwrite=True)
    since = sandbox.last_request_seq()
    params = {"model": "sandbox/gated-chat", "service": SERVICE, "token_secret_block": "hygiene-token",
              "verify": VerifyOptions(health_period_s=0.05)}  # fmt: skip
    state = promote_model(**params, return_state=True)
    report = state.result()
    dry = promote_model(**params, dry_run=True, return_state=True)
    sandbox.run("POST", "/faults", json={"service": SERVICE, "faults": {"completions_status": 500}})
    ServingProfile.preset("l4", max_instances=2).save("hygiene-l4-two", overwrite=True)  # a new revision
    failed = promote_model(**params, profile="hygiene-l4-two", return_state=True)
    return {"report": report, "states": [state, dry, failed], "since": since}


def _flow_logs_and_artifacts(states) -> tuple[list[str], list[str]]:
    APILogWorker.drain_all()

    async def read():
        async with get_client() as client:
            ids = [s.state_details.flow_run_id for s in states]
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
            artifacts = await client.read_artifacts()
        return [log.message for log in logs], [f"{a.data} {a.description}" for a in artifacts]

    return asyncio.run(read())


def test_the_token_is_nowhere_in_logs_artifacts_errors_or_requests(sandbox, flow_env, promoted, caplog):
    caplog.set_level(logging.DEBUG)
    logs, artifacts = _flow_logs_and_artifacts(promoted["states"])
    assert logs and artifacts
    assert not [line for line in logs if TOKEN in line]
    assert not [text for text in artifacts if TOKEN in text]
    failed = promoted["states"][2]
    assert (
        failed.is_failed()
        and TOKEN not in str(failed.message)
        and TOKEN not in repr(failed.result(raise_on_failure=False))
    )
    leaks = []
    for request in sandbox.requests(since=promoted["since"]):
        headers = dict(request["headers"])
        if request["server"] == "hub":
            headers.pop("authorization", None)  # the Hub is where the token belongs
        if TOKEN in json.dumps(headers) + (request["body"] or "") + request["query"] + request["path"]:
            leaks.append(f"{request['server']} {request['method']} {request['path']}")
    assert leaks == []
    assert any(
        r["headers"].get("authorization") == f"Bearer {TOKEN}" for r in sandbox.requests("hub", since=promoted["since"])
    )


def test_rendered_commands_and_the_running_service_hold_no_token(flow_env, promoted):
    service = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{SERVICE}")
    env_values = [e.value for c in service.template.containers for e in c.env]
    assert TOKEN not in json.dumps(env_values)
    rendered = gcloud_command(SERVICE, flow_env, service) + service_yaml(SERVICE, flow_env, service)
    assert TOKEN not in rendered and "HF_TOKEN" not in rendered


def test_iam_end_state_is_least_privilege(flow_env, promoted):
    member = f"serviceAccount:{flow_env.service_account_email}"
    bucket = clients.storage(flow_env).get_bucket(flow_env.bucket_name)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    assert {b["role"] for b in policy.bindings if member in b["members"]} == {"roles/storage.objectViewer"}
    assert not {m for b in policy.bindings for m in b["members"]} & {"allUsers", "allAuthenticatedUsers"}
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled
    service = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{SERVICE}")
    run_policy = clients.run_services(flow_env).get_iam_policy(request={"resource": service.name})
    assert not {m for b in run_policy.bindings for m in b.members} & {"allUsers", "allAuthenticatedUsers"}
    assert httpx.get(f"{service.uri}/health", timeout=10).status_code == 403  # private: no token, no answer
    revision = clients.run_revisions(flow_env).get_revision(name=service.latest_ready_revision)
    assert revision.service_account == flow_env.service_account_email  # never the Compute default account
