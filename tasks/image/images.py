"""Images: the prebuilt pin, or a Cloud Build config rendered from an ImageBuild, tagged by content.

Pure functions here: the image checks of lessons 1 and 2, the content tag (same source, Dockerfile, target
and build args -> same tag, so a second promotion finds the image and builds nothing), and the Cloud Build
config (BuildKit on, lesson 7; .git kept in the source, lesson 8). Packing and submitting live in
tasks/image/builds.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml
from google.cloud.devtools import cloudbuild_v1
from google.protobuf import duration_pb2, json_format

from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from blocks.images import ImageBuild
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.common.naming import repository_host
from tasks.image.build_context import context_files
from tasks.image.image_reference import InvalidImageReference, parse_image_reference, same_repository

DOCKER_BUILDER = "gcr.io/cloud-builders/docker"
GENERIC_VLLM_IMAGE = "vllm/vllm-openai"  # on Docker Hub; the CUDA it is built for is newer than the L4 driver
RECIPES_DIR = Path(__file__).parent / "recipes"
SOURCES_PREFIX = "cloudbuild-sources"
LOGS_PREFIX = "cloudbuild-logs"


def prebuilt_findings(profile: ServingProfile) -> list[str]:
    """What is wrong with a prebuilt image choice before anything is deployed (lessons 1 and 2). The image is
    parsed as Docker parses it (tasks/image/image_reference.py), so every spelling of the generic vLLM image is caught:
    any Docker Hub host name or case, ``library/``, a tag, a digest or both, a mirror such as mirror.gcr.io."""
    image = profile.image
    if image is None:
        return []
    try:
        ref = parse_image_reference(image)
    except InvalidImageReference as exc:
        return [f"image: {exc}"]
    findings = []
    if ref.is_image(GENERIC_VLLM_IMAGE) and profile.gpu_type == "nvidia-l4" and not profile.allow_generic_vllm_image:
        findings.append(
            f"image: {image} is {GENERIC_VLLM_IMAGE} (or a copy of it), built for a newer CUDA than the L4's driver "
            f'(535 / CUDA 12.2), and fails with "The NVIDIA driver on your system is too old"; use '
            f"{MODEL_GARDEN_VLLM_IMAGE}, or set allow_generic_vllm_image if you know the tag runs on CUDA 12.2"
        )
    if not ref.pinned:
        findings.append(f"image: {image} is not pinned; name a tag other than latest, or a digest")
    return findings


def image_repo_uri(target: GcpTarget, build: ImageBuild) -> str:
    return f"{repository_host(target)}/{build.image_name}"


def tree_digest(folder: Path, dockerfile: str = "Dockerfile") -> str:
    """sha256 over the path, executable bit and content of every file the build context carries (its
    .dockerignore applied, tasks/image/build_context.py); .git is left out (its bookkeeping churns)."""
    digest = hashlib.sha256()
    files = context_files(folder, dockerfile)
    for path in (p for p in files if p.is_file() and ".git" not in p.relative_to(folder).parts):
        mode = path.stat().st_mode
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(b"x" if mode & stat.S_IXUSR else b"-")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def recipe_folder(build: ImageBuild) -> Path | None:
    """The built-in source folder of a recipe that ships its own Dockerfile."""
    return RECIPES_DIR / "serve_wrapper" if build.recipe == "serve-wrapper" else None


def effective_build_args(build: ImageBuild) -> dict[str, str]:
    args = dict(build.build_args)
    if build.recipe == "serve-wrapper":
        args.setdefault("BASE_IMAGE", build.base_image or MODEL_GARDEN_VLLM_IMAGE)
    return args


def content_tag(build: ImageBuild, source_digest: str) -> str:
    """The image tag: a digest of what determines the image. max_jobs is left out: it changes speed, not bytes."""
    inputs = {
        "source": source_digest,
        "dockerfile": build.dockerfile,
        "target": build.target,
        "build_args": effective_build_args(build),
    }
    return "src-" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class BuildPlan:
    """Where one build's source, image and logs go."""

    image: str  # LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE
    tag: str
    source_bucket: str
    source_object: str
    logs_bucket: str

    @property
    def tagged(self) -> str:
        return f"{self.image}:{self.tag}"


def build_plan(target: GcpTarget, build: ImageBuild, tag: str) -> BuildPlan:
    return BuildPlan(
        image=image_repo_uri(target, build),
        tag=tag,
        # The build bucket, not the model bucket: the build identity administers it (tasks/infra/build_identity.py).
        source_bucket=target.build_bucket_name,
        source_object=f"{SOURCES_PREFIX}/{build.image_name}/{tag}.tar.gz",
        logs_bucket=f"gs://{target.build_bucket_name}/{LOGS_PREFIX}",
    )


def docker_build_args(build: ImageBuild, plan: BuildPlan, max_jobs: int) -> list[str]:
    args = ["build", "-f", build.dockerfile]
    if build.target:
        args += ["--target", build.target]
    args += ["--build-arg", f"max_jobs={max_jobs}"]
    for key, value in sorted(effective_build_args(build).items()):
        args += ["--build-arg", f"{key}={value}"]
    return [*args, "-t", plan.tagged, "."]


def render_build(target: GcpTarget, build: ImageBuild, plan: BuildPlan, max_jobs: int) -> cloudbuild_v1.Build:
    """The Cloud Build request for one attempt of the ladder."""
    return cloudbuild_v1.Build(
        source=cloudbuild_v1.Source(
            storage_source=cloudbuild_v1.StorageSource(bucket=plan.source_bucket, object_=plan.source_object)
        ),
        steps=[
            cloudbuild_v1.BuildStep(
                name=DOCKER_BUILDER,
                env=["DOCKER_BUILDKIT=1"],  # RUN --mount needs BuildKit; the classic builder has it off (lesson 7)
                args=docker_build_args(build, plan, max_jobs),
            )
        ],
        images=[plan.tagged],
        timeout=duration_pb2.Duration(seconds=build.timeout_seconds),
        options=cloudbuild_v1.BuildOptions(
            machine_type=cloudbuild_v1.BuildOptions.MachineType[build.machine_type],
            disk_size_gb=build.disk_size_gb,
            # A build with its own serviceAccount must say where logs go (else 400); ours go to the build bucket
            # only, which the build identity administers (tasks/infra/build_identity.py): no Cloud Logging role needed.
            logging=cloudbuild_v1.BuildOptions.LoggingMode.GCS_ONLY,
        ),
        logs_bucket=plan.logs_bucket,
        # The dedicated least-privilege build identity, not the project's default one (tasks/infra/build_identity.py).
        service_account=f"projects/{target.project}/serviceAccounts/{target.build_service_account_email}",
        tags=["hf-cloudrun-pipeline", build.image_name.replace("/", "-"), f"max-jobs-{max_jobs}"],
    )


def render_build_yaml(build_request: cloudbuild_v1.Build) -> str:
    """The same build as a cloudbuild.yaml for `gcloud builds submit --config cloudbuild.yaml SOURCE`."""
    data = json_format.MessageToDict(cloudbuild_v1.Build.pb(build_request))
    data.pop("source", None)  # gcloud uploads the folder given on its command line
    return yaml.safe_dump(data, sort_keys=False)


def _dockerfile_instructions(text: str) -> list[list[str]]:
    """A Dockerfile's instructions as words, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\[ \t]*\n", " ", text)
    lines = (line.strip() for line in joined.splitlines())
    return [line.split() for line in lines if line and not line.startswith("#")]


def final_stage(dockerfile: Path) -> tuple[str | None, bool]:
    """The base image the last stage of ``dockerfile`` ends up on (stage names followed) and whether it, or a stage
    it builds on, sets its own ENTRYPOINT (Dockerfile reference: an ENTRYPOINT is inherited from the base image
    unless the stage sets one, https://docs.docker.com/reference/dockerfile/#entrypoint)."""
    stages: dict[str, tuple[str, bool]] = {}
    base: str | None = None
    current: str | None = None
    entrypoint = False
    for words in _dockerfile_instructions(dockerfile.read_text(encoding="utf-8", errors="replace")):
        instruction = words[0].upper()
        if instruction == "FROM":
            args = [w for w in words[1:] if not w.startswith("--")]
            if not args:
                continue
            base, entrypoint = stages.get(args[0].lower(), (args[0], False))
            if len(args) >= 3 and args[1].upper() == "AS":
                stages[args[2].lower()] = (base, entrypoint)
            current = args[2].lower() if len(args) >= 3 and args[1].upper() == "AS" else None
        elif instruction == "ENTRYPOINT" and base is not None:
            entrypoint = True
            if current:
                stages[current] = (base, True)
    return base, entrypoint


def keeps_model_garden_launcher(build: ImageBuild) -> bool:
    """Whether a local source's image ends on Google's Model Garden vLLM image without an ENTRYPOINT of its own:
    it keeps the launcher that execs its args (seed 000), so they must begin ``vllm serve``. Only a folder can be
    read before the build; a git source and the recipes are taken as ``vllm serve`` images."""
    if build.recipe or not build.source_dir:
        return False
    dockerfile = Path(os.path.expanduser(build.source_dir)) / build.dockerfile
    if not dockerfile.is_file():
        return False
    base, entrypoint = final_stage(dockerfile)
    return base is not None and not entrypoint and same_repository(base, MODEL_GARDEN_VLLM_IMAGE)


def check_local_source(build: ImageBuild) -> Path | None:
    """The local folder to build, checked before anything is uploaded."""
    folder = recipe_folder(build) or (Path(os.path.expanduser(build.source_dir)) if build.source_dir else None)
    if folder is None:
        return None
    if not folder.is_dir():
        raise ValueError(f"build.source_dir '{folder}' is not a folder")
    if not (folder / build.dockerfile).is_file():
        raise ValueError(
            f"build.dockerfile: '{build.dockerfile}' not found in {folder}; set dockerfile to the Dockerfile's path "
            "inside the source folder"
        )
    return folder
