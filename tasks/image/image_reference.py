"""Container image references parsed as Docker parses them, so one image is recognised however it is spelled.

The grammar and the normalisation follow the distribution/reference Go module (formerly docker/distribution
``reference/``), ``regexp.go`` (``ReferenceRegexp``: name, optional ``:tag``, optional ``@digest``) and
``normalize.go`` (``ParseNormalizedNamed`` / ``splitDockerDomain``: a first component without ``.`` or ``:`` that is
not ``localhost`` is a path on Docker Hub, ``index.docker.io`` is Docker Hub's legacy name, and a one-component
Docker Hub name lives under ``library/``), https://github.com/distribution/reference at 0965666a (2026-04-18).

Two things that module does not do and we need: registry host names compare case-insensitively (they are DNS
names, RFC 4343), and Docker Hub has more spellings than ``docker.io``: ``registry-1.docker.io`` (the host the
registry API really answers on, per the ``defaultDomain`` comment in normalize.go), ``index.docker.io`` and
``registry.hub.docker.com``, plus Google's Docker Hub cache ``mirror.gcr.io``, which keeps Docker Hub's paths
(https://cloud.google.com/artifact-registry/docs/pull-cached-dockerhub-images).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# regexp.go, transcribed: path components are lowercase alphanumerics joined by one ".", one or two "_" or any
# number of "-"; the domain is a DNS name (any case), IPv4 or [IPv6], with an optional port.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])"
_DOMAIN_AND_PORT = rf"{_HOST}(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(
    rf"^(?P<name>(?:{_DOMAIN_AND_PORT}/)?{_REMOTE_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$",
    re.ASCII,
)
_IDENTIFIER = re.compile(r"^[a-f0-9]{64}$")  # an image ID, which ParseNormalizedNamed refuses as a name
NAME_MAX = 255  # reference.go RepositoryNameTotalLengthMax (the path, without the domain)

DEFAULT_DOMAIN = "docker.io"
OFFICIAL_PREFIX = "library/"
DOCKER_HUB_HOSTS = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})
DOCKER_HUB_MIRRORS = frozenset({"mirror.gcr.io"})


class InvalidImageReference(ValueError):
    """A string that is not a Docker image reference."""


@dataclass(frozen=True)
class ImageReference:
    """A parsed reference: ``domain`` (lowercase; ``docker.io`` for Docker Hub), ``path`` (``library/ubuntu``),
    and the optional ``tag`` and ``digest`` (both may be given: the digest is what is pulled)."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """The fully qualified repository, ``docker.io/vllm/vllm-openai``."""
        return f"{self.domain}/{self.path}"

    @property
    def pinned(self) -> bool:
        """A digest, or a tag other than ``latest``: the same reference pulls the same image tomorrow (mostly)."""
        return self.digest is not None or (self.tag is not None and self.tag != "latest")

    @property
    def docker_hub_path(self) -> str | None:
        """The Docker Hub repository this names when it is on Docker Hub or a mirror that keeps Hub paths."""
        if self.domain == DEFAULT_DOMAIN or self.domain in DOCKER_HUB_MIRRORS:
            return self.path
        return None

    def is_image(self, hub_path: str) -> bool:
        """Whether this names Docker Hub's ``hub_path`` (``vllm/vllm-openai``, or ``ubuntu`` for an official
        image): on Docker Hub under any of its host names, on a Docker Hub mirror, or copied under another
        registry's prefix (a pull-through cache such as an Artifact Registry remote repository keeps the Hub path
        under ``HOST/PROJECT/REPOSITORY/``)."""
        wanted = _hub_path(hub_path)
        if self.docker_hub_path is not None:
            return self.docker_hub_path == wanted
        return self.path.endswith(f"/{wanted}") or self.path == wanted


def _hub_path(path: str) -> str:
    return path if "/" in path else OFFICIAL_PREFIX + path


def parse_image_reference(text: str) -> ImageReference:
    """``text`` as Docker reads it (``ParseNormalizedNamed``), normalised: the domain lowercased, Docker Hub's
    host names as ``docker.io``, and a one-component Docker Hub name under ``library/``.

    Raises InvalidImageReference, with the reason, for anything a ``docker pull`` would refuse.
    """
    if not text or text != text.strip():
        raise InvalidImageReference(f"'{text}' is not an image reference (empty, or surrounded by spaces)")
    if _IDENTIFIER.match(text):
        raise InvalidImageReference(f"'{text}' is an image ID, not a reference: name the repository")
    match = REFERENCE.match(text)
    if match is None:
        remote = text.split("@", 1)[0]
        if remote.lower() != remote and REFERENCE.match(text.lower()):
            raise InvalidImageReference(f"'{text}': the repository name must be lowercase")
        raise InvalidImageReference(
            f"'{text}' is not an image reference: use [HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST] "
            "(lowercase path components, e.g. vllm/vllm-openai:v0.11.0)"
        )
    domain, path = _split_domain(match["name"])
    if len(path) > NAME_MAX:
        raise InvalidImageReference(f"'{text}': the repository name is longer than {NAME_MAX} characters")
    return ImageReference(domain=domain, path=path, tag=match["tag"], digest=match["digest"])


def _split_domain(name: str) -> tuple[str, str]:
    """normalize.go ``splitDockerDomain``, with Docker Hub's other host names and any host's case folded."""
    first, slash, rest = name.partition("/")
    # The regexp only lets uppercase into a domain, so an uppercase first component is one, as in Go.
    if not slash or not (first == "localhost" or any(c in first for c in ".:") or first.lower() != first):
        domain, path = DEFAULT_DOMAIN, name
    else:
        domain, path = first.lower(), rest
    if domain in DOCKER_HUB_HOSTS:
        domain = DEFAULT_DOMAIN
    if domain in (DEFAULT_DOMAIN, *DOCKER_HUB_MIRRORS):
        path = _hub_path(path)
    return domain, path


def same_repository(image: str, other: str) -> bool:
    """Whether two references name the same repository, however spelt (registry host case, Docker Hub aliases);
    False when either is not a valid reference."""
    try:
        return parse_image_reference(image).name == parse_image_reference(other).name
    except InvalidImageReference:
        return False
