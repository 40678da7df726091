"""The vLLM stand-in's torch.compile cache on a Cloud Storage volume (sandbox/vllm/compile_cache.py, issue 38).

Instances start as the Cloud Run stand-in starts them, on the sandbox clock, with VLLM_CACHE_ROOT on a read-write
volume of the GCS emulator (``only-dir=compile-cache/<key>``). Each test uses its own key, so instances of one test
share a cache and tests do not.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from sandbox.gcs import FakeGcs, start_fake_gcs
from sandbox.vllm.timing import CUDA_GRAPH_CAPTURE_S, KV_CACHE_PROFILE_S, TORCH_COMPILE_CACHED_S, TORCH_COMPILE_S
from tests.support import vllm_standin
from tests.support.vllm_standin import MODEL_PATH, Instance, Launcher

BUCKET = "compile-cache-models"
CACHE = "/mnt/compile-cache"
CACHE_ENV = {"VLLM_CACHE_ROOT": f"{CACHE}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/inductor"}
COMPILED = ["vllm", "serve", MODEL_PATH, "--port", "8080", "--host", "0.0.0.0"]
INIT_ENGINE = "init engine (profile, create kv cache, warmup model) took"
AOT_MODEL = re.compile(rf"{CACHE}/vllm/torch_compile_cache/torch_aot_compile/[0-9a-f]{{64}}/rank_0_0/model")

launch = vllm_standin.launch
root = vllm_standin.root


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """The GCS emulator with one (empty) bucket for the compile caches."""
    emulator = start_fake_gcs(tmp_path_factory.mktemp("gcs"))
    try:
        client(emulator).create_bucket(BUCKET)
        yield emulator
    finally:
        emulator.stop()


def client(emulator: FakeGcs) -> storage.Client:
    return storage.Client(
        project="sandbox-project", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator.url}
    )


def objects(emulator: FakeGcs, prefix: str) -> set[str]:
    """Object names under ``prefix/``, relative to it."""
    blobs = client(emulator).list_blobs(BUCKET, prefix=f"{prefix}/")
    return {blob.name[len(prefix) + 1 :] for blob in blobs}


def cache_mount(key: str, *, writable: bool = True, read_only: bool = False) -> dict:
    """The product's compile-cache volume as SANDBOX_MOUNTS carries it."""
    return {"mount_path": CACHE, "bucket": BUCKET, "only_dir": key, "read_only": read_only, "writable": writable}


def start(launch: Launcher, root: Path, gcs: FakeGcs, mount: dict, *flags: str) -> Instance:
    """A compiled GPU start with the cache volume, once it serves."""
    inst = launch([*COMPILED, *flags], root=root, mounts=[mount], gcs_url=gcs.url, env=CACHE_ENV)
    inst.wait_ready()
    return inst


def message(inst: Instance, tag: str) -> str:
    """The message of the one stdout line logged at ``[tag]``."""
    found = [line.split(f"[{tag}] ", 1)[1] for line in inst.streams["stdout"] if f"[{tag}] " in line]
    assert len(found) == 1, (tag, inst.output)
    return found[0]


def init_engine(compile_s: float) -> str:
    total = KV_CACHE_PROFILE_S + compile_s + CUDA_GRAPH_CAPTURE_S
    return f"{INIT_ENGINE} {total:.2f} s (compilation: {compile_s:.2f} s)"


def assert_missed(inst: Instance) -> str:
    """The compile lines of a miss that saved its artefact; returns the artefact's path."""
    assert message(inst, "monitor.py:40") == "[backbone] Starting torch.compile"
    using = message(inst, "backends.py:1104")
    assert re.fullmatch(
        rf"\[backbone\] Using cache directory: {CACHE}/vllm/torch_compile_cache/[0-9a-f]{{10}}/rank_0_0/backbone "
        r"for vLLM's torch\.compile",
        using,
    ), using
    saved = message(inst, "decorators.py:743")
    match = re.fullmatch(rf"\[backbone\] saved AOT compiled function to ({AOT_MODEL.pattern})", saved)
    assert match, saved
    assert message(inst, "monitor.py:62") == f"[backbone] torch.compile took {TORCH_COMPILE_S:.2f} s in total"
    assert message(inst, "core.py:395") == init_engine(TORCH_COMPILE_S)
    assert "Directly load AOT compilation" not in inst.output
    return match.group(1)


def assert_hit(inst: Instance, artefact: str) -> None:
    """vLLM's lines of a start that loaded the AOT artefact, with the cached figure in the cold-start phases."""
    assert message(inst, "decorators.py:319") == f"[backbone] Directly load AOT compilation from path {artefact}"
    assert message(inst, "monitor.py:62") == f"[backbone] torch.compile took {TORCH_COMPILE_CACHED_S:.2f} s in total"
    assert message(inst, "gpu_model_runner.py:6581") == (
        f"Graph capturing finished in {CUDA_GRAPH_CAPTURE_S:.0f} secs, took 0.31 GiB"
    )
    assert message(inst, "core.py:395") == init_engine(TORCH_COMPILE_CACHED_S)
    assert "Starting torch.compile" not in inst.output and "saved AOT compiled function" not in inst.output


def test_cached_figure_is_marins_ratio_of_the_cold_one() -> None:
    assert round(TORCH_COMPILE_CACHED_S, 2) == 37.73 == round(TORCH_COMPILE_S * 2.3 / 12.8, 2)


def test_first_start_misses_and_saves_then_the_next_instance_loads(launch: Launcher, root: Path, gcs: FakeGcs) -> None:
    key = f"compile-cache/{uuid.uuid4().hex[:8]}"
    first = start(launch, root, gcs, cache_mount(key))
    artefact = assert_missed(first)
    first.stop()
    hash_dir = artefact.removeprefix(f"{CACHE}/vllm/torch_compile_cache/torch_aot_compile/").split("/")[0]
    backend_dir = next(
        line.split("torch_compile_cache/")[1].split("/")[0] for line in first.lines if "Using cache directory" in line
    )
    # Small objects named as vLLM names its files, plus gcsfuse's "dir/" object for each directory it made.
    aot, backend = f"vllm/torch_compile_cache/torch_aot_compile/{hash_dir}", f"vllm/torch_compile_cache/{backend_dir}"
    written = objects(gcs, key)
    assert written == {
        "vllm/",
        "vllm/torch_compile_cache/",
        "vllm/torch_compile_cache/torch_aot_compile/",
        f"{aot}/",
        f"{aot}/inductor_cache/",
        f"{aot}/rank_0_0/",
        f"{aot}/rank_0_0/model",
        f"{backend}/",
        f"{backend}/rank_0_0/",
        f"{backend}/rank_0_0/backbone/",
        f"{backend}/rank_0_0/backbone/cache_key_factors.json",
        f"{backend}/rank_0_0/backbone/computation_graph.py",
    }

    second = start(launch, root, gcs, cache_mount(key))
    assert_hit(second, artefact)
    assert objects(gcs, key) == written | {"vllm/dummy_cache/"}  # caching.py:482 makes it when loading


def test_changed_max_model_len_misses(launch: Launcher, root: Path, gcs: FakeGcs) -> None:
    key = f"compile-cache/{uuid.uuid4().hex[:8]}"
    first = start(launch, root, gcs, cache_mount(key))
    artefact = assert_missed(first)
    first.stop()
    changed = start(launch, root, gcs, cache_mount(key), "--max-model-len", "2048")
    assert assert_missed(changed) != artefact
    same = start(launch, root, gcs, cache_mount(key), "--served-model-name", "other")  # not in vLLM's hash
    assert_hit(same, artefact)


@pytest.mark.parametrize(
    ("read_only", "error"),
    [(False, "PermissionError: [Errno 13] Permission denied"), (True, "OSError: [Errno 30] Read-only file system")],
)
def test_a_cache_root_it_cannot_write_fails_the_start(
    launch: Launcher, root: Path, gcs: FakeGcs, read_only: bool, error: str
) -> None:
    # decorators.py:575 makes <hash>/inductor_cache outside any try: vLLM does not fall back to no cache.
    key = f"compile-cache/{uuid.uuid4().hex[:8]}"
    mount = cache_mount(key, writable=False, read_only=read_only)
    inst = launch(COMPILED, root=root, mounts=[mount], gcs_url=gcs.url, env=CACHE_ENV)
    assert inst.wait_exit() == 1
    assert "EngineCore failed to start." in inst.output
    assert inst.streams["stderr"][-1] == f"{error}: '{CACHE}/vllm'"
    assert objects(gcs, key) == set()


def test_without_write_access_it_never_writes_and_loads_only_what_writers_completed(
    launch: Launcher, root: Path, gcs: FakeGcs
) -> None:
    key = f"compile-cache/{uuid.uuid4().hex[:8]}"
    writer = start(launch, root, gcs, cache_mount(key))
    artefact = assert_missed(writer)
    writer.stop()
    written = objects(gcs, key)

    # Loading needs VLLM_CACHE_ROOT/dummy_cache (caching.py:482), which only a loading writer has made yet: the load
    # fails, vLLM compiles again and cannot save (both only warnings), and the instance serves.
    reader = start(launch, root, gcs, cache_mount(key, writable=False))
    assert message(reader, "decorators.py:333") == (
        f"[backbone] Compiling model again due to a load failure from {artefact}, reason: [Errno 13] Permission "
        f"denied: '{CACHE}/vllm/dummy_cache'"
    )
    assert message(reader, "decorators.py:749") == (
        f"[backbone] unable to save AOT compiled function to {artefact}: [Errno 13] Permission denied: "
        f"'{artefact}.{reader.process.pid}.tmp'"
    )
    assert message(reader, "monitor.py:62") == f"[backbone] torch.compile took {TORCH_COMPILE_S:.2f} s in total"
    assert message(reader, "core.py:395") == init_engine(TORCH_COMPILE_S)
    reader.stop()
    assert objects(gcs, key) == written

    assert_hit(start(launch, root, gcs, cache_mount(key)), artefact)  # a writer loads, making dummy_cache
    written = objects(gcs, key)
    assert_hit(start(launch, root, gcs, cache_mount(key, writable=False)), artefact)
    assert objects(gcs, key) == written


def test_enforce_eager_never_touches_the_cache(launch: Launcher, root: Path, gcs: FakeGcs) -> None:
    key = f"compile-cache/{uuid.uuid4().hex[:8]}"
    eager = start(launch, root, gcs, cache_mount(key), "--enforce-eager")
    assert "torch.compile took" not in eager.output and "torch_compile_cache" not in eager.output
    assert objects(gcs, key) == set()


def test_default_cache_root_is_the_instance_disk_and_always_misses(launch: Launcher, root: Path) -> None:
    for _ in range(2):
        inst = launch(COMPILED, root=root)
        inst.wait_ready()
        assert assert_missed_locally(inst)
        inst.stop()


def assert_missed_locally(inst: Instance) -> bool:
    saved = message(inst, "decorators.py:743")
    assert re.fullmatch(
        r"\[backbone\] saved AOT compiled function to /root/\.cache/vllm/torch_compile_cache/torch_aot_compile/"
        r"[0-9a-f]{64}/rank_0_0/model",
        saved,
    ), saved
    return message(inst, "monitor.py:62") == f"[backbone] torch.compile took {TORCH_COMPILE_S:.2f} s in total"
