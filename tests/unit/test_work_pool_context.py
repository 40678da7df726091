"""The build context of a local source: what is uploaded to Cloud Build and what the content tag covers.

The worker image is built from the project folder itself, which holds a .venv, caches and sandbox state: those
never reach the image (./.dockerignore), so they are neither uploaded nor allowed to change the image's tag.
"""

from __future__ import annotations

from pathlib import Path

from tasks.image.build_context import context_files
from tasks.image.images import tree_digest

ROOT = Path(__file__).resolve().parents[2]


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def names(folder: Path, dockerfile: str = "Dockerfile") -> list[str]:
    return [p.relative_to(folder).as_posix() for p in context_files(folder, dockerfile)]


def test_the_projects_own_context_leaves_out_what_never_reaches_the_image():
    found = names(ROOT)
    tops = {name.split("/")[0] for name in found}
    assert {"Dockerfile", "pyproject.toml", "prefect.yaml", "flows", "tasks", "blocks", "deployments"} <= tops
    assert not tops & {".venv", ".git", ".sandbox", ".prefect", ".pytest_cache", ".ruff_cache", "tests"}
    # Nor what a lint run or a doc edit changes: the worker image's content tag would change, and `bootstrap deploy`
    # would call the pool's image stale for a tree whose runs read the same files.
    assert not tops & {".import_linter_cache", "docs", ".ci", "build"}
    assert not [name for name in found if "__pycache__" in name or ".egg-info" in name]


def test_dockerignore_rules_as_docker_reads_them(tmp_path):
    folder = write(
        tmp_path,
        {
            "Dockerfile": "FROM python:3.12-slim\n",
            ".dockerignore": "# caches\n/.venv\n**/__pycache__\n*.md\n!README.md\ndocs/*/draft?.txt\n",
            "app/main.py": "",
            "app/__pycache__/main.pyc": "",
            ".venv/lib/site.py": "",
            "README.md": "",
            "NOTES.md": "",
            "app/NOTES.md": "",  # `*.md` matches the root only, as in docker (not gitignore)
            "docs/a/draft1.txt": "",
            "docs/a/draft10.txt": "",
        },
    )
    assert names(folder) == [
        ".dockerignore",
        "Dockerfile",
        "README.md",
        "app/NOTES.md",
        "app/main.py",
        "docs/a/draft10.txt",
    ]


def test_the_dockerfile_and_dockerignore_are_sent_even_when_excluded(tmp_path):
    folder = write(tmp_path, {"Dockerfile": "FROM x\n", ".dockerignore": "*\n!src\n", "src/a.py": "", "b.py": ""})
    assert names(folder) == [".dockerignore", "Dockerfile", "src/a.py"]


def test_a_dockerfile_specific_ignore_file_replaces_the_root_one(tmp_path):
    folder = write(
        tmp_path,
        {
            "docker/Dockerfile.cpu": "FROM x\n",
            "docker/Dockerfile.cpu.dockerignore": "big\n",
            ".dockerignore": "src\n",
            "src/a.py": "",
            "big/blob.bin": "",
        },
    )
    assert names(folder, "docker/Dockerfile.cpu") == [
        ".dockerignore",
        "docker/Dockerfile.cpu",
        "docker/Dockerfile.cpu.dockerignore",
        "src/a.py",
    ]


def test_the_content_tag_ignores_what_the_context_leaves_out_and_follows_what_it_carries(tmp_path):
    folder = write(
        tmp_path,
        {"Dockerfile": "FROM x\nCOPY . .\n", ".dockerignore": ".venv\n**/__pycache__\n", "app.py": "print(1)\n"},
    )
    first = tree_digest(folder)
    write(folder, {".venv/lib/new.py": "", "pkg/__pycache__/m.pyc": "x"})
    assert tree_digest(folder) == first
    write(folder, {"app.py": "print(2)\n"})
    assert tree_digest(folder) != first


def test_the_last_matching_rule_wins(tmp_path):
    write(tmp_path, {"Dockerfile": "FROM scratch\n", "a.md": "", "README.md": "", "README-secret.md": ""})
    (tmp_path / ".dockerignore").write_text("*.md\n!README*.md\nREADME-secret.md\n")
    assert [n for n in names(tmp_path) if n.endswith(".md")] == ["README.md"]
    (tmp_path / ".dockerignore").write_text("*.md\nREADME-secret.md\n!README*.md\n")
    assert [n for n in names(tmp_path) if n.endswith(".md")] == ["README-secret.md", "README.md"]
