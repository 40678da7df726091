"""Which files of a build source reach the image: docker's build context under the source's ``.dockerignore``.

A local source folder is packed and uploaded for Cloud Build (tasks/image/builds.py), and its content decides the image
tag (tasks/image/images.py). Both look only at what ``docker build .`` would see: a project folder holds a ``.venv``,
caches and state that never reach the image (docker drops them), yet would make the upload large and change the
tag on every test run. Leaving out what docker leaves out cannot change the image.

Rules as docker applies them (https://docs.docker.com/build/concepts/context/#dockerignore-files): one pattern per
line, ``#`` comments, paths relative to the context root (a leading ``/`` is dropped), Go ``filepath.Match`` globs
plus ``**`` for any number of folders, ``!`` re-includes, the last matching line wins, and a pattern that matches
a folder excludes everything below it. With BuildKit (our builds turn it on, lesson 7) a ``<Dockerfile>.dockerignore``
next to the Dockerfile replaces the root one. The Dockerfile and ``.dockerignore`` are always sent, even when
excluded: the builder needs them (docker/cli ``TrimBuildFilesFromExcludes``, cli/command/image/build/dockerignore.go).
The matching is docker-py's (``docker.utils.build.exclude_paths``, what its ``APIClient.build`` sends; docker-py
comes with Prefect).
"""

from __future__ import annotations

import os
from pathlib import Path

from docker.utils.build import exclude_paths


def ignore_patterns(folder: Path, dockerfile: str = "Dockerfile") -> list[str]:
    """The patterns BuildKit uses for ``dockerfile`` in ``folder``: the Dockerfile's own ignore file, else the
    root's; comments and blank lines dropped (as docker-py's ``APIClient.build`` reads them)."""
    for candidate in (folder / f"{dockerfile}.dockerignore", folder / ".dockerignore"):
        if candidate.is_file():
            lines = candidate.read_text(encoding="utf-8", errors="replace").splitlines()
            return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    return []


def context_files(folder: Path, dockerfile: str = "Dockerfile") -> list[Path]:
    """The files (and symlinks) of ``folder`` that ``docker build -f dockerfile .`` sends, sorted by path."""
    included = exclude_paths(str(folder), ignore_patterns(folder, dockerfile), dockerfile=dockerfile)
    # exclude_paths lists folders too; a symlink to a folder is sent as the link itself.
    files = [rel for rel in included if os.path.islink(folder / rel) or not os.path.isdir(folder / rel)]
    return [folder / rel for rel in sorted(files)]
