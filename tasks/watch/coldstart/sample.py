"""One cold start of the copy: its instances stopped, then one streamed request timed to its first token.

Stopping: manual scaling with 0 instances stops them (tasks/deploy/rollout.stop_serving), and automatic scaling from
zero comes back with no instance running, so the next request starts one ("Starting new instance. Reason:
AUTOSCALING"). Cloud Run releases a stopped instance's GPU only some time later: until then a new instance cannot
start and the request is refused (429 or 503, "no available instance"). Those refusals are not the cold start: the
request is sent again, and the sample is timed from the attempt that got an instance.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import httpx
from google.cloud import run_v2
from pydantic import BaseModel, SecretStr

from blocks.target import GcpTarget
from tasks.deploy.rollout import AUTOMATIC, resume_serving, stop_serving

NO_INSTANCE = (429, 503)  # Cloud Run's answers while no instance can take the request
RETRY_CAP_S = 15.0
DECODE_TOKENS = 64
TPOT_METRIC = "vllm:request_time_per_output_token_seconds"


class Timed(BaseModel):
    """One request: when it was sent, its first token's time, and how long refusals held it up before."""

    sent: datetime
    first_token: datetime
    ttft_s: float
    refused_for_s: float = 0.0
    refusals: int = 0
    decode_tokens_per_s: float | None = None


class NoFirstToken(RuntimeError):
    """The request got no token: the message says what came back instead."""


def restart_from_zero(target: GcpTarget, copy_id: str) -> None:
    """The copy with no instance running, back on automatic scaling from zero with at most one instance."""
    stop_serving(target, copy_id)
    resume_serving(target, copy_id, run_v2.ServiceScaling(scaling_mode=AUTOMATIC), max_instances=1)


def first_token_at(response: httpx.Response) -> float | None:
    """Reads the stream to its end; the time (monotonic) its first content chunk came, None when none came."""
    first = None
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line.removeprefix("data: "))
        if "error" in chunk:
            raise NoFirstToken(f"the stream failed: {chunk['error']}")
        if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
            first = time.monotonic()
    return first


def engine_decode_speed(client: httpx.Client) -> float | None:
    """Output tokens a second by the engine's own clock: vLLM's per-request time per output token histogram
    (vllm:request_time_per_output_token_seconds, vllm/v1/metrics/loggers.py) on the instance that just started, whose
    only request was the sample's. Timing the stream here gives no such figure for a fast engine: its chunks arrive
    together (tiny-llama's 64 tokens in 0.1 s read as 89,000 tokens/s). None when /metrics does not answer: no
    figure rather than a wrong one."""
    try:
        text = client.get("/metrics", timeout=30).raise_for_status().text
    except httpx.HTTPError:
        return None
    totals = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for kind in totals:
            if name.split("{", 1)[0] == f"{TPOT_METRIC}_{kind}":
                totals[kind] += float(value.split()[0])
    if not totals["count"] or not totals["sum"]:
        return None
    return round(totals["count"] / totals["sum"], 2)


def timed_request(url: str, token: SecretStr, served_name: str, prompt: str, deadline_s: float) -> Timed:
    """One streamed chat completion to ``url``, timed to its first token; refusals for want of an instance are sent
    again, backing off, until ``deadline_s``."""
    # DECODE_TOKENS tokens whatever the model would say (vLLM's ignore_eos), so the same request also gives the
    # decode speed: what a compiled engine gains over an eager one (issue 38).
    body = {"model": served_name, "messages": [{"role": "user", "content": prompt}], "max_tokens": DECODE_TOKENS,
            "ignore_eos": True, "temperature": 0, "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    began, pause, refusals = time.monotonic(), 0.5, 0
    with httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(deadline_s, connect=30)) as client:
        while True:
            sent, started = datetime.now(UTC), time.monotonic()
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code == 200:
                    first = first_token_at(response)
                    if first is None:
                        raise NoFirstToken("the stream ended without a token")
                    ttft = first - started
                    return Timed(sent=sent, first_token=sent + timedelta(seconds=ttft), ttft_s=round(ttft, 3),
                                 refused_for_s=round(started - began, 3), refusals=refusals,
                                 decode_tokens_per_s=engine_decode_speed(client))  # fmt: skip
                response.read()
                if response.status_code not in NO_INSTANCE or time.monotonic() - began > deadline_s:
                    raise NoFirstToken(f"HTTP {response.status_code}: {response.text[:200]}")
            refusals += 1
            time.sleep(pause)
            pause = min(pause * 2, RETRY_CAP_S)
