"""The deployment path users take: a Prefect server, `prefect deploy --all`, `prefect deployment run`, a worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from blocks import ServingProfile
from flows.service_lock import LOCK_LEASE_S
from tasks.common import clients
from tasks.weights.staging import MANIFEST, commit_prefix
from tests.support.locks import lock_slots
from tests.support.prefect_server import prefect_server, run_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
SANDBOX_FILE = "sandbox/prefect.yaml"


@pytest.fixture(scope="module")
def server(sandbox, tmp_path_factory) -> Iterator[dict[str, str]]:
    """A real `prefect server start` with its own database, the sandbox's blocks, and the sandbox's example
    deployed the way the demo and the tests do (sandbox/prefect.yaml; a real project deploys prefect.yaml)."""
    home = tmp_path_factory.mktemp("prefect-home")
    # Expired concurrency leases are looked for every 2 s, not 15: the killed-run test waits for the lease.
    with prefect_server(home, HF_ENDPOINT=sandbox.hub_url, PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS="2") as env:
        run_command([sys.executable, "-m", "sandbox", "blocks", sandbox.info["state_dir"]], env)
        deployed = run_command([sys.executable, "-m", "flows.bootstrap", "deploy", "--prefect-file", SANDBOX_FILE], env)
        # The schedules come paused from the file and are resumed: their target block ("sandbox") exists.
        assert "tiny-chat-hours: 3 schedules active" in deployed.stdout, deployed.stdout
        yield env


def run_deployment(env: dict[str, str], name: str, *params: str) -> None:
    args = [PREFECT, "deployment", "run", name]
    for param in params:
        args += ["-p", param]
    subprocess.run(args, env=env, cwd=ROOT, check=True, capture_output=True)
    worker = subprocess.run([PREFECT, "worker", "start", "--pool", "hf-pipeline", "--run-once"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]


def client(env: dict[str, str]) -> SyncPrefectClient:
    return SyncPrefectClient(api=env["PREFECT_API_URL"])


def test_promote_model_runs_from_its_deployment_and_reports(server, sandbox, sandbox_target):
    run_deployment(server, "promote-model/tiny-chat", 'verify={"health_period_s": 0.1}')
    with client(server) as api:
        deployment = api.read_deployment_by_name("promote-model/tiny-chat")
        runs = [r for r in api.read_flow_runs() if r.deployment_id == deployment.id]
        assert [r.state_name for r in runs] == ["Completed"]
        report = api.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["promotion-tiny-chat"])))
    assert report and "tiny-chat: promoted" in report[0].data and "| verify |" in report[0].data
    text = report[0].data
    # The figures a user reads there, each against where it comes from: the Hub, the bucket, Cloud Run, the
    # profile's price and the model file's schedule.
    commit = sandbox.hub("GET", "/repos/sandbox/tiny-chat", params={"revision": "main"})["sha"]
    assert "# sandbox/tiny-chat@main on tiny-chat: promoted" in text
    assert f"| commit | `{commit}` |" in text
    prefix = commit_prefix(sandbox_target, "sandbox/tiny-chat", commit)
    assert f"| weights | gs://{sandbox_target.bucket_name}/{prefix} |" in text
    bucket = clients.storage(sandbox_target).bucket(sandbox_target.bucket_name)
    manifest = json.loads(bucket.blob(f"{prefix}/{MANIFEST}").download_as_bytes())
    staged = re.search(r"\| staged \| (\d+) files / ([\d.]+) MB uploaded, (\d+) files / ([\d.]+) MB already", text)
    assert staged, text
    uploaded, uploaded_mb, skipped, skipped_mb = int(staged[1]), float(staged[2]), int(staged[3]), float(staged[4])
    assert uploaded + skipped == len(manifest["files"]) > 0
    assert uploaded_mb + skipped_mb == pytest.approx(manifest["total_bytes"] / 1e6, abs=0.11)
    assert manifest["total_bytes"] > 4_000_000  # the ~4 MiB of weights
    l4 = ServingProfile.preset("l4")
    assert f"| image | `{l4.image}` (prebuilt, reused) |" in text
    service = clients.run_services(sandbox_target).get_service(
        name=f"{sandbox_target.location_path}/services/tiny-chat"
    )
    revision = service.traffic_statuses[0].revision
    assert revision.startswith(f"tiny-chat-{commit[:7]}-")
    assert f"| serving revision | {revision} (previous: -) |" in text
    assert f"| traffic now | {revision} 100 % |" in text
    assert f"| service URL | {service.uri} |" in text
    verified = (
        r"\| verification \| healthy after \d+\.\d s, serves sandbox/tiny-chat, reply '.+' \(\d+ tokens\), "
        r"from `vllm-0\.33\.0-[0-9a-f]{8}` \|"
    )
    assert re.search(verified, text), text
    steps = re.findall(r"^\| ([a-z ]+) \| (\d+\.\d\d) \| (yes|FAILED) \|$", text, re.MULTILINE)
    assert [name for name, _, _ in steps] == ["preflight", "resolve", "check service", "room", "infrastructure",
                                              "stage", "image", "render", "deploy candidate", "verify",
                                              "quality gate", "promote", "invokers"]  # fmt: skip
    # The model file's quality set, answered by the candidate alone (a first deploy: the floor only).
    assert "**quality gate passed: candidate " in text and "scored 1.00 (4/4); no serving revision answered" in text
    # A first deploy is not watched (nothing to go back to), and the report says so instead of a watch not judged.
    assert "| watch 100 % |" not in text and "| note | watch skipped: a first deploy" in text
    assert {ok for _, _, ok in steps} == {"yes"}
    assert float({name: s for name, s, _ in steps}["verify"]) > 0  # the probe took time
    # deployments/tiny-chat.yaml keeps one instance warm 08:00-19:00 Mon-Fri: 55 h a week (tasks/report/prices.py).
    hourly = l4.hourly_usd
    month = 365.25 / 12 / 7
    assert (
        f"| cost | ${hourly:.2f}/h per instance (L4 $0.67 + 8 vCPU $0.52 + 32 GiB $0.23); ${hourly * 55:,.0f}/week, "
        f"${hourly * 55 * month:,.0f}/month at 55 warm h/week (its schedule) vs ${hourly * 168 * month:,.0f}/month "
        "always on |"
    ) in text
    also = re.search(r"^\| cost, also \| (.+) \|$", text, re.MULTILINE)
    assert also and "weights " in also[1] and "flow job " in also[1], text
    assert "second instance" not in also[1]  # a first deploy: nothing served beside the candidate


def test_schedules_are_stored_with_cron_time_zone_and_parameters(server):
    with client(server) as api:
        deployment = api.read_deployment_by_name("scale-service/tiny-chat-hours")
    schedules = {s.slug: s for s in deployment.schedules}
    assert all(s.active for s in schedules.values())
    assert set(schedules) == {"tiny-chat-scale-up", "tiny-chat-scale-down-evening", "tiny-chat-scale-down-off-days"}
    up = schedules["tiny-chat-scale-up"]
    assert (up.schedule.cron, up.schedule.timezone, up.parameters) == (
        "0 8 * * 1-5",
        "Europe/Berlin",
        {"min_instances": 1, "warm_until": "19:00", "timezone": "Europe/Berlin"},  # a late run starts no GPU at night
    )
    assert schedules["tiny-chat-scale-down-evening"].parameters == {"min_instances": 0}


def test_the_scale_deployment_changes_min_instances(server, sandbox_target):
    run_deployment(server, "promote-model/tiny-chat", 'verify={"health_period_s": 0.1}')
    run_deployment(server, "scale-service/tiny-chat-hours", "min_instances=1")
    service = clients.run_services(sandbox_target).get_service(
        name=f"{sandbox_target.location_path}/services/tiny-chat"
    )
    assert service.scaling.min_instance_count == 1


def test_a_promotion_killed_holding_the_service_lock_does_not_block_the_next_run(server, sandbox_target, tmp_path):
    """A worker that dies mid-promotion (OOM-killed, node preempted) holds the per-service lock; nobody frees it,
    but its lease is renewed only while the run lives, so the server takes the slot back within LOCK_LEASE_S and
    the next run of the deployment goes ahead."""
    params = {"spec_file": "deployments/sandbox/tiny-chat.yaml", "verify": {"health_period_s": 0.05}}
    log = tmp_path / "child.log"
    with log.open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.promote_in_subprocess", json.dumps(params)],
            cwd=ROOT, env=server, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, text=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "ready" not in log.read_text():
            assert child.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        child.stdin.write("go\n")
        child.stdin.flush()
        while lock_slots(sandbox_target, "tiny-chat", client(server)) != 1:
            assert child.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdin.close()
    killed_at = time.monotonic()
    assert lock_slots(sandbox_target, "tiny-chat", client(server)) == 1  # the dead run still holds it
    run_deployment(server, "promote-model/tiny-chat", 'verify={"health_period_s": 0.1}')
    waited = time.monotonic() - killed_at
    with client(server) as api:
        deployment = api.read_deployment_by_name("promote-model/tiny-chat")
        runs = sorted((r for r in api.read_flow_runs() if r.deployment_id == deployment.id), key=lambda r: r.created)
    assert runs[-1].state_name == "Completed", runs[-1].state.message
    assert lock_slots(sandbox_target, "tiny-chat", client(server)) == 0
    print(f"the next run finished {waited:.0f} s after the kill (lease {LOCK_LEASE_S} s)")
