"""Tiny but valid model folders (config, tokenizer, sharded safetensors with an index) for deploy tests."""

from __future__ import annotations

import json
from collections.abc import Iterable

from sandbox.config import SandboxConfig
from sandbox.safetensors_format import TensorSpec, build_header

# The account a revision without one runs as. A new project grants it no role (the organization policy
# iam.automaticIamGrantsForDefaultServiceAccounts), so it reads a bucket only once granted there, as here.
COMPUTE_DEFAULT = f"serviceAccount:{SandboxConfig().project_number}-compute@developer.gserviceaccount.com"

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


def tiny_model_files(seed: int = 0) -> dict[str, bytes]:
    """A two-shard model whose headers, sizes and index agree, as vLLM checks them."""
    files: dict[str, bytes] = {
        "config.json": json.dumps(CONFIG).encode(),
        "generation_config.json": b'{"max_new_tokens": 64}',
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
        "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
    }
    weight_map: dict[str, str] = {}
    total = 0
    for shard in (1, 2):
        name = f"model-0000{shard}-of-00002.safetensors"
        tensors = [TensorSpec(f"model.layers.{shard - 1}.mlp.weight", "BF16", (64, 64 + seed))]
        data = bytes((i * 7 + seed) % 251 for i in range(tensors[0].nbytes))
        files[name] = build_header(tensors) + data
        weight_map.update({t.name: name for t in tensors})
        total += len(data)
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}
    ).encode()
    return files


def upload_model(
    storage_client, bucket: str, prefix: str, files: dict[str, bytes], readers: Iterable[str] = (COMPUTE_DEFAULT,)
) -> None:
    """The files under ``prefix``, in ``bucket`` (created if missing), which ``readers`` (IAM members: the accounts
    the revisions mounting it run as, since gcsfuse lists the bucket at mount) may read."""
    gcs_bucket = storage_client.bucket(bucket)
    if not gcs_bucket.exists():
        storage_client.create_bucket(bucket, location="us-central1")
    for path, data in files.items():
        gcs_bucket.blob(f"{prefix}/{path}").upload_from_string(data)
    let_read(storage_client, bucket, readers)


def let_read(storage_client, bucket: str, readers: Iterable[str]) -> None:
    """roles/storage.objectViewer on ``bucket`` for ``readers`` (IAM members), besides whoever has it already."""
    gcs_bucket = storage_client.bucket(bucket)
    policy = gcs_bucket.get_iam_policy(requested_policy_version=3)
    members = set(readers)
    viewer = next((b for b in policy.bindings if b["role"] == "roles/storage.objectViewer"), None)
    if not members or (viewer is not None and members <= set(viewer["members"])):
        return
    if viewer is None:
        policy.bindings.append({"role": "roles/storage.objectViewer", "members": members})
    else:
        viewer["members"] = set(viewer["members"]) | members
    gcs_bucket.set_iam_policy(policy)
