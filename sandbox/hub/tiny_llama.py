"""``sandbox/tiny-llama``: a real, servable Llama small enough to stage in a second, generated without downloads.

The other sandbox repos only have to look like models to the product and the stand-in (their weight bytes are
synthetic). This one is loaded by the real vLLM engine (``--engine vllm``), so everything in it is valid:
BF16 weights with finite values of a sane scale, a byte-level BPE tokenizer, and a chat template.

Shapes follow what vLLM's CPU build serves (measured, ../shared/FACTS.md "A tiny real model"): head_dim 64
(head_dim 16 is refused: "Unsupported CPU attention configuration: head_dim=16"). The tokenizer is byte-level
BPE with no merges: every byte is a token (GPT-2's byte-to-unicode alphabet), so any text encodes and any
generated id decodes, with no training and no ``tokenizers`` package. Everything is a function of ``seed``.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from dataclasses import dataclass

from sandbox.hub.blobs import Blob, BytesBlob
from sandbox.hub.repo import Repo, make_files
from sandbox.safetensors_format import TensorSpec, build_header

REPO_ID = "sandbox/tiny-llama"
BEGIN, END, HEADER_START, HEADER_END = "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"
SPECIALS = (BEGIN, END, HEADER_START, HEADER_END)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyLlamaDims:
    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 64
    context_length: int = 4096  # above the cpu preset's max_model_len (2048): vLLM refuses a longer one

    @property
    def vocab(self) -> int:
        return 256 + len(SPECIALS)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value (``bytes_to_unicode``), as ByteLevel pre-tokenizers use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _special(token_id: int, content: str) -> dict:
    return {"id": token_id, **_added(content)}


def _added(content: str) -> dict:
    return {
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def tokenizer_json() -> str:
    vocab = {char: i for i, char in enumerate(byte_alphabet())}
    specials = [_special(256 + i, token) for i, token in enumerate(SPECIALS)]
    vocab.update({s["content"]: s["id"] for s in specials})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": specials,
            "normalizer": None,
            "pre_tokenizer": byte_level,
            "post_processor": byte_level,
            "decoder": byte_level,
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": vocab,
                "merges": [],
            },
        },
        ensure_ascii=False,
    )


def tokenizer_config_json(dims: TinyLlamaDims) -> str:
    return json.dumps(
        {
            "added_tokens_decoder": {str(256 + i): _added(t) for i, t in enumerate(SPECIALS)},
            "bos_token": BEGIN,
            "eos_token": END,
            "pad_token": END,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": dims.context_length,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        indent=2,
    )


def config_json(dims: TinyLlamaDims) -> str:
    return json.dumps(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": dims.hidden,
            "intermediate_size": dims.intermediate,
            "num_hidden_layers": dims.layers,
            "num_attention_heads": dims.heads,
            "num_key_value_heads": dims.kv_heads,
            "head_dim": dims.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": dims.context_length,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "vocab_size": dims.vocab,
            "bos_token_id": 256,
            "eos_token_id": 257,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.46.0",
        },
        indent=2,
    )


def generation_config_json() -> str:
    return json.dumps({"bos_token_id": 256, "eos_token_id": 257, "do_sample": True, "temperature": 0.7})


def tensor_shapes(dims: TinyLlamaDims) -> list[tuple[str, tuple[int, ...]]]:
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (dims.vocab, dims.hidden))]
    for i in range(dims.layers):
        layer = f"model.layers.{i}"
        shapes += [
            (f"{layer}.input_layernorm.weight", (dims.hidden,)),
            (f"{layer}.self_attn.q_proj.weight", (q, dims.hidden)),
            (f"{layer}.self_attn.k_proj.weight", (kv, dims.hidden)),
            (f"{layer}.self_attn.v_proj.weight", (kv, dims.hidden)),
            (f"{layer}.self_attn.o_proj.weight", (dims.hidden, q)),
            (f"{layer}.post_attention_layernorm.weight", (dims.hidden,)),
            (f"{layer}.mlp.gate_proj.weight", (dims.intermediate, dims.hidden)),
            (f"{layer}.mlp.up_proj.weight", (dims.intermediate, dims.hidden)),
            (f"{layer}.mlp.down_proj.weight", (dims.hidden, dims.intermediate)),
        ]
    return [*shapes, ("model.norm.weight", (dims.hidden,)), ("lm_head.weight", (dims.vocab, dims.hidden))]


BF16_ONE = 0x3F80


def _bf16_values(name: str, count: int, seed: int) -> bytes:
    """``count`` BF16 values: 1.0 for norm weights, else signed magnitudes in [2^-7, 2^-4) from a seeded stream."""
    if name.endswith("norm.weight"):
        return array("H", [BF16_ONE] * count).tobytes()
    stream = array("H", hashlib.shake_256(f"{seed}:{name}".encode()).digest(2 * count))
    # Sign from the top bit, one of 3 exponents (2^-7 .. 2^-5), the low 7 bits as mantissa: always finite.
    values = array("H", [(r & 0x8000) | ((120 + (r >> 7) % 3) << 7) | (r & 0x7F) for r in stream])
    return values.tobytes()  # little-endian on the machines this runs on, as safetensors requires


def safetensors_bytes(dims: TinyLlamaDims, seed: int) -> bytes:
    shapes = tensor_shapes(dims)
    header = build_header([TensorSpec(name, "BF16", shape) for name, shape in shapes], {"format": "pt"})
    return header + b"".join(_bf16_values(name, math.prod(shape), seed) for name, shape in shapes)


def tiny_llama_blobs(seed: int = 0, dims: TinyLlamaDims | None = None) -> dict[str, Blob]:
    """Every file of the repo, by path."""
    dims = dims or TinyLlamaDims()
    readme = (
        f"---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# {REPO_ID}\n\n"
        "A generated 2-layer Llama with random weights, for serving with the real vLLM engine offline.\n"
    )
    texts = {
        "README.md": readme,
        "config.json": config_json(dims),
        "generation_config.json": generation_config_json(),
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config_json(dims),
        "special_tokens_map.json": json.dumps({"bos_token": BEGIN, "eos_token": END, "pad_token": END}),
    }
    blobs: dict[str, Blob] = {path: BytesBlob(text.encode()) for path, text in texts.items()}
    blobs["model.safetensors"] = BytesBlob(safetensors_bytes(dims, seed))
    return blobs


def tiny_llama_repo(seed: int = 0) -> Repo:
    """The public repo ``sandbox/tiny-llama`` with one commit on ``main``."""
    repo = Repo(REPO_ID)
    repo.commit(make_files(tiny_llama_blobs(seed)), message="Add a tiny Llama for the real engine")
    return repo
