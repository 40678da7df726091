"""Image references are read as Docker reads them (distribution/reference normalize.go): the generic-image guard
(lesson 1: vllm/vllm-openai does not run on the L4's CUDA 12.2 driver) catches every spelling of that image, and
the pin check reads tags and digests from the parsed reference, not from where a colon happens to be."""

from __future__ import annotations

import pytest

from blocks import ServingProfile
from blocks.hardware import MODEL_GARDEN_VLLM_IMAGE
from tasks.image.image_reference import InvalidImageReference, parse_image_reference
from tasks.image.images import prebuilt_findings

DIGEST = "sha256:" + "0123456789abcdef" * 4

# Every one of these pulls vllm/vllm-openai from Docker Hub (or Google's cache of it), pinned.
GENERIC_SPELLINGS = [
    "vllm/vllm-openai:v0.33.0",
    "docker.io/vllm/vllm-openai:v0.33.0",
    "index.docker.io/vllm/vllm-openai:v0.33.0",
    "registry-1.docker.io/vllm/vllm-openai:v0.33.0",
    "registry.hub.docker.com/vllm/vllm-openai:v0.33.0",
    "Docker.IO/vllm/vllm-openai:v0.33.0",
    "REGISTRY-1.DOCKER.IO/vllm/vllm-openai:v0.33.0",
    f"vllm/vllm-openai@{DIGEST}",
    f"vllm/vllm-openai:v0.33.0@{DIGEST}",
    f"docker.io/vllm/vllm-openai:latest@{DIGEST}",
    "mirror.gcr.io/vllm/vllm-openai:v0.33.0",
    # A pull-through cache (an Artifact Registry remote repository of Docker Hub) keeps the Hub path.
    "us-central1-docker.pkg.dev/acme/dockerhub/vllm/vllm-openai:v0.33.0",
]


@pytest.mark.parametrize("image", GENERIC_SPELLINGS)
def test_every_spelling_of_the_generic_image_is_refused_on_an_l4(image: str) -> None:
    findings = prebuilt_findings(ServingProfile.preset("l4", image=image))
    assert len(findings) == 1, findings
    assert findings[0].startswith(f"image: {image} ") and "allow_generic_vllm_image" in findings[0]
    assert MODEL_GARDEN_VLLM_IMAGE in findings[0]  # the fix names the image that runs
    assert prebuilt_findings(ServingProfile.preset("l4", image=image, allow_generic_vllm_image=True)) == []


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai-cpu:v0.33.0",  # another repository of the same namespace
        "acme/vllm/vllm-openai-fork:v1",
        "ghcr.io/acme/vllm-openai:v1",  # same last component, other path
        "docker.io/library/vllm-openai:v1",
        MODEL_GARDEN_VLLM_IMAGE,
    ],
)
def test_other_images_are_not_taken_for_the_generic_one(image: str) -> None:
    assert prebuilt_findings(ServingProfile.preset("l4", image=image)) == []


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("vllm/vllm-openai", False),
        ("vllm/vllm-openai:latest", False),
        ("localhost:5000/vllm", False),  # the colon is a port, not a tag
        ("127.0.0.1:5000/team/vllm", False),
        ("localhost:5000/vllm:v1", True),
        (f"vllm/vllm-openai:latest@{DIGEST}", True),  # the digest is what is pulled
        (f"mirror.gcr.io/vllm/vllm-openai@{DIGEST}", True),
    ],
)
def test_pinning_is_read_from_the_parsed_reference(image: str, pinned: bool) -> None:
    findings = prebuilt_findings(ServingProfile.preset("rtx-pro-6000", image=image))
    assert findings == ([] if pinned else [f"image: {image} is not pinned; name a tag other than latest, or a digest"])


@pytest.mark.parametrize(
    ("text", "domain", "path", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", None, None),
        ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None),
        ("docker.io/ubuntu", "docker.io", "library/ubuntu", None, None),
        ("index.docker.io/library/ubuntu", "docker.io", "library/ubuntu", None, None),
        ("mirror.gcr.io/ubuntu", "mirror.gcr.io", "library/ubuntu", None, None),
        ("vllm/vllm-openai:v0.33.0", "docker.io", "vllm/vllm-openai", "v0.33.0", None),
        (f"Registry-1.Docker.io/vllm/vllm-openai:v1@{DIGEST}", "docker.io", "vllm/vllm-openai", "v1", DIGEST),
        ("localhost/vllm", "localhost", "vllm", None, None),
        ("localhost:5000/a/b:t", "localhost:5000", "a/b", "t", None),
        ("[::1]:5000/a", "[::1]:5000", "a", None, None),
        ("US-docker.pkg.dev/p/r/i:t", "us-docker.pkg.dev", "p/r/i", "t", None),
        ("a__b/c--d.e:T_1", "docker.io", "a__b/c--d.e", "T_1", None),
    ],
)
def test_references_are_normalised_as_docker_does(text, domain, path, tag, digest) -> None:
    ref = parse_image_reference(text)
    assert (ref.domain, ref.path, ref.tag, ref.digest) == (domain, path, tag, digest)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("vllm/VLLM-openai:v1", "must be lowercase"),
        ("vllm/vllm-openai:", "is not an image reference"),
        ("vllm/vllm-openai@sha256:ab", "is not an image reference"),  # a digest has at least 32 hex digits
        ("vllm//vllm-openai", "is not an image reference"),
        ("-vllm/x", "is not an image reference"),
        (" vllm/vllm-openai:v1", "surrounded by spaces"),
        ("", "empty"),
        ("0123456789abcdef" * 4, "image ID"),
        ("a/" + "b" * 256, "longer than 255"),
    ],
)
def test_malformed_references_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(InvalidImageReference, match=reason):
        parse_image_reference(text)


def test_a_malformed_image_is_a_finding_that_names_the_field() -> None:
    findings = prebuilt_findings(ServingProfile.preset("rtx-pro-6000", image="vllm/vllm-openai:v1 "))
    assert len(findings) == 1 and findings[0].startswith("image: ") and "spaces" in findings[0]


@pytest.mark.parametrize("image", [i for i in GENERIC_SPELLINGS if ".pkg.dev/" not in i])
def test_the_sandbox_cloud_run_pulls_every_hub_spelling_as_the_generic_image(image: str) -> None:
    """Cloud Run pulls the same image whichever Docker Hub host (or mirror.gcr.io) names it: the sandbox's stand-in
    starts it as the generic image (CUDA 12.9, `vllm serve` entrypoint), not "image not found"."""
    from sandbox.control.run.images import image_behaviour

    assert image_behaviour(image) == image_behaviour("vllm/vllm-openai:v0.33.0")
    assert image_behaviour(image) is not None
