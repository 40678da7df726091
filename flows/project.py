"""Where this project lives, for the deployments' pull step.

A flow run starts in a worker's folder: a temporary one on a process worker, the image's WORKDIR in a Cloud Run
job. The deployments' entry points (`flows/promote.py:...`) and model files (`deployments/...`) are relative to
the project, so the pull step moves the run to the folder this package is installed from (an editable install:
the checkout on a laptop, `/opt/hf-cloudrun-pipeline` in ./Dockerfile's image). One pull step serves every
pool; nothing is resolved when `prefect deploy` runs, so no laptop path ends up in a deployment.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

PROJECT_DIR = Path(__file__).resolve().parent.parent


def set_project_directory() -> dict[str, str]:
    """Pull step (`flows.project.set_project_directory: {}` in prefect.yaml): chdir to the project folder."""
    if not (PROJECT_DIR / "prefect.yaml").is_file():
        raise RuntimeError(
            f"{PROJECT_DIR} holds no prefect.yaml: this package is installed as a copy, not from the project "
            "folder; install it with `pip install -e .` from the project (./Dockerfile does)"
        )
    os.chdir(PROJECT_DIR)
    return {"directory": str(PROJECT_DIR)}


def pipeline_pool(prefect_file: Path) -> str:
    """The work pool the prefect file's deployments run on (`definitions.work_pools.pipeline`)."""
    definitions = yaml.safe_load(prefect_file.read_text()).get("definitions") or {}
    try:
        return definitions["work_pools"]["pipeline"]["name"]
    except (KeyError, TypeError):
        raise ValueError(f"{prefect_file}: definitions.work_pools.pipeline.name is missing") from None
