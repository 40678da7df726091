"""The liveness probe with the REAL engine (issue 35; after test_promotion.py, whose first promotion stages the
weights afresh): EngineCore is killed, the API server keeps answering with
/health at 503, Cloud Run's liveness probe fails and the instance is restarted; the service answers again.

vLLM's API server shuts itself down within 5 s of its engine's death (launcher.py's watchdog; the calibration tier
shows the exit) unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``, and a server that stays up over a dead engine is what
vllm-project/vllm#39863 reports. This service sets that variable, so only the liveness probe can restart it. The
probe runs on the wall clock with the product's figures (10 s period, 5 s timeout, 3 misses), as on Cloud Run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from blocks.profile import ServingProfile
from flows.promote import promote_model
from flows.teardown import teardown
from tasks.deploy.probe import VerifyOptions
from tests.support.engine import engine_core_pid, engine_ports, listening_pid, revision_log
from tests.support.identity import bearer
from tests.support.locks import wait_until

pytestmark = [pytest.mark.prefect, pytest.mark.timeout(1200)]
SPEC = str(Path(__file__).resolve().parents[2] / "deployments" / "sandbox" / "tiny-llama.yaml")
MODEL = "sandbox/tiny-llama"
SERVICE = "tiny-llama-liveness"
LIVENESS_LINE = 'LIVENESS HTTP probe failed 3 times consecutively for container "vllm" on port 8080 path "/health".'
RESTART_S = 600  # three probe periods, then a real engine start (about 35 s idle) on a busy host


def instance_of(sb, revision: str) -> dict:
    return next(i for i in sb.run("GET", "/instances") if i["revision"].endswith(f"/revisions/{revision}"))


def test_a_killed_engine_core_fails_the_liveness_probe_and_the_instance_restarts(sb, flow_env):
    ServingProfile.preset("cpu", env={**ServingProfile.preset("cpu").env, "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}).save(
        "engine-cpu-keep-alive", overwrite=True
    )
    report = promote_model(
        spec_file=SPEC, service=SERVICE, profile="engine-cpu-keep-alive", verify=VerifyOptions(health_period_s=0.5)
    )
    assert report.outcome == "promoted", report.reason
    revision, url = report.serving_revision, report.service_url
    first = instance_of(sb, revision)
    api_server = listening_pid(engine_ports(sb, revision)[-1])
    assert api_server is not None
    core = engine_core_pid(api_server)
    assert core is not None, f"no EngineCore child under the API server (pid {api_server})"

    os.kill(core, signal.SIGKILL)  # what an OOM kill or a CUDA fault does to it
    health: list[int] = []
    deadline = time.monotonic() + 120
    while not health or health[-1] == 200:  # the API server notices its engine's death within a second
        assert time.monotonic() < deadline, health
        health.append(httpx.get(f"{first['url']}/health", timeout=30).status_code)
    assert health[-1] == 503, health
    dead = httpx.post(
        f"{url}/v1/chat/completions", headers=bearer(url), timeout=300,
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
    )  # fmt: skip
    assert dead.status_code == 500 and "EngineCore encountered an issue" in dead.text, dead.text

    def restarted() -> bool:
        now = instance_of(sb, revision)
        return now["restarts"] == 1 and now["running"] and (now["ready_at"] or 0) > first["ready_at"]

    wait_until(restarted, RESTART_S, "the liveness probe to restart the instance")
    answer = httpx.post(
        f"{url}/v1/chat/completions", headers=bearer(url), timeout=300,
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["system_fingerprint"].startswith("vllm-0.32.0-")

    log = revision_log(sb, revision)
    assert log.count(LIVENESS_LINE) == 1, log[-3000:]
    before, after = log.split(LIVENESS_LINE)
    assert "[shutdown] MPClient: engine core exited unexpectedly" in before
    assert before.count('"GET /health HTTP/1.1" 503') >= 3
    assert len(engine_ports(sb, revision)) == 2  # a second real engine start, after the shutdown
    assert '"GET /health HTTP/1.1" 200' in after
    teardown(service=SERVICE, target="sandbox")
