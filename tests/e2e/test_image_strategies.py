"""Every image strategy docs/reference.md offers, promoted end to end and answering a chat through the service URL.

Strategies: the pinned Model Garden image, the serve-wrapper recipe (seed 002), the vllm-cpu recipe (seed 000,
from a local stand-in of vLLM's repository: no network), a local source folder and a git source; each with
every load mode its image supports. The CPU image is built without vLLM's ``runai`` extra, so cpu +
runai-streamer is a preflight refusal, not a strategy (tested with preflight, not here).
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import httpx
import pytest

from blocks import ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from flows.promote import promote_model
from tasks.deploy.probe import VerifyOptions
from tests.support.delivery import NO_WATCH
from tests.support.identity import bearer

pytestmark = pytest.mark.prefect
FAST = VerifyOptions(health_period_s=0.05)
MODEL = "sandbox/tiny-chat"
_ids = itertools.count()
# The expected weight-load rate sizes the startup probe window (tasks/deploy/render.py). A low one gives these runs
# a window of several real seconds, so an image whose entrypoint is a script (a shell, then vLLM) still
# starts within it on a busy 2-core host, where process start-up is real time, not simulated time.
PATIENT_LOAD_RATE_MB_S = 0.02


def patient_profile(preset: str, **overrides) -> str:
    """Save ``preset`` with a patient probe window (and ``overrides``); returns the block name."""
    name = f"img-{preset}-{next(_ids)}"
    ServingProfile.preset(preset, load_rate_mb_s=PATIENT_LOAD_RATE_MB_S, **overrides).save(name, overwrite=True)
    return name


# A customised serving image: Google's L4-ready vLLM image with vLLM's own entrypoint, as a user's folder has it.
LOCAL_DOCKERFILE = f"""\
FROM {MODEL_GARDEN_VLLM_IMAGE}
COPY chat-template.jinja /templates/chat-template.jinja
ENTRYPOINT ["vllm", "serve"]
"""
# The same without an ENTRYPOINT: the image keeps Google's launcher, which execs its args (seed 000), so the render
# must give it `vllm serve ...` as for the pinned image (tasks/image/images.py keeps_model_garden_launcher).
LAUNCHER_DOCKERFILE = f"""\
FROM {MODEL_GARDEN_VLLM_IMAGE} AS base
COPY chat-template.jinja /templates/chat-template.jinja
FROM base
"""
# The shape of vLLM's own Dockerfiles: a CUDA base, a setuptools-scm build that needs .git, max_jobs compile
# jobs, and the vllm-openai stage whose entrypoint is `vllm serve`.
VLLM_LIKE_DOCKERFILE = """\
FROM {base} AS base
ARG max_jobs=2
ENV MAX_JOBS=${{max_jobs}}
COPY . /workspace/vllm
WORKDIR /workspace/vllm
RUN --mount=type=cache,target=/root/.cache/pip python3 setup.py bdist_wheel --dist-dir=dist
FROM base AS vllm-openai
ENTRYPOINT ["vllm", "serve"]
"""


def vllm_like_repo(root: Path, dockerfile_path: str, base: str, tag: str) -> Path:
    """A local git repository shaped like vLLM's (what `git clone` of the real one gives the build)."""
    repo = root / f"repo-{next(_ids)}"
    (repo / dockerfile_path).parent.mkdir(parents=True, exist_ok=True)
    (repo / dockerfile_path).write_text(VLLM_LIKE_DOCKERFILE.format(base=base))
    (repo / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools", "setuptools-scm"]\n')
    (repo / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "release"], ["tag", tag]):
        subprocess.run([*git, *args], cwd=repo, check=True)
    return repo


def local_folder(root: Path, dockerfile: str = LOCAL_DOCKERFILE) -> Path:
    folder = root / f"src-{next(_ids)}"
    folder.mkdir()
    (folder / "Dockerfile").write_text(dockerfile)
    (folder / "chat-template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    return folder


def strategy(name: str, tmp_path: Path) -> tuple[str, dict]:
    """(profile, promote_model keyword arguments) for one image strategy."""
    if name == "model-garden":
        return "l4", {"image": MODEL_GARDEN_VLLM_IMAGE}
    if name == "serve-wrapper":
        return "l4", {"build": {"recipe": "serve-wrapper"}}
    if name == "vllm-cpu":
        # The recipe at its pinned ref, cloned from a local copy shaped like vLLM's repository (no network).
        repo = vllm_like_repo(tmp_path, "docker/Dockerfile.cpu", "ubuntu:22.04", "v0.33.0")
        return "cpu", {"build": {"recipe": "vllm-cpu", "git_url": f"file://{repo}", "max_jobs_ladder": [8]}}
    if name == "local-folder":
        return "l4", {"build": {"source_dir": str(local_folder(tmp_path)), "image_name": "vllm-custom"}}
    if name == "local-folder-launcher":
        folder = local_folder(tmp_path, LAUNCHER_DOCKERFILE)
        return "l4", {"build": {"source_dir": str(folder), "image_name": "vllm-launcher"}}
    if name == "git-source":
        repo = vllm_like_repo(tmp_path, "docker/Dockerfile", "nvidia/cuda:12.1.1-devel-ubuntu22.04", "v1.0")
        build = {"git_url": f"file://{repo}", "git_ref": "v1.0", "dockerfile": "docker/Dockerfile",
                 "target": "vllm-openai", "image_name": "vllm-from-git", "max_jobs_ladder": [8]}  # fmt: skip
        return "l4", {"build": build}
    raise AssertionError(name)


CASES = [
    ("model-garden", "gcs-volume"),
    ("model-garden", "runai-streamer"),
    ("serve-wrapper", "gcs-volume"),
    ("serve-wrapper", "runai-streamer"),
    ("vllm-cpu", "gcs-volume"),
    ("local-folder", "gcs-volume"),
    ("local-folder", "runai-streamer"),
    ("local-folder-launcher", "gcs-volume"),
    ("git-source", "gcs-volume"),
    ("git-source", "runai-streamer"),
]


@pytest.mark.parametrize(("name", "load_mode"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_each_image_strategy_is_promoted_and_answers_a_chat(flow_env, tmp_path, name, load_mode):
    profile, kwargs = strategy(name, tmp_path)
    service = f"img-{name}-{'runai' if load_mode == 'runai-streamer' else 'gcs'}"
    report = promote_model(model=MODEL, service=service, profile=patient_profile(profile), load_mode=load_mode,
                           token_secret_block="sandbox-hf-token", verify=FAST, watch=NO_WATCH, **kwargs)  # fmt: skip
    assert report.outcome == "promoted", report.reason
    assert report.image is not None
    if name == "model-garden":
        assert report.image.image == MODEL_GARDEN_VLLM_IMAGE
    else:  # built by Cloud Build into the target's registry, pinned by digest
        assert ".pkg.dev/" in report.image.image and "@sha256:" in report.image.image
    url = report.service_url
    assert url
    response = httpx.post(
        f"{url}/v1/chat/completions",
        headers=bearer(url),
        timeout=30,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == MODEL
    assert body["choices"][0]["message"]["content"]
    assert response.headers["x-sandbox-revision"] == report.serving_revision


def test_the_serve_wrapper_reaches_the_hub_when_the_profile_asks_for_runtime_access(sb, flow_env):
    """hf_token_at_runtime drops HF_HUB_OFFLINE from the service; the wrapper image must not bake it in either
    (image ENV applies under the container's own env), or its gated tokenizer cannot be fetched at start."""
    tokenizer = "sandbox/gated-chat"
    profile = patient_profile(
        "l4", image=None, build={"recipe": "serve-wrapper"}, hf_token_at_runtime=True,
        vllm={"extra_args": ["--tokenizer", tokenizer]},
    )  # fmt: skip
    since = sb.last_request_seq()
    report = promote_model(model=MODEL, service="img-wrapper-runtime-hub", profile=profile,
                           token_secret_block="sandbox-hf-token", verify=FAST, watch=NO_WATCH)  # fmt: skip
    assert report.outcome == "promoted", report.reason
    hub = sb.requests("hub", since=since)
    # The container's own fetch (transformers' user agent), with the token Cloud Run gave it from Secret Manager.
    fetched = [
        r for r in hub if r["path"].startswith(f"/{tokenizer}/resolve/") and "tokenizer" in r["headers"]["user-agent"]
    ]
    assert fetched and {r["headers"].get("authorization") for r in fetched} == {f"Bearer {sb.hub_token}"}
