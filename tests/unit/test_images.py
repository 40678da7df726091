"""Image choices and Cloud Build configs: pure rendering, compared with what the seeds say works."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from blocks import GcpTarget, ImageBuild, ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from tasks.images import (
    build_plan,
    check_local_source,
    content_tag,
    prebuilt_findings,
    render_build,
    render_build_yaml,
    tree_digest,
)

TARGET = GcpTarget(project="acme-ml-prod", region="asia-southeast1", artifact_repository="vllm-images")


def cpu_build(**overrides) -> ImageBuild:
    return ImageBuild(recipe="vllm-cpu", **overrides)


def test_vllm_cpu_recipe_renders_seed_000s_cloudbuild_yaml():
    build = cpu_build()
    plan = build_plan(TARGET, build, "src-abc")
    config = yaml.safe_load(render_build_yaml(render_build(TARGET, build, plan, max_jobs=8)))
    (step,) = config["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker"
    assert step["env"] == ["DOCKER_BUILDKIT=1"]
    image = "asia-southeast1-docker.pkg.dev/acme-ml-prod/vllm-images/vllm-cpu:src-abc"
    assert step["args"] == [
        "build", "-f", "docker/Dockerfile.cpu", "--target", "vllm-openai", "--build-arg", "max_jobs=8",
        "-t", image, ".",
    ]  # fmt: skip
    assert config["images"] == [image]
    assert config["options"]["machineType"] == "E2_HIGHCPU_32"
    assert config["timeout"] == "7200s"
    assert config["logsBucket"] == f"gs://{TARGET.bucket_name}/cloudbuild-logs"
    assert "source" not in config  # gcloud builds submit uploads the folder it is given


def test_the_recipe_pins_vllm_and_keeps_the_ladder_of_lesson_7():
    build = cpu_build()
    assert build.git_url == "https://github.com/vllm-project/vllm.git"
    assert build.git_ref.startswith("v")  # a tag, not a moving branch (lesson 10)
    assert build.ladder == [32, 16, 8, 4]
    request = render_build(TARGET, build, build_plan(TARGET, build, "t"), max_jobs=16)
    assert request.source.storage_source.object_ == "cloudbuild-sources/vllm-cpu/t.tar.gz"
    assert "max-jobs-16" in request.tags


def test_serve_wrapper_recipe_builds_on_the_model_garden_image(tmp_path):
    build = ImageBuild(recipe="serve-wrapper")
    args = list(render_build(TARGET, build, build_plan(TARGET, build, "t"), 8).steps[0].args)
    assert f"BASE_IMAGE={MODEL_GARDEN_VLLM_IMAGE}" in args
    assert check_local_source(build).name == "serve_wrapper"  # ships its own Dockerfile and entrypoint


def test_content_tag_changes_with_what_changes_the_image_but_not_with_max_jobs():
    base = ImageBuild(source_dir="/src", target="runtime", build_args={"PYTHON": "3.12"})
    tag = content_tag(base, "tree:1")
    assert content_tag(base, "tree:1") == tag
    assert content_tag(base.model_copy(update={"max_jobs_ladder": [8, 4]}), "tree:1") == tag
    assert content_tag(base, "tree:2") != tag
    assert content_tag(base.model_copy(update={"target": "dev"}), "tree:1") != tag
    assert content_tag(base.model_copy(update={"build_args": {"PYTHON": "3.11"}}), "tree:1") != tag
    assert content_tag(base.model_copy(update={"dockerfile": "Dockerfile.gpu"}), "tree:1") != tag


def test_tree_digest_follows_content_and_ignores_git_bookkeeping(tmp_path: Path):
    (tmp_path / "Dockerfile").write_text("FROM python:3.12\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_bytes(b"1")
    first = tree_digest(tmp_path)
    (tmp_path / ".git" / "index").write_bytes(b"2")
    assert tree_digest(tmp_path) == first
    (tmp_path / "Dockerfile").write_text("FROM python:3.13\n")
    assert tree_digest(tmp_path) != first


def test_a_source_folder_without_its_dockerfile_is_refused_before_upload(tmp_path: Path):
    with pytest.raises(ValueError, match=r"build\.dockerfile: 'Dockerfile' not found in .*set dockerfile"):
        check_local_source(ImageBuild(source_dir=str(tmp_path)))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, "give exactly one source"),
        ({"git_url": "https://example.com/r.git"}, "build.git_ref: pin the git source"),
        ({"source_dir": "/s", "git_url": "https://e/r.git", "git_ref": "main"}, "give exactly one source"),
        ({"source_dir": "/s", "max_jobs_ladder": [8, 16]}, "largest first"),
        ({"source_dir": "/s", "max_jobs_floor": 64}, "max_jobs_floor (64) is above the first rung"),
        ({"source_dir": "/s", "build_args": {"max_jobs": "4"}}, "max_jobs is set per attempt"),
        ({"source_dir": "/s", "image_name": "Bad Name"}, "build.image_name 'Bad Name'"),
        ({"source_dir": "/s", "machine_type": "N1_HIGHCPU_96"}, "machine_type"),
    ],
)
def test_bad_build_settings_name_the_field(values, expected):
    with pytest.raises(ValidationError) as caught:
        ImageBuild(**values)
    assert expected in str(caught.value)


def test_generic_vllm_image_on_an_l4_is_refused_unless_overridden():
    generic = "vllm/vllm-openai:v0.33.0"
    findings = prebuilt_findings(ServingProfile.preset("l4", image=generic))
    assert len(findings) == 1 and "The NVIDIA driver on your system is too old" in findings[0]
    assert prebuilt_findings(ServingProfile.preset("l4", image=generic, allow_generic_vllm_image=True)) == []
    assert prebuilt_findings(ServingProfile.preset("rtx-pro-6000", image=generic)) == []  # driver 580 runs it
    assert prebuilt_findings(ServingProfile.preset("l4")) == []


def test_unpinned_images_are_flagged():
    assert "is not pinned" in prebuilt_findings(ServingProfile.preset("rtx-pro-6000", image="vllm/vllm-openai"))[0]
    latest = prebuilt_findings(ServingProfile.preset("rtx-pro-6000", image="vllm/vllm-openai:latest"))
    assert "is not pinned" in latest[0]
    assert (
        prebuilt_findings(ServingProfile.preset("l4", image=f"{MODEL_GARDEN_VLLM_IMAGE.split(':')[0]}@sha256:ab")) == []
    )
