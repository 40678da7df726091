"""Secret hygiene and least privilege after a real promotion: the Hub token appears nowhere it should not."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import sys

import httpx
import pytest
import yaml
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from blocks import ServingProfile
from flows.promote import promote_model
from tasks.common import clients
from tasks.deploy.probe import VerifyOptions
from tasks.deploy.render import gcloud_command, service_yaml

pytestmark = pytest.mark.prefect
TOKEN = "hf_RecognizableHygieneToken7f3a9c2e51b8d4"
SERVICE = "hygiene-chat"


class _Recorder(logging.Handler):
    """Every log record of the process, formatted with its arguments and traceback: library loggers too."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _recording_logs_and_output():
    """Root logger at DEBUG with a recorder on it, and stdout/stderr into buffers (replayed after), for the promotions.
    (caplog and capfd are per test; the promotions run once per module, in the fixture below.)"""
    recorder, root = _Recorder(), logging.getLogger()
    level, out, err = root.level, io.StringIO(), io.StringIO()
    root.addHandler(recorder)
    root.setLevel(logging.DEBUG)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield recorder, out, err
    finally:
        root.setLevel(level)
        root.removeHandler(recorder)
        sys.stdout.write(out.getvalue())  # still shown by pytest for the fixture's setup
        sys.stderr.write(err.getvalue())


@pytest.fixture(scope="module")
def promoted(sandbox, flow_env):
    """A promotion of a gated model with a recognizable token, which the service also gets at run time (through
    Secret Manager), plus a failing one and a dry run."""
    with _recording_logs_and_output() as (recorder, out, err):
        result = _promote_three_ways(sandbox)
    return {**result, "log_lines": recorder.lines, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _promote_three_ways(sandbox) -> dict:
    sandbox.hub("POST", "/tokens", json={"token": TOKEN, "user": "hygiene-user"})
    sandbox.hub("POST", "/repos/sandbox/gated-chat/grants", json={"user": "hygiene-user"})
    Secret(value=TOKEN).save("hygiene-token", overwrite=True)
    since = sandbox.last_request_seq()
    ServingProfile.preset("l4", hf_token_at_runtime=True).save("hygiene-l4", overwrite=True)
    params = {"model": "sandbox/gated-chat", "service": SERVICE, "token_secret_block": "hygiene-token",
              "profile": "hygiene-l4", "verify": VerifyOptions(health_period_s=0.05)}  # fmt: skip
    state = promote_model(**params, return_state=True)
    report = state.result()
    dry = promote_model(**params, dry_run=True, return_state=True)
    sandbox.run("POST", "/faults", json={"service": SERVICE, "faults": {"completions_status": 500}})
    ServingProfile.preset("l4", hf_token_at_runtime=True, max_instances=2).save("hygiene-l4-two", overwrite=True)
    failed = promote_model(**{**params, "profile": "hygiene-l4-two"}, return_state=True)  # a new revision
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


def test_the_token_is_nowhere_in_logs_artifacts_errors_or_requests(sandbox, flow_env, promoted, caplog, capfd):
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
    # Every log record of the promotions (the flow runs' and the libraries': httpx, httpcore, urllib3, ...),
    # what they printed, and what this test logged or printed itself.
    lines = promoted["log_lines"]
    assert any(line.startswith("INFO prefect.flow_runs") for line in lines)  # the recorder saw the flow runs
    assert any(not line.split(" ", 2)[1].startswith("prefect") for line in lines)  # and library loggers
    assert not [line for line in lines if TOKEN in line]
    assert TOKEN not in promoted["stdout"] and TOKEN not in promoted["stderr"]
    captured = capfd.readouterr()
    assert TOKEN not in caplog.text and TOKEN not in captured.out and TOKEN not in captured.err
    leaks, encoded = [], base64.b64encode(TOKEN.encode()).decode()
    for request in sandbox.requests(since=promoted["since"]):
        headers = dict(request["headers"])
        if request["server"] == "hub":
            headers.pop("authorization", None)  # the Hub is where the token belongs
        text = json.dumps(headers) + (request["body"] or "") + request["query"] + request["path"]
        if TOKEN in text or encoded in text:
            leaks.append(f"{request['server']} {request['method']} {request['path']}")
    assert leaks == []  # Secret Manager's addVersion is recorded redacted: the only other place it belongs
    assert any(
        r["headers"].get("authorization") == f"Bearer {TOKEN}" for r in sandbox.requests("hub", since=promoted["since"])
    )


def test_rendered_commands_and_the_running_service_hold_no_token(flow_env, promoted):
    service = clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{SERVICE}")
    env = {e.name: e for c in service.template.containers for e in c.env}
    assert TOKEN not in json.dumps([e.value for e in env.values()])
    assert env["HF_TOKEN"].value == ""
    assert env["HF_TOKEN"].value_source.secret_key_ref.secret == flow_env.hf_token_secret
    command, document = gcloud_command(SERVICE, flow_env, service), service_yaml(SERVICE, flow_env, service)
    assert TOKEN not in command + document
    assert f"--set-secrets=HF_TOKEN={flow_env.hf_token_secret}:latest" in command  # a reference, never the value
    container = yaml.safe_load(document)["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": flow_env.hf_token_secret, "key": "latest"}}} in (
        container["env"]
    )


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
    manager = clients.secret_manager(flow_env)
    secrets = [s.name for s in manager.list_secrets(parent=f"projects/{flow_env.project}")]
    held = {
        name: [b.role for b in manager.get_iam_policy(request={"resource": name}).bindings if member in b.members]
        for name in secrets
    }
    # Secret Manager names secrets by project number: compare ids
    assert {name.rsplit("/", 1)[1]: roles for name, roles in held.items() if roles} == {
        flow_env.hf_token_secret: ["roles/secretmanager.secretAccessor"]
    }  # its one secret, and no other
