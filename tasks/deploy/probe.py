"""Verify a revision through its URL before it gets traffic: health, the model list, a real chat completion,
and optionally a short load test with an SLO gate. Cloud Run's own startup probe only proves a port opened.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from pydantic import BaseModel, Field, SecretStr

from tasks.common.logs import run_logger


class VerifyOptions(BaseModel):
    """What a candidate must show before it takes traffic."""

    health_window_s: float = Field(240, gt=0, description="How long /health may take to answer 200.")
    health_period_s: float = Field(2, gt=0, description="Seconds between /health checks (the probe cadence).")
    prompt: str = Field("Reply in one short sentence: are you ready to serve?", description="Chat prompt sent.")
    max_tokens: int = Field(16, ge=1, le=4096)
    request_timeout_s: float = Field(120, gt=0)
    load_requests: int = Field(0, ge=0, le=10_000, description="Extra chat requests for latency figures (0 = none).")
    load_concurrency: int = Field(4, ge=1, le=256)
    slo_p95_ms: float | None = Field(None, gt=0, description="Fail if p95 latency of the load test is above this.")
    slo_min_tokens_per_s: float | None = Field(None, gt=0, description="Fail if throughput is below this.")


class Verification(BaseModel):
    url: str
    healthy_after_s: float
    health_checks: int
    served_models: list[str]
    reply: str
    usage: dict
    # What the server says it is (vLLM: "vllm-<version>-<config hash>"), when it says; tells engines apart.
    system_fingerprint: str | None = None
    requests: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    tokens_per_s: float | None = None


class VerificationFailed(RuntimeError):
    """The candidate did not prove itself; the message says what it did instead."""


def _headers(token: SecretStr) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.get_secret_value()}"}


def wait_healthy(client: httpx.Client, options: VerifyOptions) -> tuple[float, int]:
    """Poll /health at the probe cadence until 200; (seconds it took, checks made)."""
    started = time.monotonic()
    checks = 0
    last = "no answer"
    while True:
        checks += 1
        try:
            response = client.get("/health")
            if response.status_code == 200:
                return time.monotonic() - started, checks
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        elapsed = time.monotonic() - started
        if elapsed + options.health_period_s > options.health_window_s:
            raise VerificationFailed(
                f"/health did not answer 200 within {options.health_window_s:.0f} s ({checks} checks, last: {last})"
            )
        time.sleep(options.health_period_s)


def chat_completion(client: httpx.Client, served_name: str, options: VerifyOptions) -> tuple[dict, float]:
    """The verify step's chat completion (temperature 0): the answer and its seconds; not 200 raises."""
    body = {
        "model": served_name,
        "messages": [{"role": "user", "content": options.prompt}],
        "max_tokens": options.max_tokens,
        "temperature": 0,
    }
    started = time.monotonic()
    response = client.post("/v1/chat/completions", json=body)
    elapsed = time.monotonic() - started
    if response.status_code != 200:
        raise VerificationFailed(f"chat completion answered HTTP {response.status_code}: {response.text[:300]}")
    return response.json(), elapsed


def verify(url: str, token: SecretStr, served_name: str, options: VerifyOptions | None = None) -> Verification:
    """Prove the revision behind ``url`` serves ``served_name``; raises VerificationFailed saying why not."""
    options = options or VerifyOptions()
    log = run_logger()
    with httpx.Client(base_url=url, headers=_headers(token), timeout=options.request_timeout_s) as client:
        healthy_after, checks = wait_healthy(client, options)
        models = client.get("/v1/models")
        if models.status_code != 200:
            raise VerificationFailed(f"/v1/models answered HTTP {models.status_code}")
        served = [m.get("id", "") for m in models.json().get("data", [])]
        if served_name not in served:
            raise VerificationFailed(f"/v1/models lists {served} but not '{served_name}': wrong model or name")
        answer, _ = chat_completion(client, served_name, options)
        try:
            reply = answer["choices"][0]["message"]["content"] or ""
            usage = answer["usage"]
        except (KeyError, IndexError, TypeError):
            raise VerificationFailed(f"chat completion is not an OpenAI response: {str(answer)[:300]}") from None
        if not reply.strip() or not usage.get("completion_tokens"):
            raise VerificationFailed("chat completion returned no text or no token usage")
        result = Verification(
            url=url, healthy_after_s=round(healthy_after, 3), health_checks=checks, served_models=served,
            reply=reply, usage=usage, system_fingerprint=_fingerprint(answer),
        )  # fmt: skip
        if options.load_requests:
            result = _load_test(client, served_name, options, result)
    log.info("verified %s: healthy after %.1f s, reply %r", url, healthy_after, reply[:60])
    return result


def _fingerprint(answer: dict) -> str | None:
    value = answer.get("system_fingerprint")
    return value[:120] if isinstance(value, str) else None  # untrusted: a string, and short


def _load_test(client: httpx.Client, served_name: str, options: VerifyOptions, result: Verification) -> Verification:
    started = time.monotonic()
    with ThreadPoolExecutor(options.load_concurrency) as pool:
        outcomes = list(pool.map(lambda _: chat_completion(client, served_name, options), range(options.load_requests)))
    wall = time.monotonic() - started
    latencies = sorted(seconds * 1000 for _, seconds in outcomes)
    tokens = sum(answer["usage"].get("completion_tokens", 0) for answer, _ in outcomes)
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    loaded = result.model_copy(
        update={
            "requests": len(outcomes),
            "p50_ms": round(statistics.median(latencies), 1),
            "p95_ms": round(p95, 1),
            "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        }
    )
    if options.slo_p95_ms is not None and p95 > options.slo_p95_ms:
        raise VerificationFailed(f"p95 latency {p95:.0f} ms is above the SLO of {options.slo_p95_ms:.0f} ms")
    if options.slo_min_tokens_per_s is not None and (loaded.tokens_per_s or 0) < options.slo_min_tokens_per_s:
        raise VerificationFailed(
            f"throughput {loaded.tokens_per_s} tokens/s is below the SLO of {options.slo_min_tokens_per_s}"
        )
    return loaded
