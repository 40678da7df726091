"""Docker image names, tags and digests as Artifact Registry spells them.

An image reference is ``LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE[:TAG][@sha256:HEX]``; IMAGE may have
several ``/``-separated parts. In resource names the image (the "package") is URL-encoded, so
``team/vllm`` becomes ``team%2Fvllm`` in ``.../dockerImages/team%2Fvllm@sha256:...`` and
``.../packages/team%2Fvllm/tags/latest``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from google.protobuf import timestamp_pb2

from sandbox.control.errors import invalid_argument

DOCKER_HOST_SUFFIX = "-docker.pkg.dev"
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
# Docker distribution spec: path components of lowercase alphanumerics joined by '.', '_', '__' or '-'s.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
TAG = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$")  # FACTS.md
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
REFERENCE = re.compile(
    rf"^(?P<location>[a-z0-9-]+){re.escape(DOCKER_HOST_SUFFIX)}/(?P<project>[^/]+)/(?P<repository>[^/]+)/(?P<rest>.+)$"
)


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference. ``tag`` is None when the reference pins a digest only."""

    location: str
    project: str
    repository: str
    image: str
    tag: str | None
    digest: str | None


def parse_reference(ref: str) -> ImageRef | None:
    """``LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE[:TAG][@sha256:...]``, or None if it is not one.

    No tag and no digest means ``latest``, as docker pull does; with a digest the tag is ignored, as docker
    does for ``image:tag@digest``.
    """
    match = REFERENCE.match(ref.strip())
    if match is None:
        return None
    rest, _, digest = match["rest"].partition("@")
    image, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        image, _, tag = rest.rpartition(":")
    if digest:
        if not DIGEST.match(digest):
            return None
        tag = None
    elif tag is None:
        tag = "latest"
    if not IMAGE_NAME.match(image) or (tag is not None and not TAG.match(tag)):
        return None
    return ImageRef(match["location"], match["project"], match["repository"], image, tag, digest or None)


def check_image_name(image: str) -> None:
    if not IMAGE_NAME.match(image):
        raise invalid_argument(f"Invalid image name '{image}': use lowercase path components such as 'team/vllm'.")


def check_tag(tag: str) -> None:
    if not TAG.match(tag):
        raise invalid_argument(f"Invalid tag '{tag}': tags match [a-zA-Z0-9_][a-zA-Z0-9._-]{{0,127}}.")


def check_digest(digest: str) -> None:
    if not DIGEST.match(digest):
        raise invalid_argument(f"Invalid digest '{digest}': expected 'sha256:' and 64 lowercase hex digits.")


def package_id(image: str) -> str:
    """The image as it appears in resource names (slashes encoded)."""
    return quote(image, safe="")


@dataclass
class StoredImage:
    """One pushed manifest of one image, with the tags that currently point at it."""

    image: str
    digest: str
    tags: list[str]
    size_bytes: int
    upload_time: timestamp_pb2.Timestamp
    build_time: timestamp_pb2.Timestamp
    update_time: timestamp_pb2.Timestamp
    media_type: str = MANIFEST_MEDIA_TYPE
