"""The config a built image carries (its ENTRYPOINT, CMD, ENV and base), so Cloud Run can start it as docker would.

A ``docker build`` records in the image config the final stage's ENTRYPOINT, CMD and ENV, inherited through
``FROM`` (Dockerfile reference, https://docs.docker.com/reference/dockerfile/#entrypoint and #cmd): an exec-form
ENTRYPOINT gets the run's arguments appended and CMD is its default arguments; a shell-form ENTRYPOINT runs as
``/bin/sh -c`` and ignores CMD and the arguments; setting ENTRYPOINT resets a CMD inherited from the base image.
Cloud Run then runs the image's entrypoint and CMD unless the container's ``command`` / ``args`` override
them (https://cloud.google.com/run/docs/configuring/services/containers), with ``PORT`` set
(https://cloud.google.com/run/docs/container-contract).

The sandbox keeps the files an entrypoint script needs (a script COPY'd from the build context), so the
container stand-in can run the script itself rather than guess what it does (sandbox/vllm/entrypoint.py).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandbox.control.cloudbuild.dockerfile import Instruction, _words, expand

if TYPE_CHECKING:
    from sandbox.control.cloudbuild.image_env import EnvRecipe
    from sandbox.control.run.images import ImageBehaviour

SCRIPT_LIMIT_BYTES = 64 * 1024  # an entrypoint script, not a payload: it travels in the container's env


@dataclass(frozen=True)
class ImageConfig:
    """What ``docker inspect`` would show of a built image, plus the entrypoint's script files."""

    base: str  # the external image the final stage starts from (after stage-to-stage FROMs)
    entrypoint: tuple[str, ...] | None = None  # None: the base image's own
    cmd: tuple[str, ...] | None = None  # None: the base image's own (or reset, when ENTRYPOINT is set)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # container path -> text, for a script entrypoint
    workdir: str = "/"  # the final stage's WORKDIR, where the container's process starts (docker's default "/")
    environment: EnvRecipe | None = None  # how to make its Python environment, FROM a Python base (image_env.py)


def command_words(inst: Instruction) -> tuple[str, ...]:
    """An ENTRYPOINT/CMD as argv: the JSON exec form, else the shell form under ``/bin/sh -c``."""
    value = inst.value.strip()
    if value.startswith("["):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None  # docker falls back to the shell form for invalid JSON
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            return tuple(parsed)
    return ("/bin/sh", "-c", value)


def copy_destinations(inst: Instruction, variables: dict[str, str | None]) -> list[tuple[str, str]]:
    """(context source, container path) of each plain file a COPY/ADD from the build context writes."""
    if inst.keyword not in ("COPY", "ADD") or inst.flag("from"):
        return []
    value = inst.value.strip()
    words: list[str] | None = None
    if value.startswith("["):
        try:
            words = [str(w) for w in json.loads(value)]
        except ValueError:
            words = None
    if words is None:
        words = [w.strip("\"'") for w in _words(value)]
    if len(words) < 2:
        return []
    *sources, dest = (expand(w, variables) for w in words)
    into_dir = dest.endswith("/") or len(sources) > 1
    out = []
    for src in sources:
        target = posixpath.join(dest, posixpath.basename(src)) if into_dir else dest
        out.append((src, posixpath.normpath(target)))
    return out


# Image ENV the sandbox does not hand to the host process that plays the container: these locate the host's
# own Python and libraries, which the stand-in needs (a real container has its own filesystem instead).
HOST_ONLY_ENV = frozenset({"PATH", "HOME", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD"})
IMAGE_FILES_ENV = "SANDBOX_IMAGE_FILES"


@dataclass(frozen=True)
class Launch:
    """How Cloud Run starts one container: the sandbox.vllm entrypoint mode, its argv, CUDA build and image env."""

    entrypoint: str  # "exec-args" or "vllm-serve" (sandbox/vllm/instance.py)
    argv: list[str]
    cuda: int
    env: dict[str, str]


def plan_launch(
    config: ImageConfig | None,
    behaviour: ImageBehaviour,  # what the image's name says (the sandbox's table of known images)
    base_behaviour: ImageBehaviour | None,  # the base image's, when the base is an image the sandbox knows
    command: list[str],
    args: list[str],
) -> Launch:
    """The container's process, as docker runs an image and Cloud Run overrides it.

    Cloud Run's ``command`` replaces the image ENTRYPOINT and ``args`` its CMD (configuring/services/containers);
    an exec-form ENTRYPOINT gets the arguments appended, a shell-form one (``/bin/sh -c``) ignores them (Dockerfile
    reference). Without a config (a prebuilt image) the image's known launcher gets the args, as before.
    """
    if config is None:
        if command:
            return Launch("exec-args", [*command, *args], behaviour.cuda, {})
        return Launch(behaviour.entrypoint, list(args), behaviour.cuda, {})
    known = base_behaviour or behaviour
    env = {k: v for k, v in config.env.items() if k not in HOST_ONLY_ENV}
    run_args = list(args) if args or command else list(config.cmd or ())
    if command:
        return Launch("exec-args", [*command, *run_args], known.cuda, env)
    if config.entrypoint is None:
        return Launch(known.entrypoint, run_args, known.cuda, env)  # the base image's own launcher
    entrypoint = list(config.entrypoint)
    if entrypoint[:2] == ["/bin/sh", "-c"] and len(entrypoint) == 3:
        run_args = []  # a shell-form ENTRYPOINT ignores CMD and the container's args
    # The image's own entrypoint: the stand-in may run its script (or shell) for real (sandbox/vllm/image_script.py).
    env[IMAGE_FILES_ENV] = json.dumps(config.files)
    return Launch("exec-args", [*entrypoint, *run_args], known.cuda, env)
