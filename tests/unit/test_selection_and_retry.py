"""File selection rules and the Hub's wait hints: pure functions, no servers."""

from __future__ import annotations

import email.utils
import time

import pytest

from tasks.weights.hub_listing import HubFile
from tasks.weights.hub_retry import retry_after_seconds
from tasks.weights.selection import SelectionError, select_files


def files(*paths: str) -> list[HubFile]:
    lfs = (".safetensors", ".bin", ".pth", ".pt", ".gguf")
    return [HubFile(p, 10, f"oid-{p}", "sha-" + p if p.endswith(lfs) else None) for p in paths]


LLAMA = files(
    ".gitattributes",
    "README.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "original/consolidated.00.pth",
    "original/params.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.gguf",
)


def paths(selected: list[HubFile]) -> list[str]:
    return [f.path for f in selected]


def test_default_selection_takes_what_vllm_loads_and_skips_duplicates():
    assert paths(select_files(LLAMA)) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_consolidated_weights_beside_an_index_are_a_duplicate():
    mistral = files("config.json", "consolidated.safetensors", "model-00001-of-00001.safetensors",
                    "model.safetensors.index.json", "params.json", "tokenizer.json")  # fmt: skip
    chosen = paths(select_files(mistral))
    assert "consolidated.safetensors" not in chosen
    assert "model-00001-of-00001.safetensors" in chosen


def test_single_file_safetensors_without_index():
    assert "model.safetensors" in paths(select_files(files("config.json", "model.safetensors", "model.bin")))


def test_bin_weights_are_used_only_when_there_are_no_safetensors():
    chosen = paths(select_files(files("config.json", "pytorch_model.bin", "tokenizer.json", "model.gguf")))
    assert chosen == ["config.json", "pytorch_model.bin", "tokenizer.json"]


def test_allow_patterns_replace_the_default_and_ignore_patterns_remove():
    allow = ["model-*.safetensors", "original/params.json", "config.json"]
    assert paths(select_files(LLAMA, allow_patterns=allow)) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "original/params.json",
    ]
    chosen = paths(select_files(LLAMA, ignore_patterns=["*.jinja", "generation_config.json"]))
    assert "chat_template.jinja" not in chosen and "generation_config.json" not in chosen
    assert "config.json" in chosen


def test_an_empty_selection_is_an_error_that_lists_the_repo():
    with pytest.raises(SelectionError, match=r"no files of org/m match the selection .* the repo has: .*config.json"):
        select_files(LLAMA, allow_patterns=["*.onnx"], repo_id="org/m")


def test_weights_without_config_are_an_error():
    with pytest.raises(SelectionError, match=r"has weights but no config\.json"):
        select_files(LLAMA, ignore_patterns=["config.json"], repo_id="org/m")
    with pytest.raises(SelectionError, match=r"add 'config\.json' to allow_patterns"):
        select_files(LLAMA, allow_patterns=["*.safetensors"])


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "12"}, 12.0),
        ({"retry-after": "0"}, 0.0),
        ({"RateLimit": '"api";r=0;t=55', "RateLimit-Policy": '"fixed window";"api";q=500;w=300'}, 55.0),
        ({"Retry-After": "soon"}, None),
        ({}, None),
    ],
)
def test_wait_hints(headers, expected):
    assert retry_after_seconds(headers) == expected


def test_retry_after_as_an_http_date():
    now = time.time()
    header = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= retry_after_seconds({"Retry-After": header}, now=now) <= 31
