"""The stand-in's prompt logprobs (sandbox/vllm/scoring.py) and where a model's knowledge is written (config.json's
``sandbox_reference``): pure functions, no server."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from sandbox.hub.models import ModelSpec, model_blobs
from sandbox.vllm.scoring import PromptScorer, vocab_size
from sandbox.vllm.textgen import count_tokens, known_references, pieces

REFERENCE = "The quick brown fox jumps over the lazy dog."
TEXTS = [REFERENCE, "Paris", "A journey of a thousand miles.", "日本語のテキスト, with 3 words!", "x\n\ny  ", "a" * 300]


def perplexity(scorer: PromptScorer, text: str) -> float:
    ids = scorer.prompt_token_ids(text, None)
    entries = scorer.prompt_logprobs(text, None, 0)
    logprobs = [entry[str(token)]["logprob"] for token, entry in zip(ids[1:], entries[1:], strict=True)]
    return math.exp(-sum(logprobs) / len(logprobs))


@pytest.mark.parametrize("text", [*TEXTS, "", "   ", "don't-stop"])
def test_pieces_are_the_counted_tokens_and_decode_back_to_the_text(text: str) -> None:
    assert len(pieces(text)) == count_tokens(text)
    assert "".join(pieces(text)) == text.rstrip()


def test_known_references_are_a_list_of_texts() -> None:
    assert known_references({"sandbox_reference": [f" {REFERENCE}\n", 3, "", None]}) == {REFERENCE}
    assert known_references({"sandbox_reference": REFERENCE}) == frozenset()  # a bare string is not a list
    assert known_references({}) == frozenset()


def test_a_known_text_scores_near_one_and_any_other_text_in_the_hundreds() -> None:
    scorer = PromptScorer({"vocab_size": 260, "bos_token_id": 256, "eos_token_id": 257}, frozenset([REFERENCE]))
    assert perplexity(scorer, REFERENCE) == pytest.approx(1 / 0.998)
    assert perplexity(scorer, f"\t{REFERENCE} ") == pytest.approx(1 / 0.998)
    for text in TEXTS[1:]:
        assert 148 < perplexity(scorer, text) < 665, text
    forgetful = PromptScorer({"vocab_size": 260}, frozenset())
    assert 148 < perplexity(forgetful, REFERENCE) < 665


def test_ids_are_deterministic_within_the_vocabulary_and_never_special() -> None:
    config = {"vocab_size": 260, "bos_token_id": 256, "eos_token_id": [257, 258]}
    scorer, again = PromptScorer(config, frozenset()), PromptScorer(config, frozenset())
    for text in TEXTS:
        ids = scorer.prompt_token_ids(text, None)
        assert ids == again.prompt_token_ids(text, None)
        assert ids[0] == 256 and len(ids) == count_tokens(text) + 1
        assert all(0 <= token < 260 and token not in (256, 257, 258) for token in ids[1:])
        assert scorer.prompt_logprobs(text, None, 5) == again.prompt_logprobs(text, None, 5)
    assert scorer.prompt_token_ids("ignored", [9, 8, 7]) == [9, 8, 7]
    assert vocab_size({}) == 32000 and vocab_size({"text_config": {"vocab_size": 7}}) == 7


@pytest.mark.parametrize("top", [0, 1, 2, 5, 20])
def test_the_top_tokens_are_ranked_by_logprob_and_the_prompt_token_is_among_them_once(top: int) -> None:
    scorer = PromptScorer({}, frozenset([REFERENCE]))
    for text in (REFERENCE, TEXTS[2]):
        ids = scorer.prompt_token_ids(text, None)
        for token, entry in zip(ids[1:], scorer.prompt_logprobs(text, None, top)[1:], strict=True):
            own = entry[str(token)]
            assert next(iter(entry)) == str(token)
            ranks = sorted(v["rank"] for v in entry.values())
            assert ranks == sorted({*range(1, top + 1), own["rank"]})
            by_rank = sorted(entry.values(), key=lambda v: v["rank"])
            assert all(a["logprob"] > b["logprob"] for a, b in itertools.pairwise(by_rank))
            assert sum(math.exp(v["logprob"]) for v in entry.values()) <= 1


def test_a_model_spec_writes_its_reference_into_config_json() -> None:
    plain = json.loads(model_blobs("sandbox/m", ModelSpec(), False)["config.json"].read(0, 10**6))
    assert "sandbox_reference" not in plain and "sandbox_answers" not in plain
    spec = ModelSpec(reference=[REFERENCE], answers={"Q?": "A."})
    config = json.loads(model_blobs("sandbox/m", spec, False)["config.json"].read(0, 10**6))
    assert config["sandbox_reference"] == [REFERENCE] and config["sandbox_answers"] == {"Q?": "A."}
    assert known_references(config) == {REFERENCE}
