"""Shapes of a Llama-style decoder sized to a byte budget, and how its tensors split into shards."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandbox.safetensors_format import DTYPE_BYTES, TensorSpec

HEAD_DIM = 64


@dataclass(frozen=True)
class LlamaDims:
    """The config.json numbers that decide every tensor shape."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int


def _layers_for(params: int) -> int:
    # Bigger budgets get more layers, so a 4 GiB model does not become two absurdly wide layers.
    for limit, layers in ((16_000_000, 2), (256_000_000, 4), (2_000_000_000, 16)):
        if params < limit:
            return layers
    return 32


def _vocab_for(params: int) -> int:
    # Small vocabularies keep tiny models (and their tokenizer.json) small.
    if params < 1_000_000:
        return 256
    if params < 64_000_000:
        return 1024
    return 32000


def dims_for(weight_bytes: int, dtype: str) -> LlamaDims:
    """Dimensions whose tensors add up to about ``weight_bytes`` (never below a minimal 1-layer model)."""
    params = max(1, weight_bytes // DTYPE_BYTES[dtype])
    layers, vocab = _layers_for(params), _vocab_for(params)
    # Per layer: attention ~2h^2 (+ GQA k/v), MLP 3*h*I with I ~ 8/3 h; embeddings and lm_head 2*V*h.
    a, b = layers * 10.5, 2 * vocab + 2 * layers + 1
    hidden = int((-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)) // HEAD_DIM * HEAD_DIM
    if hidden >= 8 * HEAD_DIM:
        hidden = hidden // (4 * HEAD_DIM) * (4 * HEAD_DIM)  # whole groups of 4 heads: grouped-query attention
    hidden = max(HEAD_DIM, hidden)
    heads = hidden // HEAD_DIM
    kv_heads = heads // 4 if heads % 4 == 0 else heads
    kv_dim = kv_heads * HEAD_DIM
    fixed = 2 * vocab * hidden + hidden + layers * (2 * hidden * hidden + 2 * hidden * kv_dim + 2 * hidden)
    # The MLP width absorbs what is left, so the total lands close to the budget.
    intermediate = max(16, (params - fixed) // (3 * hidden * layers) // 16 * 16)
    return LlamaDims(hidden, intermediate, layers, heads, kv_heads, vocab)


def tensor_specs(dims: LlamaDims, dtype: str) -> list[TensorSpec]:
    """Every tensor of the model in checkpoint order, with the names transformers and vLLM expect."""
    h, inter, kv = dims.hidden_size, dims.intermediate_size, dims.num_key_value_heads * HEAD_DIM
    specs = [TensorSpec("model.embed_tokens.weight", dtype, (dims.vocab_size, h))]
    for i in range(dims.num_hidden_layers):
        prefix = f"model.layers.{i}"
        specs += [
            TensorSpec(f"{prefix}.self_attn.q_proj.weight", dtype, (h, h)),
            TensorSpec(f"{prefix}.self_attn.k_proj.weight", dtype, (kv, h)),
            TensorSpec(f"{prefix}.self_attn.v_proj.weight", dtype, (kv, h)),
            TensorSpec(f"{prefix}.self_attn.o_proj.weight", dtype, (h, h)),
            TensorSpec(f"{prefix}.mlp.gate_proj.weight", dtype, (inter, h)),
            TensorSpec(f"{prefix}.mlp.up_proj.weight", dtype, (inter, h)),
            TensorSpec(f"{prefix}.mlp.down_proj.weight", dtype, (h, inter)),
            TensorSpec(f"{prefix}.input_layernorm.weight", dtype, (h,)),
            TensorSpec(f"{prefix}.post_attention_layernorm.weight", dtype, (h,)),
        ]
    specs += [
        TensorSpec("model.norm.weight", dtype, (h,)),
        TensorSpec("lm_head.weight", dtype, (dims.vocab_size, h)),
    ]
    return specs


def split_shards(tensors: list[TensorSpec], shards: int) -> list[list[TensorSpec]]:
    """Consecutive groups of about equal bytes, none empty (as ``save_pretrained(max_shard_size=...)`` does)."""
    if not 1 <= shards <= len(tensors):
        raise ValueError(f"cannot split {len(tensors)} tensors into {shards} shards")
    total = sum(t.nbytes for t in tensors)
    groups: list[list[TensorSpec]] = [[] for _ in range(shards)]
    index, done = 0, 0
    for position, tensor in enumerate(tensors):
        left = len(tensors) - position  # this tensor included
        must_move = left == shards - index - 1  # every later group still needs one
        past_target = done + tensor.nbytes / 2 > (index + 1) * total / shards
        if groups[index] and index < shards - 1 and (must_move or past_target):
            index += 1
        groups[index].append(tensor)
        done += tensor.nbytes
    return groups
