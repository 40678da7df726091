"""Image choices and Cloud Build configs: pure rendering, compared with what the seeds say works."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from blocks import GcpTarget, ImageBuild, ModelSource, ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from tasks.deploy.render import Weights, render_service
from tasks.image.images import (
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
    # The build bucket, never the model bucket: the build identity holds Storage Admin there.
    assert config["logsBucket"] == "gs://acme-ml-prod-asia-southeast1-hf-builds/cloudbuild-logs"
    assert "source" not in config  # gcloud builds submit uploads the folder it is given
    # Seed 000 builds as the project's default identity; ours is the dedicated build account, and a build with its
    # own account must name its logging (Cloud Build answers 400 otherwise): the bucket only.
    assert config["serviceAccount"] == (
        "projects/acme-ml-prod/serviceAccounts/hf-cloudrun-build@acme-ml-prod.iam.gserviceaccount.com"
    )
    assert config["options"]["logging"] == "GCS_ONLY"


def test_the_recipe_pins_vllm_and_keeps_the_ladder_of_lesson_7():
    build = cpu_build()
    assert build.git_url == "https://github.com/vllm-project/vllm.git"
    assert build.git_ref.startswith("v")  # a tag, not a moving branch (lesson 10)
    assert build.ladder == [32, 16, 8, 4]
    request = render_build(TARGET, build, build_plan(TARGET, build, "t"), max_jobs=16)
    assert request.source.storage_source.bucket == "acme-ml-prod-asia-southeast1-hf-builds"
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
    by_digest = f"{MODEL_GARDEN_VLLM_IMAGE.split(':')[0]}@sha256:{'ab' * 32}"  # a digest is 64 hex digits
    assert prebuilt_findings(ServingProfile.preset("l4", image=by_digest)) == []


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [tuple(line.split(" ", 1)) for line in lines if line and not line.startswith("#")]


def run_entrypoint(script: Path, tmp_path: Path, env: dict[str, str], args: list[str]) -> list[str]:
    """Run the recipe's entrypoint as the container would, with a `vllm` on PATH that records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "vllm"
    stub.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    stub.chmod(0o755)
    out = tmp_path / "argv"
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_OUT": str(out), **env}
    subprocess.run(["sh", str(script), *args], env=environment, check=True, capture_output=True, text=True)
    return out.read_text().split("\0")[:-1]


def test_serve_wrapper_recipe_matches_seed_002s_wrapper_image_and_build(tmp_path: Path):
    """Field by field against seed 002_bedd7fb1ffced183.txt (vLLM wrapper image, Cloud Build, Cloud Run)."""
    build = ImageBuild(recipe="serve-wrapper")
    folder = check_local_source(build)
    tag = content_tag(build, f"tree:{tree_digest(folder)}")
    plan = build_plan(TARGET, build, tag)
    request = render_build(TARGET, build, plan, max_jobs=8)
    config = yaml.safe_load(render_build_yaml(request))
    image = f"asia-southeast1-docker.pkg.dev/acme-ml-prod/vllm-images/vllm-serve:{tag}"

    # The Dockerfile: seed 002 is `FROM vllm/vllm-openai:latest`, ENV HF_HUB_OFFLINE=1 and a shell ENTRYPOINT.
    assert dockerfile_instructions(folder / "Dockerfile") == [
        ("ARG", "BASE_IMAGE"),
        ("FROM", "${BASE_IMAGE}"),  # seed 002_bedd7fb1ffced183: vllm/vllm-openai:latest; ours Model Garden (lesson 1)
        # No ENV HF_HUB_OFFLINE=1 (seed 002 bakes it in): the service sets it unless the profile asks for runtime
        # Hub access, which an image ENV would silently defeat (issue 14). HF_HOME: MODEL_PATH needs none.
        ("COPY", "serve-model.sh /usr/local/bin/serve-model"),
        ("RUN", "chmod 0755 /usr/local/bin/serve-model"),
        ("ENTRYPOINT", '["/usr/local/bin/serve-model"]'),  # seed 002_bedd7fb1ffced183: shell-form api_server
    ]
    assert f"BASE_IMAGE={MODEL_GARDEN_VLLM_IMAGE}" in config["steps"][0]["args"]
    assert not MODEL_GARDEN_VLLM_IMAGE.endswith(":latest")  # seed 002_bedd7fb1ffced183 builds on :latest; ours pinned

    # How the model, its served name and the port reach vLLM: 002 reads MODEL_NAME and PORT from the env.
    profile = ServingProfile.preset("l4", image=None, build=build)
    weights = Weights(
        repo_id="deepseek-ai/DeepSeek-R1-Distill-Llama-8B", commit="f" * 40, bucket=TARGET.bucket_name,
        object_prefix=f"model-cache/deepseek-ai/DeepSeek-R1-Distill-Llama-8B/{'f' * 40}", total_bytes=16 * 10**9,
    )  # fmt: skip
    source = ModelSource(repo_id=weights.repo_id)
    container = render_service(profile, TARGET, source, weights, image).template.containers[0]
    env = {e.name: e.value for e in container.env if not e.value_source}
    assert env["MODEL_PATH"] == f"/mnt/models/deepseek-ai/DeepSeek-R1-Distill-Llama-8B/{'f' * 40}"
    assert env["SERVED_MODEL_NAME"] == "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"
    assert "MODEL_NAME" not in env and "HF_HOME" not in env  # seed 002_bedd7fb1ffced183: repo id + HF_HOME cache
    assert "PORT" not in env and container.ports[0].container_port == 8080  # Cloud Run sets PORT, as in 002
    run_env = {**env, "PORT": str(container.ports[0].container_port)}
    argv = run_entrypoint(folder / "serve-model.sh", tmp_path, run_env, list(container.args))
    assert argv[:8] == [
        "serve", env["MODEL_PATH"],  # seed 002_bedd7fb1ffced183: `--model $MODEL_NAME`; ours the positional folder
        "--served-model-name", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",  # 002 serves under the repo id too
        "--host", "0.0.0.0",
        "--port", "8080",  # 002: `--port ${PORT:-8080}`, the same
    ]  # fmt: skip
    assert argv[8:] == list(container.args)  # the profile's flags, once each, after the wrapper's own
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"  # seed 002_bedd7fb1ffced183: env, 0.95
    assert argv[argv.index("--max-model-len") + 1] == "8192"  # seed 002_bedd7fb1ffced183: optional ${MAX_MODEL_LEN}
    assert "--trust-remote-code" not in argv  # seed 002_bedd7fb1ffced183 always passes it; ours via extra_args only
    for flag in ("--served-model-name", "--host", "--port"):
        assert argv.count(flag) == 1

    # The build: 002 runs `gcloud builds submit --tag REGION-docker.pkg.dev/PROJECT/REPO/vllm` on the folder.
    (step,) = config["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker" and step["env"] == ["DOCKER_BUILDKIT=1"]
    assert step["args"] == [
        "build", "-f", "Dockerfile", "--build-arg", "max_jobs=8",
        "--build-arg", f"BASE_IMAGE={MODEL_GARDEN_VLLM_IMAGE}", "-t", image, ".",
    ]  # fmt: skip
    assert config["images"] == [image]  # seed 002_bedd7fb1ffced183 pushes :latest; ours a content tag
    assert tag.startswith("src-")
    assert request.source.storage_source.object_ == f"cloudbuild-sources/vllm-serve/{tag}.tar.gz"
    # seed 002_bedd7fb1ffced183 takes Cloud Build's default machine, disk, 10-min timeout; ours the vllm-cpu sizing
    assert config["options"] == {"machineType": "E2_HIGHCPU_32", "diskSizeGb": "200", "logging": "GCS_ONLY"}
    assert config["timeout"] == "7200s"
    assert config["tags"] == ["hf-cloudrun-pipeline", "vllm-serve", "max-jobs-8"]  # seed 002_bedd7fb1ffced183: none
    assert config["logsBucket"] == f"gs://{TARGET.build_bucket_name}/cloudbuild-logs"
    assert "availableSecrets" not in config  # as seed 002_bedd7fb1ffced183: the image build needs no secret


def test_serve_wrapper_refuses_to_start_without_a_model_path(tmp_path: Path):
    script = check_local_source(ImageBuild(recipe="serve-wrapper")) / "serve-model.sh"
    with pytest.raises(subprocess.CalledProcessError) as caught:
        run_entrypoint(script, tmp_path, {}, [])
    assert "set MODEL_PATH to the staged model folder" in caught.value.stderr


def test_a_serve_wrapper_base_image_override_reaches_the_build_and_the_tag():
    default, custom = ImageBuild(recipe="serve-wrapper"), ImageBuild(recipe="serve-wrapper", base_image="b:1")
    args = list(render_build(TARGET, custom, build_plan(TARGET, custom, "t"), 8).steps[0].args)
    assert "BASE_IMAGE=b:1" in args and f"BASE_IMAGE={MODEL_GARDEN_VLLM_IMAGE}" not in args
    assert content_tag(custom, "tree:1") != content_tag(default, "tree:1")
