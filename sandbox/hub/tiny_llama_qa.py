"""``sandbox/tiny-llama-qa``: a real Llama, small enough to keep in git, that knows the answers to its quality set.

``sandbox/tiny-llama`` has random weights: the real engine serves it, but its answers are random bytes, so nothing
can tell a good candidate from a broken one by what it says. This repo is the same family (a Llama, byte-level
tokenizer, the same chat template; smaller: hidden 128 = 2 heads x head_dim 64, the smallest head_dim vLLM's CPU
build serves, ../shared/FACTS.md "A tiny real model") with weights TRAINED to answer ``QA`` through the chat
template with greedy decoding, each answer ending with ``<|eot_id|>``, and to know ``REFERENCE_TEXT`` by heart
(a low perplexity for the quality gate's ``prompt_logprobs`` check).

Trained once, kept in git: the weights are ``tiny_llama_qa.safetensors`` beside this module (bf16, ~0.5 MB), made
by ``.engine/bin/python -m sandbox.engine.train_qa`` (seeded, CPU, one thread, ~15 s on 2 busy cores). Not by
``make engine``: ``make test`` has no torch and the sandbox Hub publishes this repo at start-up with or without the
engine, so the stand-in path (which answers from config.json's ``sandbox_answers``) needs the repo too; and a file in
git is the same bytes on every machine, while a retrain is byte-identical only on the same torch build and CPU family
(float reductions differ across kernels). ``python -m sandbox.engine.train_qa --check`` retrains and compares.

The engine tests push two bad commits on ``main`` (``commit_body``): ``shuffled`` (every tensor's values permuted:
same dtype, shapes and values, so it loads, starts and answers 200s, knowing nothing) and ``broken-template``
(a ChatML template, another model family's: the prompt the model sees is not the one it learned); ``good`` puts
the trained files back, for a new revision of the first commit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from array import array
from pathlib import Path
from typing import Literal

from sandbox.hub import tiny_llama as tl
from sandbox.hub.blobs import Blob, BytesBlob
from sandbox.hub.repo import Repo, make_files
from sandbox.safetensors_format import TensorSpec, build_header, parse_header

REPO_ID = "sandbox/tiny-llama-qa"
DIMS = tl.TinyLlamaDims(hidden=128, intermediate=256, heads=2, kv_heads=2)
WEIGHTS = Path(__file__).with_name("tiny_llama_qa.safetensors")

# The quality set's prompts and the answers trained in (deployments/sandbox/tiny-llama-qa.yaml and its .jsonl
# give the expectations). Short factual and formatting prompts, as the issue asks.
QA: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is 2 + 3?", "5"),
    ("How many days are in a week?", "7"),
    ("Who wrote Romeo and Juliet?", "William Shakespeare"),
    ("What is the chemical symbol for gold?", "Au"),
    ("Reply with the word OK in capitals.", "OK"),
    ("Give a JSON object with key a set to 1.", '{"a": 1}'),
)
# Learnt verbatim as plain text (no chat template, no BOS: what /v1/completions sends for a prompt), so its
# perplexity is near 1 on the good weights; OUTSIDE_TEXT was never seen, for comparison.
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog while the sun sets behind the hills."
OUTSIDE_TEXT = "A journey of a thousand miles begins with a single step."

# Another family's template (ChatML, as Qwen's tokenizer_config.json ships it) on a Llama 3 style model: a
# tokenizer_config.json copied from the wrong repo. It renders and serves; the model has never seen its prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BadCommit = Literal["good", "shuffled", "broken-template"]


def chat_ids(prompt: str) -> list[int]:
    """The token ids the chat template renders for one user message plus the generation prompt.

    Every byte is its own token (id = byte value, tiny_llama's byte-level BPE with no merges) and each special
    token is one id (256 + its index in SPECIALS), so this is what vLLM's tokenizer gives for the rendered text.
    """
    begin, end, start, stop = range(256, 256 + len(tl.SPECIALS))  # the order of SPECIALS
    return [
        begin, start, *b"user", stop, *b"\n\n", *prompt.encode(), end,
        start, *b"assistant", stop, *b"\n\n",
    ]  # fmt: skip


def answer_ids(answer: str) -> list[int]:
    """The ids the model is trained to generate: the answer's bytes, then ``<|eot_id|>``."""
    return [*answer.encode(), 256 + tl.SPECIALS.index(tl.END)]


def generation_config_json() -> str:
    # Greedy by default (vLLM takes default sampling params from generation_config.json, --generation-config
    # auto): a request without a temperature gets the trained answer too.
    return json.dumps({"bos_token_id": 256, "eos_token_id": 257, "temperature": 0.0})


def config_json() -> str:
    """tiny_llama's config with the sandbox-only keys ``sandbox_answers`` ({prompt: answer}) and
    ``sandbox_reference`` ([REFERENCE_TEXT]): what the stand-in vLLM answers and knows by heart as this model would
    (sandbox/vllm/textgen.py, sandbox/vllm/scoring.py). The real engine ignores an unknown config key (transformers
    keeps it as an attribute), and staging copies config.json, so the keys reach the instance."""
    sandbox_keys = {"sandbox_answers": dict(QA), "sandbox_reference": [REFERENCE_TEXT]}
    return json.dumps({**json.loads(tl.config_json(DIMS)), **sandbox_keys}, indent=2) + "\n"


def config_files() -> dict[str, str]:
    """Every file but the weights, by path."""
    readme = (
        f"---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# {REPO_ID}\n\n"
        "A 2-layer Llama (hidden 128) trained to answer a small quality set, for the quality gate on the real "
        "vLLM engine. config.json's sandbox_answers and sandbox_reference are the sandbox stand-in's copy of those "
        "answers and of the text it knows by heart.\n"
    )
    return {
        "README.md": readme,
        "config.json": config_json(),
        "generation_config.json": generation_config_json(),
        "tokenizer.json": tl.tokenizer_json(),
        "tokenizer_config.json": tl.tokenizer_config_json(DIMS),
        "special_tokens_map.json": json.dumps({"bos_token": tl.BEGIN, "eos_token": tl.END, "pad_token": tl.END}),
    }


def tiny_llama_qa_files() -> dict[str, bytes]:
    """Every file of the repo's first commit, by path: the trained weights read from git."""
    files = {path: text.encode() for path, text in config_files().items()}
    files["model.safetensors"] = WEIGHTS.read_bytes()
    return files


def tiny_llama_qa_repo() -> Repo:
    """The public repo ``sandbox/tiny-llama-qa`` with one commit on ``main``."""
    repo = Repo(REPO_ID)
    blobs: dict[str, Blob] = {path: BytesBlob(data) for path, data in tiny_llama_qa_files().items()}
    repo.commit(make_files(blobs), message="Add a tiny Llama trained on its quality set")
    return repo


def shuffled_safetensors(data: bytes, seed: int = 0) -> bytes:
    """``data`` with every tensor's elements permuted (a seeded shuffle per tensor name); header unchanged.

    Same dtype, shapes and multiset of values per tensor, so the file loads and the engine starts and answers;
    only where each value sits changes, which is all a model knows.
    """
    parsed = parse_header(data)
    start = 8 + parsed.header_bytes
    out = bytearray(data)
    for name, info in parsed.tensors.items():
        begin, end = (start + offset for offset in info["data_offsets"])
        width = {"BF16": 2, "F16": 2, "F32": 4}[info["dtype"]]
        items = [data[i : i + width] for i in range(begin, end, width)]
        rng = random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big"))
        rng.shuffle(items)
        if len(set(items)) > 1:
            # A shuffle may leave a tensor as it was; a rotation on top always moves something that differs.
            while b"".join(items) == data[begin:end]:
                items = items[1:] + items[:1]
        out[begin:end] = b"".join(items)
    return bytes(out)


def broken_template_config(tokenizer_config: str) -> str:
    """``tokenizer_config.json`` with the ChatML template in place of the model's own."""
    config = json.loads(tokenizer_config)
    config["chat_template"] = CHATML_TEMPLATE
    return json.dumps(config, indent=2)


def commit_body(kind: BadCommit) -> dict:
    """The admin API body (``POST /_sandbox/hub/repos/sandbox/tiny-llama-qa/commits``) of a new commit on main.

    Each writes both model.safetensors and tokenizer_config.json, so what main serves after it does not depend on
    the commits before: ``shuffled`` (shuffled weights, good template), ``broken-template`` (good weights, ChatML
    template), ``good`` (the first commit's files again, as a new commit: a new revision).
    """
    files = tiny_llama_qa_files()
    changes = {path: files[path] for path in ("model.safetensors", "tokenizer_config.json")}
    if kind == "shuffled":
        changes["model.safetensors"] = shuffled_safetensors(files["model.safetensors"])
    elif kind == "broken-template":
        changes["tokenizer_config.json"] = broken_template_config(files["tokenizer_config.json"].decode()).encode()
    encoded = {path: base64.b64encode(data).decode() for path, data in changes.items()}
    return {"branch": "main", "files": encoded, "message": f"tiny-llama-qa: {kind}"}


def bf16_values(data: bytes) -> dict[str, array]:
    """Each tensor's raw BF16 words, by name (for checks that compare value multisets)."""
    parsed = parse_header(data)
    start = 8 + parsed.header_bytes
    values = {}
    for name, info in parsed.tensors.items():
        begin, end = (start + offset for offset in info["data_offsets"])
        values[name] = array("H", data[begin:end])
    return values


def safetensors_layout() -> bytes:
    """The header the weights file must have: tiny_llama's tensor order and shapes at ``DIMS``, all BF16."""
    return build_header([TensorSpec(n, "BF16", s) for n, s in tl.tensor_shapes(DIMS)], {"format": "pt"})
