"""What a local source's Dockerfile leaves as the image's ENTRYPOINT decides how the service passes its args."""

from __future__ import annotations

from pathlib import Path

import pytest

from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from blocks.images import ImageBuild
from tasks.image.images import final_stage, keeps_model_garden_launcher

GARDEN = MODEL_GARDEN_VLLM_IMAGE
GARDEN_UPPER_HOST = "US-DOCKER.PKG.DEV/" + GARDEN.split("/", 1)[1]


@pytest.mark.parametrize(
    ("dockerfile", "base", "entrypoint"),
    [
        (f"FROM {GARDEN}\nRUN pip install x\n", GARDEN, False),
        (f'FROM {GARDEN}\nENTRYPOINT ["vllm", "serve"]\n', GARDEN, True),
        (f"FROM --platform=linux/amd64 {GARDEN} AS base\nFROM base\n", GARDEN, False),
        (f'FROM {GARDEN} AS base\nENTRYPOINT ["/run.sh"]\nFROM base AS final\nCOPY a b\n', GARDEN, True),
        (f"# syntax=docker/dockerfile:1\nFROM {GARDEN} AS a\nENTRYPOINT x\nFROM ubuntu:22.04\n", "ubuntu:22.04", False),
        (f"FROM \\\n  {GARDEN}\n", GARDEN, False),
    ],
    ids=["plain", "own-entrypoint", "stage-alias", "inherited-from-stage", "last-stage-other-base", "continuation"],
)
def test_final_stage_follows_stages_and_entrypoints(tmp_path: Path, dockerfile, base, entrypoint):
    (tmp_path / "Dockerfile").write_text(dockerfile)
    assert final_stage(tmp_path / "Dockerfile") == (base, entrypoint)


@pytest.mark.parametrize(
    ("dockerfile", "keeps"),
    [
        (f"FROM {GARDEN}\n", True),
        (f"FROM {GARDEN_UPPER_HOST}\n", True),  # the same image, however the registry host is spelt
        (f'FROM {GARDEN}\nENTRYPOINT ["vllm", "serve"]\n', False),
        ("FROM vllm/vllm-openai:v0.33.0\n", False),
    ],
)
def test_a_build_that_keeps_googles_launcher_is_recognised(tmp_path: Path, dockerfile, keeps):
    (tmp_path / "Dockerfile").write_text(dockerfile)
    assert keeps_model_garden_launcher(ImageBuild(source_dir=str(tmp_path))) is keeps


def test_recipes_and_git_sources_are_taken_as_vllm_serve_images():
    assert not keeps_model_garden_launcher(ImageBuild(recipe="serve-wrapper"))
    assert not keeps_model_garden_launcher(ImageBuild(git_url="https://github.com/vllm-project/vllm", git_ref="v1"))
