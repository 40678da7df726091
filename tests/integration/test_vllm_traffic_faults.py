"""vLLM stand-in faults that only real traffic meets: a revision with them passes the pipeline's probes
(tasks/deploy/probe.py) and then fails long prompts, every Nth request, or slows down under load.

Each test launches the stand-in directly as a process (the Cloud Run stand-in's env contract, see
test_vllm_standin.py) and talks to it over loopback HTTP with httpx.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from pydantic import SecretStr

from tasks.deploy.probe import VerifyOptions, verify
from tests.support import vllm_standin as standin
from tests.support.vllm_standin import MODEL_PATH, Launcher, chat, serve

# The stand-in launcher and a model root at /models/tiny (tests/support/vllm_standin.py).
launch = standin.launch
root = standin.root

GENERATION_ERROR = {
    "error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
}
# The probe's prompt is about 21 tokens with the chat template; this one is well over 200.
LONG_PROMPT = " ".join(["Summarize the following report about serving latency and cache pressure."] * 30)


def test_long_prompts_fail_while_the_probe_chat_succeeds(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root, faults={"fail_prompts_longer_than": 200})
    inst.wait_ready()

    short = chat(inst.url, MODEL_PATH, VerifyOptions().prompt, max_tokens=16, temperature=0)
    assert short.status_code == 200, short.text
    assert short.json()["usage"]["prompt_tokens"] <= 200

    long_chat = chat(inst.url, MODEL_PATH, LONG_PROMPT, max_tokens=16)
    assert long_chat.status_code == 500
    assert long_chat.headers["content-type"] == "application/json"
    assert long_chat.json() == GENERATION_ERROR

    long_completion = httpx.post(
        f"{inst.url}/v1/completions", json={"model": MODEL_PATH, "prompt": LONG_PROMPT, "max_tokens": 4}, timeout=10
    )
    assert (long_completion.status_code, long_completion.json()) == (500, GENERATION_ERROR)

    # Streaming: HTTP 200 is already sent when the engine fails the request, so the error arrives as an event.
    body = {"model": MODEL_PATH, "messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    with httpx.stream("POST", f"{inst.url}/v1/chat/completions", json=body, timeout=10) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200
    assert [json.loads(events[0]), events[1:]] == [GENERATION_ERROR, ["[DONE]"]]

    error_line = inst.wait_line("failed with an internal error during generation")
    assert " ERROR " in error_line and "Request chatcmpl-" in error_line
    assert "fail_prompts_longer_than=200" in inst.wait_line("KV cache blocks cannot be allocated")
    # The instance keeps serving short prompts: the fault fails requests, not the engine.
    assert httpx.get(f"{inst.url}/health").status_code == 200
    assert chat(inst.url, MODEL_PATH, "Hi", max_tokens=4).status_code == 200


def test_every_third_request_fails(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root, faults={"fail_every_nth_request": 3})
    inst.wait_ready()
    statuses = []
    for i in range(1, 10):
        # Chat and completions share one count: it is the engine's, not the route's.
        if i % 2:
            response = chat(inst.url, MODEL_PATH, f"Question {i}", max_tokens=4)
        else:
            response = httpx.post(
                f"{inst.url}/v1/completions", json={"model": MODEL_PATH, "prompt": f"Q{i}", "max_tokens": 4}
            )
        statuses.append(response.status_code)
        if response.status_code == 500:
            assert response.json() == GENERATION_ERROR
    failed = [i for i, status in enumerate(statuses, start=1) if status != 200]
    assert failed == [3, 6, 9], statuses
    # A request refused by validation never reaches the engine, so it does not advance the count.
    assert chat(inst.url, "some/other-model").status_code == 404
    assert [chat(inst.url, MODEL_PATH, "Again", max_tokens=2).status_code for _ in range(3)] == [200, 200, 500]


def test_latency_grows_with_requests_in_flight(launch: Launcher, root: Path) -> None:
    # 50 simulated seconds per request in flight at 1 ms per simulated second: 50 ms real per request in flight.
    per_request_s = 0.05
    inst = launch(serve(), root=root, faults={"latency_ms_per_inflight": per_request_s * 1000 / standin.TIME_SCALE})
    inst.wait_ready()
    body = {"model": MODEL_PATH, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}

    def timed(client: httpx.Client) -> float:
        started = time.monotonic()
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return time.monotonic() - started

    with httpx.Client(base_url=inst.url, timeout=30, limits=httpx.Limits(max_connections=16)) as client:
        timed(client)  # a warm connection, so the single request measures the server and not the handshake
        alone = timed(client)
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda _: timed(client), range(8)))
    # Alone it waits one share; eight together wait about eight shares each. Half of the expected 7 extra
    # shares is the margin: scheduling noise on a busy machine cannot make up the rest.
    extra = statistics.median(together) - alone
    assert extra > 0.5 * 7 * per_request_s, (alone, sorted(together))


def test_probes_pass_a_revision_that_fails_real_traffic(launch: Launcher, root: Path) -> None:
    faults = {"fail_prompts_longer_than": 200, "fail_every_nth_request": 2}
    inst = launch(serve(MODEL_PATH, "--api-key", "probe-key"), root=root, faults=faults)
    inst.wait_ready()

    # The pipeline's own verification: /health, /v1/models, one chat completion (request 1).
    result = verify(inst.url, SecretStr("probe-key"), MODEL_PATH, VerifyOptions(health_period_s=0.1))
    assert result.reply and result.usage["completion_tokens"] > 0

    # Real traffic afterwards: even-numbered requests fail, and so does request 5 for its long prompt alone.
    headers = {"Authorization": "Bearer probe-key"}
    traffic = [chat_with(inst.url, headers, content) for content in ("Hi", "Hi", "Hi", LONG_PROMPT)]
    assert [r.status_code for r in traffic] == [500, 200, 500, 500]
    assert all(r.json() == GENERATION_ERROR for r in traffic if r.status_code == 500)


def chat_with(url: str, headers: dict[str, str], content: str) -> httpx.Response:
    """A one-message chat completion with auth headers."""
    body = {"model": MODEL_PATH, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10)


def test_a_misspelt_or_senseless_traffic_fault_stops_the_instance(launch: Launcher, root: Path) -> None:
    for faults, message in (
        ({"fail_every_nth": 2}, "SANDBOX_VLLM_FAULTS has unknown keys: ['fail_every_nth']"),
        ({"fail_every_nth_request": 0}, "fail_every_nth_request must be a positive integer, got 0"),
    ):
        inst = launch(serve(), root=root, faults=faults)
        assert inst.wait_exit() == 1
        assert message in inst.output
