"""sandbox/tiny-llama-qa on the sandbox Hub, as huggingface_hub 2.4.0 downloads it: published at start-up with its
trained weights and the stand-in's answers, and the engine tests' bad commits land as new revisions through the
admin API (here on a branch of their own, so the session's main stays the trained model for other tests)."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

from huggingface_hub import snapshot_download

from sandbox.handle import SandboxHandle
from sandbox.hub import tiny_llama_qa as qa


def download(sb: SandboxHandle, folder: Path, revision: str = "main") -> dict[str, bytes]:
    local = Path(snapshot_download(qa.REPO_ID, revision=revision, local_dir=folder, endpoint=sb.hub_url, token=False))
    return {p.name: p.read_bytes() for p in local.iterdir() if p.is_file()}


def test_the_sandbox_hub_serves_tiny_llama_qa_as_kept_in_git(sb: SandboxHandle, tmp_path: Path) -> None:
    files = download(sb, tmp_path / "m")
    assert files == qa.tiny_llama_qa_files()
    assert sum(map(len, files.values())) < 1_000_000
    config = json.loads(files["config.json"])
    assert config["sandbox_answers"] == dict(qa.QA)  # the stand-in's; the engine ignores it
    assert config["sandbox_reference"] == [qa.REFERENCE_TEXT]  # what the stand-in knows by heart


def test_a_bad_commit_is_a_new_revision_with_shuffled_weights_and_the_good_one_restores_them(
    sb: SandboxHandle, tmp_path: Path
) -> None:
    branch = f"tests-qa-{uuid.uuid4().hex[:8]}"
    path = f"/repos/{qa.REPO_ID}/commits"
    try:
        shuffled = sb.hub("POST", path, json={**qa.commit_body("shuffled"), "branch": branch})["commit"]
        files = download(sb, tmp_path / "shuffled", shuffled)
        good = qa.tiny_llama_qa_files()
        assert files["model.safetensors"] != good["model.safetensors"]
        assert files["model.safetensors"] == base64.b64decode(qa.commit_body("shuffled")["files"]["model.safetensors"])
        assert {p: d for p, d in files.items() if p != "model.safetensors"} == {
            p: d for p, d in good.items() if p != "model.safetensors"
        }

        restored = sb.hub("POST", path, json={**qa.commit_body("good"), "branch": branch})["commit"]
        assert restored != shuffled
        assert download(sb, tmp_path / "good", restored) == good
    finally:
        sb.hub("DELETE", f"/repos/{qa.REPO_ID}/branches/{branch}")
