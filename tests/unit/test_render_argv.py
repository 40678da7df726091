"""Merging the user's extra_args into the rendered vLLM flags, and reading a flag's value as vLLM's parser does."""

from __future__ import annotations

import pytest

from tasks.deploy.vllm_argv import canonical_flag, flag_value, merge_flags

RENDERED = ["--port", "8080", "--safetensors-load-strategy", "eager", "--enforce-eager", "--no-enable-prefix-caching"]


@pytest.mark.parametrize(
    ("extra", "merged"),
    [
        (
            ["--safetensors-load-strategy", "prefetch"],
            ["--port", "8080", "--safetensors-load-strategy", "prefetch", "--enforce-eager",
             "--no-enable-prefix-caching"],
        ),
        (
            ["--safetensors-load-strategy=prefetch"],
            ["--port", "8080", "--safetensors-load-strategy=prefetch", "--enforce-eager", "--no-enable-prefix-caching"],
        ),
        (
            ["--enable-prefix-caching"],
            ["--port", "8080", "--safetensors-load-strategy", "eager", "--enforce-eager", "--enable-prefix-caching"],
        ),
        (
            ["--no-enforce-eager", "--trust-remote-code"],
            ["--port", "8080", "--safetensors-load-strategy", "eager", "--no-enforce-eager",
             "--no-enable-prefix-caching", "--trust-remote-code"],
        ),
        (
            ["--limit-mm-per-prompt", '{"image":4}', "--safetensors-load", "lazy", "--seed", "-1"],
            ["--port", "8080", "--safetensors-load", "lazy", "--enforce-eager", "--no-enable-prefix-caching",
             "--limit-mm-per-prompt", '{"image":4}', "--seed", "-1"],
        ),
        ([], RENDERED),
    ],
    ids=["value", "equals", "boolean-on", "boolean-off", "abbreviated-and-others", "none"],
)  # fmt: skip
def test_a_users_flag_replaces_the_rendered_one_at_its_place(extra, merged):
    assert merge_flags(RENDERED, extra) == merged


def test_a_flag_the_user_repeats_stays_repeated_for_the_checks_to_refuse():
    extra = ["--safetensors-load-strategy", "lazy", "--safetensors-load-strategy", "prefetch"]
    assert merge_flags(RENDERED, extra) == ["--port", "8080", *extra, "--enforce-eager", "--no-enable-prefix-caching"]


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["vllm", "serve", "/m", "--port", "8080"], "8080"),
        (["--port=9000"], "9000"),
        (["--port", "8080", "--port", "9000"], "9000"),  # argparse keeps the last
        (["--por", "9000"], "9000"),  # an abbreviation argparse accepts
        (["--portal", "9000"], None),
        (["--port"], None),
    ],
)
def test_flag_value_is_what_vllms_parser_reads(argv, value):
    assert flag_value(argv, "--port") == value


def test_canonical_flag_names_every_spelling_of_a_known_flag():
    known = ["--safetensors-load-strategy", "--enable-prefix-caching"]
    assert canonical_flag("--safetensors_load_strategy=lazy", known) == "--safetensors-load-strategy"
    assert canonical_flag("--no-enable-prefix-caching", known) == "--enable-prefix-caching"
    assert canonical_flag("--enable", [*known, "--enable-chunked-prefill"]) == "--enable"  # ambiguous: left as is
    assert canonical_flag("-q", known) == "--quantization"
