"""A new user's first promotion, command by command as docs/using.md ("Your first promotion") gives them.

The commands are read from that page, so the test and the text cannot drift apart. They run as written against
a real `prefect server` and the sandbox, with three substitutions a reader makes for their own setup: the
sandbox's project and region for acme-ml-prod/us-central1, `--endpoints` (the sandbox's API addresses, as
Private Service Connect would give), and `--run-once` on the worker so the test ends. Credentials are
Application Default Credentials from the sandbox's metadata server, the Hub is the sandbox's (HF_ENDPOINT), and
google/gemma-4-E2B-it is a small gated stand-in published there.
"""

from __future__ import annotations

import json
import re
import shlex
import sys

import pytest
import yaml
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from tasks.common import clients
from tasks.deploy.cloudrun import service_id_for
from tests.support.prefect_server import PREFECT, ROOT, prefect_server, run_command

# A fresh Prefect server, a worker and a whole promotion: on a loaded 2-core machine this took 330 s, past the
# suite's 300 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

USING = ROOT / "docs" / "using.md"
MARKER = "<!-- walkthrough: tests/e2e/test_walkthrough.py runs these commands as written, against the sandbox -->"
MODEL = "google/gemma-4-E2B-it"


def walkthrough_commands() -> list[list[str]]:
    """The shell commands of the bash block that follows the walkthrough marker in docs/using.md, without comments."""
    text = USING.read_text()
    assert text.count(MARKER) == 1, f"{USING}: the walkthrough marker is gone or doubled"
    block = re.match(r"\s*```bash\n(.*?)```", text.split(MARKER, 1)[1], flags=re.DOTALL)
    assert block, f"{USING}: no bash block right after the walkthrough marker"
    return [shlex.split(line, comments=True) for line in block[1].splitlines() if line.strip()]


@pytest.fixture
def gemma(sandbox):
    """A gated google/gemma-4-E2B-it on the sandbox Hub whose licence the token's user has accepted."""
    repo = {"repo_id": MODEL, "gated": "manual", "replace": True, "weight_bytes": 2 * 1024 * 1024, "shards": 2,
            "include_original": False}  # fmt: skip
    sandbox.hub("POST", "/repos", json=repo)
    sandbox.hub("POST", f"/repos/{MODEL}/grants", json={"token": sandbox.hub_token})
    yield MODEL
    sandbox.hub("DELETE", f"/repos/{MODEL}")


SET_TARGET_TIMING = """
import json, sys
from blocks import GcpTarget
target = GcpTarget.load("production")
for key, value in json.loads(sys.argv[1]).items():
    setattr(target, key, value)
target.save("production", overwrite=True)
"""


def test_the_walkthrough_promotes_a_model_on_a_fresh_prefect_server(sandbox, sandbox_target, gemma, tmp_path):
    target = sandbox.info["target"]
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(target["endpoints"]))
    commands = walkthrough_commands()
    assert [c[:3] for c in commands] == [
        ["pip", "install", "-e"],
        ["prefect", "server", "start"],
        ["export", "HF_TOKEN=hf_..."],
        ["python", "-m", "flows.bootstrap"],
        ["prefect", "deployment", "run"],
        ["prefect", "worker", "start"],
    ], "docs/using.md's walkthrough changed: teach this test the new command"
    # `pip install -e .` is this test's own environment; `prefect server start` is the fixture below.
    with prefect_server(tmp_path, HF_ENDPOINT=sandbox.hub_url) as env:
        env["HF_TOKEN"] = sandbox.hub_token  # export HF_TOKEN=...
        bootstrap = [sys.executable, *commands[3][1:], "--endpoints", str(endpoints)]
        bootstrap = [{"acme-ml-prod": target["project"], "us-central1": target["region"]}.get(a, a) for a in bootstrap]
        first = run_command(bootstrap, env).stdout
        assert "GcpTarget 'production' (sandbox-project/us-central1): created" in first, first
        assert "Secret 'hf-token' (from HF_TOKEN): created" in first and sandbox.hub_token not in first
        assert "work pool 'hf-pipeline' (process): created" in first
        assert "prefect deployment run promote-model/promote" in first  # the next command
        # Idempotent: the second run changes nothing it made.
        again = run_command(bootstrap, env).stdout
        assert again.count(": unchanged") == 4, again  # credentials, target, token, pool

        # The sandbox's Cloud Monitoring samples every 0.6 s, not every 60 s: its target says so (as sandbox.json's
        # does), or the watch after the promotion would wait out Google's 10-minute default on the sandbox clock.
        timing = {key: target[key] for key in ("metrics_sample_seconds", "metrics_delay_seconds")}
        run_command([sys.executable, "-c", SET_TARGET_TIMING, json.dumps(timing)], env)
        run_command([PREFECT, *commands[4][1:]], env)
        worker = run_command([PREFECT, *commands[5][1:], "--run-once"], env, timeout=600)
        assert "Completed" in worker.stdout + worker.stderr

        service_id = service_id_for(gemma)
        with SyncPrefectClient(api=env["PREFECT_API_URL"]) as api:
            deployment = api.read_deployment_by_name("promote-model/promote")
            [run] = [r for r in api.read_flow_runs() if r.deployment_id == deployment.id]
            assert run.state_name == "Completed", run.state.message
            [report] = api.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"promotion-{service_id}"]))
            )
            deployments = api.read_deployments()
            blocks = {b.name for b in api.read_block_documents() if b.block_type and b.block_type.slug == "gcp-target"}

    assert f"# {gemma}@main on {service_id}: promoted" in report.data
    service = clients.run_services(sandbox_target).get_service(
        name=f"{sandbox_target.location_path}/services/{service_id}"
    )
    [serving] = [t for t in service.traffic_statuses if t.percent]
    assert serving.percent == 100 and f"| traffic now | {serving.revision} 100 % |" in report.data
    # Every schedule that can fire names a GcpTarget block that exists; the sandbox's example is not deployed.
    names = {d.name for d in deployments}
    assert "tiny-chat" not in names and "tiny-chat-hours" not in names, names
    real = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    assert names == {d["name"] for d in real}
    active = [(d.name, d.parameters.get("target")) for d in deployments for s in d.schedules if s.active]
    assert active and all(target_name in blocks for _, target_name in active), (active, blocks)
