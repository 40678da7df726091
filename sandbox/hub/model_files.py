"""The small text files of a generated chat model: config, tokenizer, model card, .gitattributes."""

from __future__ import annotations

import json

from sandbox.hub.layout import HEAD_DIM, LlamaDims

TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
BOS, EOS, PAD, UNK = "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>", "<unk>"
SPECIAL_TOKENS = [BOS, EOS, PAD, UNK, "<|start_header_id|>", "<|end_header_id|>"]

# A Llama-3-style template: enough for a server to render /v1/chat/completions prompts.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

GITATTRIBUTES = "".join(
    f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n"
    for ext in ("safetensors", "bin", "pt", "pth", "gguf", "ckpt", "h5", "msgpack", "onnx", "model")
)


def _dump(data: object) -> str:
    return json.dumps(data, indent=2) + "\n"


def _special(token: str) -> dict:
    flags = ("lstrip", "normalized", "rstrip", "single_word")
    return {"content": token, **dict.fromkeys(flags, False), "special": True}


def config_json(dims: LlamaDims, dtype: str, context_length: int, architecture: str, model_type: str) -> str:
    """config.json as transformers writes it for a Llama-style causal LM."""
    return _dump(
        {
            "architectures": [architecture],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": dims.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": dims.intermediate_size,
            "max_position_embeddings": context_length,
            "model_type": model_type,
            "num_attention_heads": dims.num_attention_heads,
            "num_hidden_layers": dims.num_hidden_layers,
            "num_key_value_heads": dims.num_key_value_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": TORCH_DTYPES[dtype],
            "transformers_version": "4.46.0",
            "use_cache": True,
            "vocab_size": dims.vocab_size,
        }
    )


def generation_config_json() -> str:
    return _dump({"bos_token_id": 0, "do_sample": True, "eos_token_id": [1], "temperature": 0.6, "top_p": 0.9})


def tokenizer_json(vocab_size: int) -> str:
    """A word-level tokenizer whose vocabulary has exactly ``vocab_size`` entries, specials first."""
    words = SPECIAL_TOKENS + [f"tok{i}" for i in range(vocab_size - len(SPECIAL_TOKENS))]
    added = [{"id": i, **_special(w)} for i, w in enumerate(SPECIAL_TOKENS)]
    return _dump(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": None,
            "decoder": None,
            "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": UNK},
        }
    )


def tokenizer_config_json(context_length: int) -> str:
    return _dump(
        {
            "added_tokens_decoder": {str(i): _special(w) for i, w in enumerate(SPECIAL_TOKENS)},
            "bos_token": BOS,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": True,
            "eos_token": EOS,
            "model_max_length": context_length,
            "pad_token": PAD,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": UNK,
        }
    )


def special_tokens_map_json() -> str:
    return _dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK})


def card_data(gated: object) -> dict:
    """The model card's YAML metadata, also reported as ``cardData`` by the model info API."""
    data: dict = {
        "license": "apache-2.0",
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["sandbox", "chat"],
    }
    if gated:
        data["extra_gated_prompt"] = "You agree to the sandbox licence before downloading these weights."
    return data


def readme_md(repo_id: str, card: dict, note: str = "") -> str:
    """A model card: YAML front matter plus a short description."""
    front = "".join(
        f"{key}:\n" + "".join(f"- {item}\n" for item in value) if isinstance(value, list) else f"{key}: {value}\n"
        for key, value in card.items()
    )
    return (
        f"---\n{front}---\n\n# {repo_id}\n\nA generated model of the local sandbox. Its weights are random bytes in"
        f" valid safetensors files: good for moving around, useless for inference.\n{note}"
    )


def original_params_json(dims: LlamaDims) -> str:
    """original/params.json of a Meta-format checkpoint (which vLLM must not be pointed at)."""
    return _dump(
        {
            "dim": dims.hidden_size,
            "n_layers": dims.num_hidden_layers,
            "n_heads": dims.num_attention_heads,
            "n_kv_heads": dims.num_key_value_heads,
            "vocab_size": dims.vocab_size,
            "norm_eps": 1e-05,
            "rope_theta": 500000.0,
        }
    )
