"""Who controls the model schedules, the way an operator meets it: a real `prefect server start`, `python -m
flows.bootstrap deploy`, a habitual `prefect deploy --all`, `prefect deployment schedule pause`, and `python -m
flows.doctor`. The schedules are the sandbox example's (sandbox/prefect.yaml, scale-service/tiny-chat-hours)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import SyncPrefectClient
from prefect.exceptions import ObjectNotFound

from flows.schedule_control import HELD_VARIABLE
from tests.support.prefect_server import prefect_server, run_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
SANDBOX_FILE = "sandbox/prefect.yaml"
HOURS = "scale-service/tiny-chat-hours"
UP, EVENING, OFF_DAYS = "tiny-chat-scale-up", "tiny-chat-scale-down-evening", "tiny-chat-scale-down-off-days"


@pytest.fixture(scope="module")
def server(sandbox, tmp_path_factory) -> Iterator[dict[str, str]]:
    """A real Prefect server of the module's own, with the sandbox's work pool (bootstrap makes it on first deploy)."""
    with prefect_server(tmp_path_factory.mktemp("prefect-home"), HF_ENDPOINT=sandbox.hub_url) as env:
        yield env


def api(env: dict[str, str]) -> SyncPrefectClient:
    return SyncPrefectClient(api=env["PREFECT_API_URL"])


def save_blocks(env: dict[str, str], sandbox) -> None:
    """The sandbox's blocks, its GcpTarget 'sandbox' (the tiny-chat-hours schedules' target) among them."""
    run_command([sys.executable, "-m", "sandbox", "blocks", sandbox.info["state_dir"]], env)


def delete_target(env: dict[str, str]) -> None:
    with api(env) as client:
        try:
            block = client.read_block_document_by_name("sandbox", block_type_slug="gcp-target")
        except ObjectNotFound:
            return
        client.delete_block_document(block.id)


def bootstrap_deploy(env: dict[str, str], prefect_file: str = SANDBOX_FILE) -> str:
    return run_command([sys.executable, "-m", "flows.bootstrap", "deploy", "--prefect-file", prefect_file], env).stdout


def prefect_deploy(env: dict[str, str], prefect_file: str = SANDBOX_FILE) -> None:
    """What an operator types out of habit, bypassing bootstrap."""
    run_command([PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", prefect_file], env)


def states(env: dict[str, str]) -> dict[str, bool]:
    with api(env) as client:
        return {s.slug: s.active for s in client.read_deployment_by_name(HOURS).schedules}


def pause(env: dict[str, str], slug: str) -> None:
    """The operator pauses one schedule with Prefect's own CLI."""
    with api(env) as client:
        [schedule] = [s for s in client.read_deployment_by_name(HOURS).schedules if s.slug == slug]
    run_command([PREFECT, "deployment", "schedule", "pause", HOURS, str(schedule.id)], env)


def fresh(env: dict[str, str], sandbox) -> None:
    """Every test starts from its own state: the blocks saved, the hours deployment deployed anew by bootstrap."""
    save_blocks(env, sandbox)
    with api(env) as client:
        for name in (HOURS, "scale-service/tiny-llama-hours"):
            with contextlib.suppress(ObjectNotFound):
                client.delete_deployment(client.read_deployment_by_name(name).id)
    bootstrap_deploy(env)


def test_an_operators_pause_survives_bootstrap_deploy_and_prefect_deploy(server, sandbox):
    fresh(server, sandbox)
    assert states(server) == {UP: True, EVENING: True, OFF_DAYS: True}
    pause(server, EVENING)

    deployed = bootstrap_deploy(server)
    assert states(server) == {UP: True, EVENING: False, OFF_DAYS: True}
    assert f"{EVENING} paused by the operator, kept" in deployed, deployed
    assert f"prefect deployment schedule resume {HOURS} ID" in deployed  # how to undo it, in the same line

    # The habitual `prefect deploy --all` changes no state either: the file's schedules carry no `active:`.
    prefect_deploy(server)
    assert states(server) == {UP: True, EVENING: False, OFF_DAYS: True}
    with api(server) as client:
        up = next(s for s in client.read_deployment_by_name(HOURS).schedules if s.slug == UP)
    assert up.parameters == {"min_instances": 1, "warm_until": "19:00", "timezone": "Europe/Berlin"}


def test_schedules_wait_for_their_target_and_run_once_it_exists(server, sandbox):
    fresh(server, sandbox)
    delete_target(server)
    deployed = bootstrap_deploy(server)
    assert states(server) == {UP: False, EVENING: False, OFF_DAYS: False}  # their runs could only fail
    assert "tiny-chat-hours: " in deployed and "paused: no GcpTarget block 'sandbox'" in deployed, deployed
    prefect_deploy(server)  # a deploy in between keeps them as they are
    assert states(server) == {UP: False, EVENING: False, OFF_DAYS: False}

    save_blocks(server, sandbox)
    deployed = bootstrap_deploy(server)
    assert "tiny-chat-hours: 3 schedules active" in deployed, deployed
    assert states(server) == {UP: True, EVENING: True, OFF_DAYS: True}


def test_schedules_a_prefect_file_paused_are_resumed_when_their_target_exists(server, sandbox, tmp_path):
    fresh(server, sandbox)
    # The prefect files this project generated before wrote every schedule `active: false`.
    legacy = tmp_path / "prefect.yaml"
    text = (ROOT / SANDBOX_FILE).read_text()
    legacy.write_text(re.sub(r"(\n( +)slug: .+)", r"\1\n\2active: false", text))
    with api(server) as client:
        client.delete_deployment(client.read_deployment_by_name(HOURS).id)

    bootstrap_deploy(server, str(legacy))  # new schedules, created paused by the file; their target exists
    assert states(server) == {UP: True, EVENING: True, OFF_DAYS: True}

    # A server that an older bootstrap kept, after a `prefect deploy --all` of that file paused everything (the 19:00
    # scale-down after the 08:00 scale-up had run): bootstrap, finding no record of its own, resumes them once.
    prefect_deploy(server, str(legacy))
    assert states(server) == {UP: False, EVENING: False, OFF_DAYS: False}
    with api(server) as client:
        client.delete_variable_by_name(HELD_VARIABLE)
    bootstrap_deploy(server)
    assert states(server) == {UP: True, EVENING: True, OFF_DAYS: True}


def test_doctor_lists_each_schedule_and_warns_when_a_warm_up_runs_with_its_scale_down_paused(server, sandbox):
    fresh(server, sandbox)
    pause(server, EVENING)
    with api(server) as client:
        evening = next(s for s in client.read_deployment_by_name(HOURS).schedules if s.slug == EVENING)
    command = [sys.executable, "-m", "flows.doctor", "--target", "sandbox", "--models", "deployments/sandbox"]
    # Its exit code is the project checks' (the sandbox's own state); the schedules rows are warnings at most.
    done = subprocess.run(command, env=server, cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    rows = {m[2]: (m[1], m[3]) for m in re.finditer(r"^(OK|WARN|FAIL) +schedules (tiny-\w+) +(.+)$", output, re.M)}
    assert set(rows) == {"tiny-chat", "tiny-llama"}, output

    # Every schedule with its state, and the next run of each active one (Monday to Friday 08:00 up, weekends down).
    status, line = rows["tiny-llama"]
    assert status == "OK" and re.search(
        r"up active next (Mon|Tue|Wed|Thu|Fri) 08:00 \| down-evening active next (Mon|Tue|Wed|Thu|Fri) 19:00 \| "
        r"down-off-days active next (Sat|Sun) 08:00", line), line  # fmt: skip
    status, line = rows["tiny-chat"]
    assert status == "WARN" and re.search(
        r"up active next (Mon|Tue|Wed|Thu|Fri) 08:00 \| down-evening PAUSED \| down-off-days active next (Sat|Sun) "
        r"08:00: WARM AFTER HOURS \$\d+\.\d\d/h$", line), line  # fmt: skip
    # The fix resumes the paused scale-down, by the id Prefect's CLI takes.
    assert f"prefect deployment schedule resume {HOURS} {evening.id}" in output, output
