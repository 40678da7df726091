"""The vLLM stand-in as the Cloud Run stand-in runs it (``python -m sandbox.vllm ARGS`` with the env contract), for
the tests that start one (tests/integration/test_vllm_standin*.py, test_vllm_traffic_faults.py): a tiny valid model on
an instance's root filesystem, the ``launch`` fixture that starts instances on the sandbox clock and stops them
afterwards, and the requests a client sends them.

A test module takes the fixtures by name: ``launch = vllm_standin.launch`` and ``root = vllm_standin.root``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest

from sandbox.safetensors_format import TensorSpec, build_header
from sandbox.serving import LOOPBACK, free_port

TIME_SCALE = 0.001
# The checkout these tests belong to: the child imports its sandbox package, not the one the venv's editable install
# points at (another checkout, when the tests run from a git worktree).
CHECKOUT = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0
MODEL_PATH = "/models/tiny"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "max_position_embeddings": 4096,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 32,
    "torch_dtype": "bfloat16",
}


def write_model(directory: Path, shards: int = 1) -> None:
    """A tiny valid checkpoint: config.json plus ``shards`` safetensors files (with an index when sharded)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    weight_map: dict[str, str] = {}
    for shard in range(1, shards + 1):
        name = "model.safetensors" if shards == 1 else f"model-{shard:05d}-of-{shards:05d}.safetensors"
        tensors = [TensorSpec(f"model.layers.{shard}.{part}.weight", "BF16", (64, 32)) for part in ("q", "k")]
        data = bytes(range(256)) * (sum(t.nbytes for t in tensors) // 256)
        (directory / name).write_bytes(build_header(tensors) + data)
        weight_map.update({t.name: name for t in tensors})
    if shards > 1:
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A per-instance root filesystem holding a valid model at /models/tiny."""
    write_model(tmp_path / "root" / MODEL_PATH.lstrip("/"))
    return tmp_path / "root"


LAST_STARTUP_STDOUT_LINE = "Route: /v1/completions, Methods: POST"  # sandbox/vllm/entrypoint.py, as vLLM 0.32
LAST_STARTUP_STDERR_LINE = "Application startup complete."  # uvicorn's, on stderr


@dataclass
class Instance:
    """A running stand-in with its stdout and stderr collected line by line."""

    process: subprocess.Popen
    host_port: int
    lines: list[str] = field(default_factory=list)
    streams: dict[str, list[str]] = field(default_factory=lambda: {"stdout": [], "stderr": []})  # ``lines`` by pipe
    _open_streams: int = 2
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def _pump(self, stream: IO[str], name: str) -> None:
        for raw in stream:
            with self._changed:
                self.lines.append(raw.rstrip("\n"))
                self.streams[name].append(raw.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._open_streams -= 1
            self._changed.notify_all()

    def start_reading(self) -> None:
        for stream, name in ((self.process.stdout, "stdout"), (self.process.stderr, "stderr")):
            threading.Thread(target=self._pump, args=(stream, name), daemon=True).start()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.host_port}"

    def wait_line(self, fragment: str, timeout: float = DEADLINE_S) -> str:
        """The first output line containing ``fragment``; fails at the deadline or when the output ends."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((line for line in self.lines if fragment in line), None)
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if self._open_streams == 0 or remaining <= 0:
                    pytest.fail(f"no {fragment!r} (exit code {self.process.poll()}):\n" + "\n".join(self.lines))
                self._changed.wait(min(remaining, 0.5))

    def wait_ready(self, timeout: float = DEADLINE_S) -> None:
        """Poll the mapped port until it accepts a connection."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"exited {self.process.returncode} before listening:\n{self.output}")
            if port_open(self.host_port):
                # Its start-up lines, printed before it listened, may still be in the pipes (stdout and stderr are
                # read apart, on a loaded machine late): collect through the last of each before callers read them.
                self.wait_line(LAST_STARTUP_STDOUT_LINE, timeout=max(deadline - time.monotonic(), 5))
                self.wait_line(LAST_STARTUP_STDERR_LINE, timeout=max(deadline - time.monotonic(), 5))
                return
            time.sleep(0.01)
        pytest.fail(f"port {self.host_port} not open within {timeout} s:\n{self.output}")

    def wait_exit(self, timeout: float = DEADLINE_S) -> int:
        """The exit code, once the process has ended and all its output is collected."""
        code = self.process.wait(timeout=timeout)
        with self._changed:
            self._changed.wait_for(lambda: self._open_streams == 0, timeout=5)
        return code

    def stop(self) -> int:
        """SIGTERM, as Cloud Run stops an instance."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.wait_exit(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback port."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


Launcher = Callable[..., Instance]


@pytest.fixture
def launch() -> Iterator[Launcher]:
    """Start stand-in instances with the Cloud Run stand-in's env contract; all are stopped afterwards."""
    started: list[Instance] = []

    def _launch(
        args: list[str],
        *,
        root: Path,
        entrypoint: str = "exec-args",
        accelerator: str = "nvidia-l4",
        driver_cuda: int = 12020,
        image_cuda: int = 12020,
        container_port: int = 8080,
        mounts: list[dict] | None = None,
        faults: dict | None = None,
        gcs_url: str | None = None,
        time_scale: float = TIME_SCALE,
        env: dict[str, str] | None = None,
    ) -> Instance:
        host_port = free_port()
        contract = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(CHECKOUT),
            "PORT": str(container_port),
            "SANDBOX_IMAGE_ENTRYPOINT": entrypoint,
            "SANDBOX_PORT_MAP": json.dumps({str(container_port): host_port}),
            "SANDBOX_ACCELERATOR": accelerator,
            "SANDBOX_DRIVER_CUDA": str(driver_cuda),
            "SANDBOX_IMAGE_CUDA": str(image_cuda),
            "SANDBOX_MOUNTS": json.dumps(mounts or []),
            "SANDBOX_ROOT": str(root),
            "SANDBOX_TIME_SCALE": repr(time_scale),
            **({"STORAGE_EMULATOR_HOST": gcs_url} if gcs_url else {}),
            **({"SANDBOX_VLLM_FAULTS": json.dumps(faults)} if faults else {}),
            **(env or {}),
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "sandbox.vllm", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=contract,
            cwd=root,
        )
        instance = Instance(process, host_port)
        instance.start_reading()
        started.append(instance)
        return instance

    yield _launch
    for instance in started:
        instance.stop()


def serve(model: str = MODEL_PATH, *flags: str) -> list[str]:
    """Model Garden style args: ``vllm serve MODEL --port 8080 --host 0.0.0.0 --enforce-eager FLAGS``."""
    return ["vllm", "serve", model, "--port", "8080", "--host", "0.0.0.0", "--enforce-eager", *flags]


def chat(url: str, model: str, content: str = "Introduce yourself in one sentence.", **extra: object) -> httpx.Response:
    """POST a one-message chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
