"""A copy of the project as its worker image's build context holds it, changed as a team changes it (a model file of
its own), for the tests of a pool image that no longer holds the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tasks.image.build_context import context_files

ROOT = Path(__file__).resolve().parents[2]
NEW_MODEL = """model: sandbox/tiny-llama
revision: main
profile: cpu
target: production
service: team-llama
"""


def copy_of_project(folder: Path) -> Path:
    """The project's build context (.dockerignore applied), copied to ``folder``."""
    for path in context_files(ROOT):
        dest = folder / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    return folder


def add_model_file(project: Path) -> str:
    """What a team does to serve a model of its own: a file in deployments/ (the shipped examples deleted, as their
    header says), then `python -m flows.sync_deployments` writes its deployments into prefect.yaml. Returns the
    model's deployment name."""
    for example in (project / "deployments").glob("gemma-*.yaml"):
        example.unlink()
    name = f"team-llama-{uuid.uuid4().hex[:8]}"
    (project / "deployments" / f"{name}.yaml").write_text(NEW_MODEL)
    done = subprocess.run([sys.executable, "-m", "flows.sync_deployments"], cwd=project, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"spec_file: deployments/{name}.yaml" in (project / "prefect.yaml").read_text()
    return name
