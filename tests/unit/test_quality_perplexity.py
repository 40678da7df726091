"""The quality gate's perplexity check (issue 37 item 3): vLLM's prompt_logprobs read into a perplexity, and the
candidate held to the serving revision's times max_ratio and to the ceiling max."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from flows.gate import quality_payload
from tasks.checks.quality_budget import gate_seconds
from tasks.quality.perplexity import Measured, from_response
from tasks.quality.spec import resolve_quality
from tasks.quality.verdict import Answer, judge, table
from tasks.watch.canary import WatchOptions

TEXT = "The quick brown fox jumps over the lazy dog."
SET = {"prompts": [{"prompt": "Capital of France?", "expect": {"contains": "Paris"}}], "min_score": 1.0,
       "perplexity": {"text": TEXT, "max_ratio": 1.5, "max": 10}}  # fmt: skip
PARIS = [Answer(text="Paris")]


def completion(logprobs: list[float], ids: list[int] | None, extra: dict | None = None) -> dict:
    """A /v1/completions response with prompt_logprobs as vLLM 0.32 gives them: null for the first token, then
    {token id: {logprob, rank, decoded_token}} for each next one."""
    positions: list = [None]
    for i, logprob in enumerate(logprobs, 1):
        token_id = ids[i] if ids else 100 + i
        positions.append({str(token_id): {"logprob": logprob, "rank": 1, "decoded_token": "x"}, **(extra or {})})
    return {"choices": [{"text": ".", "prompt_logprobs": positions, "prompt_token_ids": ids}]}


def test_the_perplexity_is_read_from_each_prompt_tokens_own_logprob():
    ids = [1, 7, 8, 9]
    measured = from_response(completion([-0.1, -0.2, -0.3], ids))
    assert measured.tokens == 3 and math.isclose(measured.value, math.exp(0.2))
    # With more entries at a position (a top-k), the prompt token is the one with its id, not the likeliest.
    crowded = from_response(completion([-2.0, -2.0, -2.0], ids, extra={"5": {"logprob": -0.01, "rank": 1}}))
    assert math.isclose(crowded.value, math.exp(2.0))
    # Without the ids, a position holding only the prompt token still says it.
    assert math.isclose(from_response(completion([-1.0], None)).value, math.e)


def test_a_candidate_far_less_sure_of_the_text_than_the_serving_revision_is_refused():
    quality = resolve_quality(SET, Path("."))
    held = judge(quality, "r2", PARIS, "r1", PARIS, perplexity=(Measured(value=1.4, tokens=9), Measured(value=1.0)))
    assert held.passed, held.reason
    assert held.reason.endswith("perplexity candidate 1.400, serving 1.000")
    # It answers its prompt right, and no longer knows the text it was trained on: a broken quantization.
    lost = judge(quality, "r2", PARIS, "r1", PARIS, perplexity=(Measured(value=284.0, tokens=9), Measured(value=1.0)))
    assert not lost.passed
    assert (
        "perplexity 284 above max 10.0; perplexity 284 above the serving revision's 1.000 times max_ratio 1.5"
        in lost.reason
    )
    row = next(line for line in table(lost) if line.startswith("| perplexity |"))
    assert row == "| perplexity | candidate 284, serving 1.000 (max_ratio 1.5; max 10; 9 tokens) |"
    assert quality_payload(lost)["perplexity"] == {"candidate": 284.0, "serving": 1.0}


def test_a_first_deploy_is_held_to_the_ceiling_and_an_unmeasured_candidate_fails():
    quality = resolve_quality(SET, Path("."))
    first = judge(quality, "r1", PARIS, perplexity=(Measured(value=12.0), None))
    assert not first.passed and "perplexity 12.0 above max 10.0" in first.reason and "floor only" in first.reason
    unmeasured = judge(quality, "r1", PARIS, perplexity=(Measured(error="HTTP 400"), None))
    assert not unmeasured.passed
    assert "perplexity not measured on the candidate (HTTP 400)" in unmeasured.reason
    # A serving revision that could not be measured leaves the ceiling alone to judge.
    alone = judge(quality, "r2", PARIS, "r1", PARIS, perplexity=(Measured(value=2.0), Measured(error="HTTP 400")))
    assert alone.passed and alone.reason.endswith("perplexity candidate 2.000, serving HTTP 400")


def test_the_reference_text_adds_one_first_token_and_the_rank_kernels_compile_to_the_gates_budget():
    quality = resolve_quality(SET, Path("."))
    without = resolve_quality({**SET, "perplexity": None}, Path("."))
    # At the watch's healthy limits: 2 s to a first token, 100 ms a token; the prompt's 32 tokens take 5.2 s.
    assert gate_seconds(without, WatchOptions()) == pytest.approx(2 + 3.2)
    assert gate_seconds(quality, WatchOptions()) == pytest.approx(2 + 3.2 + 2 + 20)
