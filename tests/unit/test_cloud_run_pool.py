"""A flow run on the Cloud Run pool finds the project where the image put it.

prefect-gcp's worker replaces the image's ENTRYPOINT with `prefect flow-run execute` and sets no workingDir, so
the container starts in the image's WORKDIR; the engine runs the deployment's pull steps, then loads the
entrypoint (`flows/...py:flow`) relative to where they left it. tests/unit/test_work_pool.py checks the job body
itself (built by prefect-gcp's own configuration model from the pool's filled template, against run.v2's Job).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from flows.project import PROJECT_DIR, set_project_directory
from tasks.image.build_context import context_files

ROOT = Path(__file__).resolve().parents[2]
PREFECT_FILES = [ROOT / "prefect.yaml", ROOT / "sandbox" / "prefect.yaml"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_every_deployment_moves_its_run_to_the_folder_the_package_is_installed_from():
    for path in PREFECT_FILES:
        data = yaml.safe_load(path.read_text())
        assert data["pull"] == [{"flows.project.set_project_directory": {}}], path
        assert not [d["name"] for d in data["deployments"] if "pull" in d], f"{path}: a deployment overrides pull"


def test_the_image_installs_the_project_editable_in_its_workdir_so_the_pull_step_lands_there():
    [workdir] = re.findall(r"^WORKDIR\s+(\S+)\s*$", DOCKERFILE, flags=re.MULTILINE)
    copy = re.search(r"^COPY\s+\.\s+\.\s*$", DOCKERFILE, flags=re.MULTILINE)
    install = re.search(r"^RUN pip install .*-e \.\s*$", DOCKERFILE, flags=re.MULTILINE)
    assert copy and install and copy.start() < install.start(), "COPY . . then an editable install, in WORKDIR"
    # An editable install imports flows/ from the copied tree, so PROJECT_DIR (flows/..) is the WORKDIR there;
    # here it is this checkout.
    assert PROJECT_DIR == ROOT
    assert workdir == "/opt/hf-cloudrun-pipeline"


def test_the_pull_step_moves_a_run_from_anywhere_to_the_project(tmp_path):
    before = Path.cwd()
    os.chdir(tmp_path)  # a process worker starts runs in a temporary folder
    try:
        assert set_project_directory() == {"directory": str(ROOT)}
        assert Path.cwd() == ROOT
    finally:
        os.chdir(before)


def test_the_build_context_holds_every_entrypoint_and_model_file_a_deployment_names():
    """What Cloud Build uploads (the .dockerignore rules applied) is what the image holds."""
    shipped = {path.relative_to(ROOT).as_posix() for path in context_files(ROOT)}
    for path in PREFECT_FILES:
        for deployment in yaml.safe_load(path.read_text())["deployments"]:
            assert deployment["entrypoint"].partition(":")[0] in shipped, deployment["name"]
            spec = (deployment.get("parameters") or {}).get("spec_file")
            assert spec is None or spec in shipped, spec
    assert {"prefect.yaml", "pyproject.toml", "flows/project.py"} <= shipped
