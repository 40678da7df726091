"""Run a command in a private network namespace where Google's API host names are 127.0.0.1.

``python -m sandbox.netns [--hosts-name NAME ...] [--address CIDR] -- CMD [ARGS...]``

Why: some clients cannot be pointed at the sandbox. prefect-gcp's Cloud Run worker hard-codes
``https://run.googleapis.com``; only name resolution can send it to the sandbox's TLS face
(``python -m sandbox up --tls-names``, see ``sandbox.tls``). This runner re-executes itself under ``unshare`` in a
new mount and network namespace (plus a user namespace when not root), brings up that namespace's own loopback,
bind-mounts a hosts file that maps ``sandbox.tls.TLS_NAMES`` (and any ``--hosts-name``) to 127.0.0.1 over
/etc/hosts, and execs CMD; CMD's exit status is the runner's. Start the sandbox inside the same namespace (for
example a script that runs ``python -m sandbox up --tls-names`` and then the client), since the namespace has
no other network: nothing in it reaches the machine's loopback services or the internet.

With ``--address CIDR`` the namespace also has that private address, and the names map to it instead: a sandbox
started inside serves on it (``sandbox.serving.sandbox_host``) and runs each Cloud Run job task in a network
namespace of its own that reaches it, but not this namespace's 127.0.0.1 (sandbox/control/run/task_network.py).

What it never does: change the machine's own /etc/hosts or CA store. The bind mount exists only in the private
mount namespace (propagation private), its source file is deleted as soon as it is mounted, and both end with the
namespace when CMD exits. Clients trust the sandbox's CA only when told (``HTTPLIB2_CA_CERTS`` and the like).
A host running nscd with a hosts cache would answer from the machine's view instead; containers rarely do.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sandbox.tls import TLS_NAMES, hosts_file_text

ENV_FLAG = "SANDBOX_NETNS"  # set to "1" for CMD: it runs in a private namespace made by this module
ADDRESS_ENV = "SANDBOX_NETNS_ADDRESS"  # with --address: the namespace's own non-loopback address, for CMD
HOSTS = "/etc/hosts"
# The runner's own failures, distinct from CMD's statuses (as env(1) and unshare(1) do: 125, and 127 not found).
EXIT_RUNNER_FAILED = 125
EXIT_NOT_FOUND = 127

MOUNT_AND_NET = ("--mount", "--net")  # the runner's namespaces; the real engine's volume needs --mount alone
# Stated although it is unshare's default: a mount made inside must never propagate back to the machine.
_PROPAGATION = ("--propagation", "private")


def in_private_namespace() -> bool:
    """Whether this process runs under ``python -m sandbox.netns`` (its private namespace and hosts file)."""
    return os.environ.get(ENV_FLAG) == "1"


def _candidates(namespaces: tuple[str, ...]) -> list[tuple[str, ...]]:
    """unshare flag sets to try, best first: root needs no user namespace; a user namespace gives an unprivileged
    caller (or a root without CAP_SYS_ADMIN, as in a default container) root inside it."""
    with_user = ("--user", "--map-root-user", *namespaces)
    return [namespaces, with_user] if os.geteuid() == 0 else [with_user]


def _userns_hint() -> str | None:
    """Why user namespaces are off here, from the sysctls that switch them off (None when none of them does)."""
    checks = (
        (
            "/proc/sys/kernel/unprivileged_userns_clone",
            "0",
            "user namespaces disabled: sysctl kernel.unprivileged_userns_clone",
        ),
        ("/proc/sys/user/max_user_namespaces", "0", "user namespaces disabled: sysctl user.max_user_namespaces=0"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "AppArmor restricts unprivileged user namespaces: sysctl kernel.apparmor_restrict_unprivileged_userns",
        ),
    )
    for path, off, hint in checks:
        try:
            if Path(path).read_text().strip() == off:
                return hint
        except OSError:
            continue
    return None


@functools.cache
def _probe(namespaces: tuple[str, ...]) -> tuple[tuple[str, ...] | None, str | None]:
    """The unshare flags that make ``namespaces`` here, or None and the reason none do (tried once per process)."""
    if _unshare() is None:
        return None, "unshare not found (util-linux)"
    reasons: list[str] = []
    for flags in _candidates(namespaces):
        argv = [str(_unshare()), *flags, *_PROPAGATION, "true"]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"unshare {' '.join(flags)}: {exc}")
            continue
        if result.returncode == 0:
            return flags, None
        message = result.stderr.strip().removeprefix("unshare: ") or f"exit status {result.returncode}"
        reason = f"unshare {' '.join(flags)}: {message}"
        if "--user" in flags:
            hint = _userns_hint() or "a seccomp profile (e.g. a container's default) may refuse unshare(CLONE_NEWUSER)"
            reason += f" ({hint})"
        elif "Operation not permitted" in message:
            reason += " (root without CAP_SYS_ADMIN, e.g. an unprivileged container)"
        reasons.append(reason)
    return None, "; ".join(reasons)


def _unshare() -> str | None:
    return shutil.which("unshare") or next((p for p in ("/usr/bin/unshare", "/bin/unshare") if os.path.exists(p)), None)


def namespaces_available(namespaces: tuple[str, ...] = MOUNT_AND_NET) -> str | None:
    """None when this process can make the private namespaces the runner needs, else the reason why not.

    The reason is meant for a pytest skip message, e.g. ``unshare --user --map-root-user --mount --net: unshare
    failed: Operation not permitted (user namespaces disabled: sysctl kernel.unprivileged_userns_clone)``.
    """
    return _probe(namespaces)[1]


def unshare_argv(namespaces: tuple[str, ...] = MOUNT_AND_NET) -> list[str]:
    """The ``unshare`` command line prefix that makes private ``namespaces`` here (RuntimeError if none can)."""
    flags, reason = _probe(namespaces)
    if flags is None:
        raise RuntimeError(f"no private namespace here: {reason}")
    return [str(_unshare()), *flags, *_PROPAGATION]


def netns_command(command: Sequence[str], hosts_names: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``command`` under this runner (for subprocess), with extra ``hosts_names`` mapped too."""
    extra = [arg for name in hosts_names for arg in ("--hosts-name", name)]
    return [sys.executable, "-m", "sandbox.netns", *extra, "--", *command]


# --- inside the namespace ---------------------------------------------------------------------------------------

_SIOCGIFFLAGS = 0x8913  # linux/sockios.h
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union (40 bytes on 64-bit Linux)
_MS_BIND = 4096  # linux/mount.h


def _loopback_up() -> None:
    """Bring up the namespace's ``lo`` (a new network namespace starts with it down: nothing would connect)."""
    ip = shutil.which("ip")
    if ip is not None:
        subprocess.run([ip, "link", "set", "lo", "up"], check=True, stdin=subprocess.DEVNULL)
        return
    # No iproute2 (a slim image): the same through the ioctl that ip(8) uses.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        current = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, current)[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _bind_mount(source: str, target: str) -> None:
    """``mount --bind source target`` in this (private) mount namespace."""
    mount = shutil.which("mount")
    if mount is not None:
        subprocess.run([mount, "--bind", source, target], check=True, stdin=subprocess.DEVNULL)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, _MS_BIND, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount --bind {source} {target}: {os.strerror(errno)}")


def _install_hosts(names: Sequence[str], address: str = "127.0.0.1") -> None:
    """Put a hosts file mapping ``names`` to ``address`` over /etc/hosts, for this mount namespace only."""
    directory = tempfile.mkdtemp(prefix="sandbox-netns-")
    source = os.path.join(directory, "hosts")
    try:
        with open(source, "w") as handle:
            handle.write(hosts_file_text(names, address))
        os.chmod(source, 0o644)  # CMD may drop privileges; the resolver must still read it
        _bind_mount(source, HOSTS)
    finally:
        # The mount holds the file's inode; with the name gone nothing is left on disk once the namespace ends.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(source)
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _address_up(cidr: str) -> str:
    """Give the namespace a non-loopback address (on its ``lo``: containers often have no dummy-link driver): where a
    server listens that Cloud Run jobs reach (a team's Prefect server on its VPC), which a 127.0.0.1 URL never is.
    Returns the address."""
    ip = shutil.which("ip")
    if ip is None:
        raise OSError("--address needs iproute2's ip(8)")
    subprocess.run([ip, "addr", "add", cidr, "dev", "lo"], check=True, stdin=subprocess.DEVNULL)
    return cidr.split("/", 1)[0]


def _inside(names: Sequence[str], command: Sequence[str], address: str | None = None) -> int:
    """Set up the namespace this process already runs in, then become ``command``."""
    try:
        _loopback_up()
        # With a private address the sandbox serves on it (sandbox.serving.sandbox_host): the names go there too.
        host = _address_up(address) if address else None
        _install_hosts(names, host or "127.0.0.1")
        if host:
            os.environ[ADDRESS_ENV] = host
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"sandbox.netns: setting up the private namespace failed: {exc}", file=sys.stderr)
        return EXIT_RUNNER_FAILED
    os.environ[ENV_FLAG] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], list(command))
    except FileNotFoundError:
        print(f"sandbox.netns: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:
        print(f"sandbox.netns: {command[0]}: {exc}", file=sys.stderr)
        return EXIT_RUNNER_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.netns",
        usage="%(prog)s [--hosts-name NAME ...] -- CMD [ARGS...]",
        description="Run CMD in a private network namespace whose /etc/hosts maps Google's API host names "
        f"({', '.join(TLS_NAMES)}) to 127.0.0.1. The machine's own /etc/hosts is never changed.",
    )
    parser.add_argument(
        "--hosts-name", action="append", default=[], metavar="NAME", help="map NAME to 127.0.0.1 too (repeatable)"
    )
    parser.add_argument(
        "--address", metavar="CIDR", help=f"give the namespace this non-loopback address too (e.g. 10.99.0.1/24); CMD "
        f"finds it in {ADDRESS_ENV}; the host names map to it, a sandbox started inside serves on it and runs each "
        "Cloud Run job task in a network namespace of its own",
    )  # fmt: skip
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # second stage, under unshare
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m sandbox.netns``; returns only on failure (else it becomes CMD)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if "--" not in args_in:
        parser.error("put the command after `--`, e.g. python -m sandbox.netns -- python my_script.py")
    split = args_in.index("--")
    args = parser.parse_args(args_in[:split])
    command = args_in[split + 1 :]
    if not command:
        parser.error("no command after `--`")
    for name in args.hosts_name:
        if not name or any(ch.isspace() or ch == "#" for ch in name):
            parser.error(f"--hosts-name {name!r}: not a host name")
    if args.address:
        try:
            ipaddress.ip_interface(args.address)
        except ValueError:
            parser.error(f"--address {args.address!r}: not an address with its prefix length, e.g. 10.99.0.1/24")
    if args.inside:
        return _inside([*TLS_NAMES, *args.hosts_name], command, args.address)

    reason = namespaces_available()
    if reason is not None:
        print(f"sandbox.netns: cannot make a private namespace here: {reason}", file=sys.stderr)
        return EXIT_RUNNER_FAILED
    extra = [arg for name in args.hosts_name for arg in ("--hosts-name", name)]
    extra += ["--address", args.address] if args.address else []
    inner = [*unshare_argv(), "--", sys.executable, "-m", "sandbox.netns", "--inside", *extra, "--", *command]
    sys.stdout.flush()
    sys.stderr.flush()
    # exec, not a child: signals reach CMD directly and its exit status is ours.
    os.execvp(inner[0], inner)
    return EXIT_RUNNER_FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main())
