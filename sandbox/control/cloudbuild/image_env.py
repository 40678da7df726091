"""The Python environment of an image the sandbox's Cloud Build builds FROM a Python base: a real venv, so a Cloud Run
job runs what the Dockerfile installed, not this host's packages.

The sandbox cannot unpack or run an image, so it follows the Dockerfile's install steps on this host instead:
- the base image gives the venv's starting point: ``prefecthq/prefect:X-pythonY`` is Prefect X with the extras
  Prefect's own Dockerfile installs (``PREFECT_EXTRAS=[redis,client,otel]``, then ``uv pip uninstall setuptools``:
  github.com/PrefectHQ/prefect, Dockerfile); ``python:Y`` is an empty venv (python's official image ships pip and,
  up to 3.11, setuptools, as ``python -m venv`` does);
- ``COPY``/``ADD`` from the build context copy the context as uploaded (its ``.dockerignore`` applied, as the build
  step reads it: workspace.py) into a folder standing for the image's filesystem;
- each ``RUN pip install ...`` runs into the venv, in that folder at the step's WORKDIR, by ``uv pip install`` (the
  same requirements from the same index, in seconds where pip takes minutes on a busy 2-core machine; Prefect's own
  image installs Prefect with ``uv pip install`` too: its Dockerfile at 0235a561, stage ``final``): ``pip install
  [--no-cache-dir] [-q] [-U] [-e] PATH|REQUIREMENT... | -r FILE``, the forms our ./Dockerfile and common Prefect
  images use. Anything else (``apt-get``, ``&&`` chains, ``COPY --from``) is a step the sandbox cannot follow: in a
  Prefect image the build fails naming it (docker.py), rather than leaving a job to run something that never
  happened.

The venv runs on this host's Python. When the base names another minor version (``python3.12``), the environment
says so in its log: pure-Python packages behave the same; a package with wheels for one minor version only, or
that tests ``sys.version_info``, could differ.

When: the build records the recipe (``EnvRecipe``, in the image's config) and keeps the source archive; the venv is
made the first time a Cloud Run job runs the image (``materialise``, as Cloud Run pulls an image when a task is
provisioned), under the sandbox's state dir, keyed by the image digest and reused after. Building it eagerly would
cost every build of such an image minutes of pip, and most builds in the suite never run a job. So a pip failure
shows when the job starts (the execution fails with pip's last lines), where Cloud Build would have failed the build.

Images without a recipe (the vLLM stand-ins, prebuilt images, bases the sandbox does not know) keep running in this
host's environment (job_tasks.py): their containers are the sandbox's own stand-ins, not a project's install.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from uv import find_uv_bin

from sandbox.control.cloudbuild.dockerfile import Dockerfile, Instruction, Stage, _words, expand
from sandbox.control.cloudbuild.workspace import DockerIgnore, normalize

PREFECT_IMAGE = re.compile(r"^(?:docker\.io/)?prefecthq/prefect:(\d+(?:\.\d+){0,2})-python(\d+\.\d+)(?:-[\w.-]+)?$")
PYTHON_IMAGE = re.compile(r"^(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)(?:\.\d+)?(?:-[\w.-]+)?$")
PREFECT_EXTRAS = "[redis,client,otel]"  # PrefectHQ/prefect Dockerfile: ARG PREFECT_EXTRAS=[redis,client,otel]
PIP = re.compile(r"^(?:(?:/usr(?:/local)?/bin/)?python3?(?:\.\d+)?\s+-m\s+)?(?:/usr(?:/local)?/bin/)?pip3?(?:\.\d+)?$")
SHELL_SYNTAX = re.compile(r"&&|\|\||[;|<>`]|\$\(|\$\{?[A-Za-z_]")
PIP_SWITCHES = {"--no-cache-dir", "-q", "--quiet", "-U", "--upgrade", "--no-input", "--disable-pip-version-check"}
PIP_VALUE_FLAGS = {"-e", "--editable", "-r", "--requirement"}
STEP_TIMEOUT_S = 1800.0
# This host's settings a pip run keeps (its package index configuration lives in these and in pip.conf files).
HOST_ENV = ("HOME", "LANG", "LC_ALL", "TZ", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT",
            "PIP_DEFAULT_TIMEOUT", "PIP_CONSTRAINT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
            "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_INDEX_URL",
            "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_NATIVE_TLS", "UV_OFFLINE")  # fmt: skip
HOST_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
# A folder of wheels (python -m sandbox.wheelhouse) to install from instead of the package index: where the sandbox
# runs without one (make worker-e2e's network namespace).
WHEELHOUSE_ENV = "SANDBOX_WHEELHOUSE"


@dataclass(frozen=True)
class EnvStep:
    """One COPY or ``RUN pip install`` of the image's stages, as it runs: arguments, WORKDIR and ENV."""

    line: int
    text: str
    kind: str  # "copy" or "pip"
    args: tuple[str, ...]  # copy: sources then the destination (container paths); pip: pip's arguments
    workdir: str
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EnvRecipe:
    """How to make an image's Python environment: its base, its steps and the source archive the build fetched."""

    key: str  # the image digest's hex
    base: str
    python: str  # the base's Python minor version
    base_requirements: tuple[str, ...]
    steps: tuple[EnvStep, ...]
    archive: str  # the build's source archive, kept under the state dir
    context: str  # the build context's folder in it
    ignore: str  # the context's .dockerignore
    home: str  # where the environments live

    @property
    def folder(self) -> Path:
        return Path(self.home) / self.key[:32]


@dataclass(frozen=True)
class ImageEnvironment:
    """A made environment: ``root`` stands for the image's filesystem, ``venv`` holds its Python."""

    root: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


class ImageEnvironmentError(Exception):
    """The environment could not be made: ``message`` names the step and what pip said."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def python_base(base: str) -> tuple[str, tuple[str, ...]] | None:
    """(Python minor version, what the base holds) for a base image the sandbox makes environments for, else None."""
    if found := PREFECT_IMAGE.match(base):
        return found[2], (f"prefect{PREFECT_EXTRAS}=={found[1]}",)
    if found := PYTHON_IMAGE.match(base):
        return found[1], ()
    return None


def is_prefect_base(base: str) -> bool:
    return bool(PREFECT_IMAGE.match(base))


def chain_of(dockerfile: Dockerfile, target: Stage, meta: dict[str, str | None]) -> tuple[set[int], str]:
    """The stages the target image is made of (itself and the stages it is FROM), and its external base image."""
    indices, stage = {target.index}, target
    parent = dockerfile.stage(expand(stage.base, meta))
    while parent is not None and parent.index < stage.index:
        stage = parent
        indices.add(stage.index)
        parent = dockerfile.stage(expand(stage.base, meta))
    return indices, expand(stage.base, meta)


def env_step(inst: Instruction, variables: dict[str, str | None], workdir: str, env: dict[str, str | None]) -> EnvStep:
    """The step an image's COPY/ADD/RUN is; raises ImageEnvironmentError for one the sandbox cannot follow."""
    where = f"Dockerfile line {inst.line}: {inst.text.splitlines()[0][:120]}"
    shown_env = tuple((k, v) for k, v in env.items() if v is not None)
    if inst.keyword in ("COPY", "ADD"):
        refused = [name for name, _ in inst.flags if name in ("from", "parents", "exclude")]
        value = inst.value.strip()
        words = json.loads(value) if value.startswith("[") else [w.strip("\"'") for w in _words(value)]
        words = [expand(str(w), variables) for w in words]
        if refused or len(words) < 2 or any(re.match(r"^[a-z]+://", w) or any(c in w for c in "*?[") for w in words):
            raise ImageEnvironmentError(
                f"{where}: the sandbox copies only plain paths of the build context into an image's environment "
                "(no --from, URLs or wildcards); copy the files by name"
            )
        *sources, dest = words
        if not dest.endswith("/") and (len(sources) > 1 or dest in (".", "..")):
            dest += "/"
        return EnvStep(inst.line, inst.text, "copy", (*sources, posixpath.join(workdir, dest)), workdir, shown_env)
    args = pip_arguments(inst)
    if args is None:
        raise ImageEnvironmentError(
            f"{where}: the sandbox runs only `pip install [--no-cache-dir] [-e] PATH|REQUIREMENT...` or `pip install "
            "-r FILE` in an image FROM prefecthq/prefect or python; make the step one of these (a package for what "
            "the image needs), or build the image where docker runs"
        )
    return EnvStep(inst.line, inst.text, "pip", args, workdir, shown_env)


def pip_arguments(inst: Instruction) -> tuple[str, ...] | None:
    """pip's arguments of a ``RUN pip install ...`` the sandbox can run, else None."""
    if any(name != "mount" or "type=cache" not in value for name, value in inst.flags):
        return None  # a cache mount changes nothing an install leaves behind; other flags do
    value = inst.value.strip()
    try:
        words = json.loads(value) if value.startswith("[") else shlex.split(value)
    except ValueError:
        return None
    if not value.startswith("[") and SHELL_SYNTAX.search(value):
        return None
    for split in range(len(words)):
        if words[split] == "install" and PIP.match(" ".join(words[:split])):
            break
    else:
        return None
    args = words[split + 1 :]
    index = 0
    while index < len(args):
        word = args[index]
        if word in PIP_VALUE_FLAGS:
            index += 2
        elif word.startswith("-") and word not in PIP_SWITCHES:
            return None
        else:
            index += 1
    return tuple(args) if args and index == len(args) else None


# Making it --------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One maker per environment, across threads and sandboxes sharing a state dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ready(recipe: EnvRecipe) -> ImageEnvironment | None:
    """The environment when it was made already."""
    folder = recipe.folder
    return ImageEnvironment(folder / "root", folder / "venv") if (folder / ".complete").is_file() else None


def materialise(recipe: EnvRecipe) -> ImageEnvironment:
    """Make (or reuse) the image's environment; blocking: run it in a thread. Raises ImageEnvironmentError."""
    folder = recipe.folder
    with _locked(folder.with_name(folder.name + ".lock")):
        made = ready(recipe)
        if made is not None:
            return made
        shutil.rmtree(folder, ignore_errors=True)  # a maker that died half-way
        folder.mkdir(parents=True)
        env = ImageEnvironment(folder / "root", folder / "venv")
        env.root.mkdir()
        cache = Path(recipe.home) / "uv-cache"  # shared by the images of this state dir, none outside it
        with (folder / "build.log").open("w") as log:
            if recipe.python != HOST_PYTHON:
                log.write(f"the image's Python is {recipe.python}; its environment runs on this host's {HOST_PYTHON}\n")
            # python -m venv: pip in the environment, as the python and prefecthq/prefect images have it.
            _run([sys.executable, "-m", "venv", str(env.venv)], folder, {}, log, f"FROM {recipe.base}")
            if recipe.base_requirements:  # Prefect's own Dockerfile installs with uv, then drops setuptools
                _uv(env, cache, ["install", *recipe.base_requirements], folder, {}, log, f"FROM {recipe.base}")
                _uv(env, cache, ["uninstall", "setuptools"], folder, {}, log, f"FROM {recipe.base}")
            for step in recipe.steps:
                where = f"Dockerfile line {step.line}: {step.text.splitlines()[0][:120]}"
                if step.kind == "copy":
                    _copy(recipe, step, env.root, where)
                    continue
                cwd = env.root / normalize(step.workdir)
                cwd.mkdir(parents=True, exist_ok=True)
                _uv(env, cache, ["install", *uv_install_arguments(step.args)], cwd, dict(step.env), log, where)
        (folder / ".complete").write_text("")
        return env


def uv_install_arguments(pip_args: tuple[str, ...]) -> list[str]:
    """``uv pip install``'s arguments for a step's ``pip install`` ones (pip_arguments accepted them): the same
    requirements, editables and files; the switches that change only pip's output or cache are dropped."""
    dropped = {"--no-cache-dir", "-q", "--quiet", "--no-input", "--disable-pip-version-check"}
    return ["--upgrade" if word == "-U" else word for word in pip_args if word not in dropped]


def _uv(
    env: ImageEnvironment, cache: Path, args: list[str], cwd: Path, image_env: dict[str, str], log: TextIO, where: str
) -> None:
    """``uv pip ARGS`` into the environment. uv, not the image's pip, for speed (seconds, against pip's minutes on a
    busy 2-core machine): it resolves the same requirements from the same index and installs the same packages, so
    what the image lacks, the environment lacks too."""
    wheelhouse = os.environ.get(WHEELHOUSE_ENV)
    index = ["--no-index", "--find-links", wheelhouse] if wheelhouse and args[0] == "install" else []
    argv = [find_uv_bin(), "pip", *args[:1], "--python", str(env.bin / "python"), *index, *args[1:]]
    _run(argv, cwd, {**image_env, "VIRTUAL_ENV": str(env.venv), "UV_CACHE_DIR": str(cache)}, log, where, env.bin)


def _run(
    argv: list[str], cwd: Path, extra: dict[str, str], log: TextIO, where: str, bin_dir: Path | None = None
) -> None:
    env = {k: os.environ[k] for k in HOST_ENV if k in os.environ}
    env.update({k: v for k, v in extra.items() if k not in ("PATH", "PYTHONPATH", "PYTHONHOME")})
    env["PATH"] = os.pathsep.join([*([str(bin_dir)] if bin_dir else []), "/usr/local/bin", "/usr/bin", "/bin"])
    log.write(f"$ {shlex.join(argv)}   (in {cwd})\n")
    log.flush()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=STEP_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ImageEnvironmentError(f"{where}: still running after {STEP_TIMEOUT_S:g} s") from None
    output = done.stdout.decode("utf-8", "replace")
    log.write(output)
    if done.returncode != 0:
        tail = [line for line in output.splitlines() if line.strip()]
        shown = "\n".join(tail[-8:])
        raise ImageEnvironmentError(f"{where}: exited with code {done.returncode}:\n{shown}")


def _copy(recipe: EnvRecipe, step: EnvStep, root: Path, where: str) -> None:
    """COPY as docker does it: a folder's content into the destination, a file to it (or into it, ending in /)."""
    *sources, dest = step.args
    ignore = DockerIgnore(recipe.ignore)
    prefix = f"{recipe.context}/" if recipe.context else ""
    with tarfile.open(recipe.archive, mode="r:*") as archive:
        members = {}
        for member in archive:
            path = normalize(member.name)
            if path.startswith(prefix) and (member.isfile() or member.issym()):
                rel = path[len(prefix) :]
                if not ignore.ignored(rel):
                    members[rel] = member
        for raw in sources:
            src = normalize(raw)
            matched = {rel: m for rel, m in members.items() if not src or rel == src or rel.startswith(src + "/")}
            if not matched:
                raise ImageEnvironmentError(f"{where}: {raw} is not in the build context")
            for rel, member in matched.items():
                if rel == src:
                    inner = posixpath.join(dest, posixpath.basename(rel)) if dest.endswith("/") else dest
                else:
                    inner = posixpath.join(dest, rel[len(src) + 1 :] if src else rel)
                target = root / normalize(inner)
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.parent.resolve().is_relative_to(root.resolve()):
                    raise ImageEnvironmentError(f"{where}: {rel} leads out of the image through a symlink")
                target.unlink(missing_ok=True)
                if member.issym():
                    # Only links that stay inside the copy: the rest would point into this host's files.
                    if not member.linkname.startswith("/") and ".." not in member.linkname.split("/"):
                        os.symlink(member.linkname, target)
                    continue
                data = archive.extractfile(member)
                target.write_bytes(data.read() if data is not None else b"")
                target.chmod(member.mode & 0o755 | 0o644)
