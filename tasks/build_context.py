"""Which files of a build source reach the image: docker's build context under the source's ``.dockerignore``.

A local source folder is packed and uploaded for Cloud Build (tasks/builds.py), and its content decides the image
tag (tasks/images.py). Both look only at what ``docker build .`` would see: a project folder holds a ``.venv``,
caches and state that never reach the image (docker drops them), yet would make the upload large and change the
tag on every test run. Leaving out what docker leaves out cannot change the image.

Rules as docker applies them (https://docs.docker.com/build/concepts/context/#dockerignore-files): one pattern per
line, ``#`` comments, paths relative to the context root (a leading ``/`` is dropped), Go ``filepath.Match`` globs
plus ``**`` for any number of folders, ``!`` re-includes, the last matching line wins, and a pattern that matches
a folder excludes everything below it. With BuildKit (our builds turn it on, lesson 7) a ``<Dockerfile>.dockerignore``
next to the Dockerfile replaces the root one. The Dockerfile and ``.dockerignore`` are always sent, even when
excluded: the builder needs them (docker/cli ``TrimBuildFilesFromExcludes``, cli/command/image/build/dockerignore.go).
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path


class DockerIgnore:
    """The patterns of one ``.dockerignore``; ``excluded(path)`` answers for a path relative to the context."""

    def __init__(self, text: str = "") -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = _clean(line[1:].strip() if negate else line)
            if pattern:
                self.rules.append((negate, re.compile(_glob_regex(pattern))))

    @property
    def has_exceptions(self) -> bool:
        return any(negate for negate, _ in self.rules)

    def excluded(self, path: str) -> bool:
        """Whether ``path`` is left out: the last rule matching it or one of its parent folders decides."""
        candidates = [path]
        parent = posixpath.dirname(path)
        while parent:
            candidates.append(parent)
            parent = posixpath.dirname(parent)
        result = False
        for negate, rule in self.rules:
            if any(rule.fullmatch(candidate) for candidate in candidates):
                result = not negate
        return result


def ignore_rules(folder: Path, dockerfile: str = "Dockerfile") -> DockerIgnore:
    """The ignore file BuildKit uses for ``dockerfile`` in ``folder``: the Dockerfile's own, else the root's."""
    for candidate in (folder / f"{dockerfile}.dockerignore", folder / ".dockerignore"):
        if candidate.is_file():
            return DockerIgnore(candidate.read_text(encoding="utf-8", errors="replace"))
    return DockerIgnore()


def context_files(folder: Path, dockerfile: str = "Dockerfile") -> list[Path]:
    """The files (and symlinks) of ``folder`` that ``docker build -f dockerfile .`` sends, sorted by path."""
    rules = ignore_rules(folder, dockerfile)
    always = {_clean(dockerfile), ".dockerignore", f"{_clean(dockerfile)}.dockerignore"}
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        rel_root = Path(root).relative_to(folder).as_posix()
        rel_root = "" if rel_root == "." else rel_root
        if not rules.has_exceptions:
            # An excluded folder with no "!" rule that could bring something back: do not even walk it (.venv).
            dirs[:] = [d for d in dirs if not rules.excluded(posixpath.join(rel_root, d))]
        dirs.sort()
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(root, d)))]:
            rel = posixpath.join(rel_root, name)
            if rel in always or not rules.excluded(rel):
                found.append(Path(root) / name)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def _clean(pattern: str) -> str:
    """Go's ``filepath.Clean`` of a pattern, relative to the context root."""
    cleaned = posixpath.normpath(pattern.replace("\\", "/")).lstrip("/")
    return "" if cleaned == "." else cleaned


def _glob_regex(pattern: str) -> str:
    """A regex for a dockerignore pattern: ``*`` and ``?`` stay within one path part, ``**`` spans parts."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            negated = body.startswith("^") or body.startswith("!")
            body = body[1:] if negated else body
            out.append(("[^/" if negated else "[") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)
