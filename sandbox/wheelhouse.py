"""The wheels a Dockerfile's Python environment needs, fetched while the package index is reachable.

`make worker-e2e` runs the sandbox inside a private network namespace (sandbox.netns), where no package index is
reachable, as Cloud Run's own network would not reach this machine's. The images the sandbox's Cloud Build builds
there get their Python environment from these wheels (sandbox/control/cloudbuild/image_env.py,
``SANDBOX_WHEELHOUSE``: ``uv pip install --no-index --find-links``). The folder also stands in for pip's cache between
runs: it is filled once and reused (``pip download`` skips a wheel already there), which pip's own cache does not do
on a machine whose package proxy sends no caching headers.

    python -m sandbox.wheelhouse --out .sandbox/wheels [--source .]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

from sandbox.control.cloudbuild.dockerfile import parse_dockerfile
from sandbox.control.cloudbuild.image_env import python_base


def requirements(source: Path) -> list[str]:
    """What the environment of ``source``'s Dockerfile installs: its base image's packages, the project (with its
    dependencies) and the project's build requirements (pip builds it in an isolated environment)."""
    dockerfile = parse_dockerfile((source / "Dockerfile").read_text(), heredocs=True)
    base = python_base(dockerfile.stages[-1].base)
    if base is None:
        raise SystemExit(f"{source / 'Dockerfile'}: FROM {dockerfile.stages[-1].base} is not a Python base image")
    build = tomllib.loads((source / "pyproject.toml").read_text()).get("build-system", {})
    return [*base[1], *build.get("requires", ["setuptools"]), str(source)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the wheel folder (created; reused when it exists)")
    parser.add_argument("--source", type=Path, default=Path("."), help="the folder with the Dockerfile")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = requirements(args.source.resolve())
    # The same requirements and pyproject as last time: the wheels are there (resolving again costs half a minute).
    stamp, inputs = args.out / ".inputs", "\n".join([*wanted, (args.source / "pyproject.toml").read_text()])
    if stamp.is_file() and stamp.read_text() == inputs:
        return 0
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--find-links",
               str(args.out), "--dest", str(args.out), *wanted]  # fmt: skip
    code = subprocess.run(command, check=False).returncode
    if code == 0:
        stamp.write_text(inputs)
    return code


if __name__ == "__main__":
    sys.exit(main())
