"""A build's ``/workspace``: the storage source archive, read in memory, and ``.dockerignore`` matching.

Cloud Build unpacks ``source.storage_source`` (a tar.gz, or a plain tar) into ``/workspace`` before the first
step. The stand-in never writes it to disk: it keeps each member's path, size and sha256, the contents of small
files (Dockerfiles, pyproject.toml, .dockerignore) and the set of folders, which is all the docker checks read.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import posixpath
import re
import tarfile
from dataclasses import dataclass, field

# Files up to this size keep their content (Dockerfiles, project metadata); larger ones only their hash.
MAX_TEXT_BYTES = 1 << 20


def normalize(path: str) -> str:
    """A workspace-relative path: no leading ``./`` or ``/workspace/``, no ``..`` games; ``""`` is the root."""
    path = path.strip()
    if path.startswith("/workspace"):
        path = path[len("/workspace") :]
    path = posixpath.normpath("/" + path).lstrip("/")
    return "" if path == "." else path


@dataclass
class Workspace:
    """What the source archive put under /workspace."""

    hashes: dict[str, str] = field(default_factory=dict)  # regular files (and symlinks): path -> sha256 hex
    sizes: dict[str, int] = field(default_factory=dict)
    texts: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=lambda: {""})
    archive: bytes = b""  # the source archive as fetched: an image's Python environment copies from it (image_env.py)

    @classmethod
    def from_archive(cls, data: bytes) -> Workspace:
        """Read a tar (gzip, bzip2, xz or none); raises ValueError when it is not one."""
        space = cls(archive=data)
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
                for member in archive:
                    path = normalize(member.name)
                    if not path:
                        continue
                    if member.isdir():
                        space._add_dir(path)
                        continue
                    content = b""
                    if member.isfile():
                        extracted = archive.extractfile(member)
                        content = extracted.read() if extracted is not None else b""
                    elif member.issym() or member.islnk():
                        content = member.linkname.encode()
                    else:
                        continue  # devices and fifos do not matter to a docker build
                    space._add_file(path, content)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None
        return space

    def _add_dir(self, path: str) -> None:
        while path and path not in self.dirs:
            self.dirs.add(path)
            path = posixpath.dirname(path)

    def _add_file(self, path: str, content: bytes) -> None:
        self.hashes[path] = hashlib.sha256(content).hexdigest()
        self.sizes[path] = len(content)
        if len(content) <= MAX_TEXT_BYTES:
            self.texts[path] = content
        self._add_dir(posixpath.dirname(path))

    # Queries ------------------------------------------------------------------------------------------------
    def is_file(self, path: str) -> bool:
        return normalize(path) in self.hashes

    def is_dir(self, path: str) -> bool:
        return normalize(path) in self.dirs

    def read(self, path: str) -> bytes | None:
        return self.texts.get(normalize(path))

    def files_under(self, folder: str) -> list[str]:
        """Paths of files below ``folder``, relative to it, sorted."""
        folder = normalize(folder)
        prefix = f"{folder}/" if folder else ""
        return sorted(p[len(prefix) :] for p in self.hashes if p.startswith(prefix))

    def size_under(self, folder: str) -> int:
        folder = normalize(folder)
        prefix = f"{folder}/" if folder else ""
        return sum(size for p, size in self.sizes.items() if p.startswith(prefix))

    def digest_under(self, folder: str, ignore: DockerIgnore | None = None) -> str:
        """sha256 over the paths and contents below ``folder`` that a build context would carry."""
        folder = normalize(folder)
        prefix = f"{folder}/" if folder else ""
        digest = hashlib.sha256()
        for rel in self.files_under(folder):
            if ignore is not None and ignore.ignored(rel):
                continue
            digest.update(rel.encode() + b"\0" + self.hashes[prefix + rel].encode())
        return digest.hexdigest()


class DockerIgnore:
    """``.dockerignore`` rules of one build context: Go filepath.Match patterns, ``**``, ``!`` exceptions.

    The last matching rule wins, and a rule that matches a folder excludes everything below it, as docker does.
    """

    def __init__(self, text: str = "") -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = normalize(line[1:] if negate else line)
            if pattern:
                self.rules.append((negate, re.compile(_glob_regex(pattern))))

    def ignored(self, path: str) -> bool:
        """Whether ``path`` (relative to the context) is left out of the context."""
        path = normalize(path)
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
        elif pattern[i] == "[":
            end = pattern.find("]", i)
            if end < 0:
                out.append(re.escape(pattern[i:]))
                break
            out.append(fnmatch.translate(pattern[i : end + 1])[4:-3])  # the bracket expression alone
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)
