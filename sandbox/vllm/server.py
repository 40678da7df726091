"""The API server's socket and HTTP plumbing (stdlib, so the process starts in a fraction of a second).

Like vLLM, the port is bound right after argument parsing and only starts listening once the engine is
ready: until then a connection attempt is refused, which is what Cloud Run's TCP startup probe sees.
"""

from __future__ import annotations

import socket
import socketserver
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sandbox.vllm.cli import ServeArgs
from sandbox.vllm.errors import VllmStartupError
from sandbox.vllm.instance import InstanceEnv
from sandbox.vllm.logs import VllmLog
from sandbox.vllm.openai_api import OpenAiApi, Response, dumps

LOOPBACK = "127.0.0.1"
# Cloud Run reaches the container through its network interface: a server on loopback only is unreachable.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
BACKLOG = 512
# uvicorn closes idle keep-alive connections after 5 s.
KEEP_ALIVE_S = 5.0

_ROUTES: dict[str, dict[str, str]] = {
    "/health": {"GET": "health"},
    "/ping": {"GET": "health", "POST": "health"},
    "/load": {"GET": "load"},
    "/version": {"GET": "version"},
    "/metrics": {"GET": "metrics"},
    "/v1/models": {"GET": "models"},
    "/v1/chat/completions": {"POST": "chat_completions"},
    "/v1/completions": {"POST": "completions"},
}
# Under /metrics/... vLLM's Mount of prometheus_client's make_asgi_app answers (its path_regex "^/metrics(?P<path>.*)$",
# vllm/entrypoints/serve/instrumentator/metrics.py); GET /metrics itself is the instrumentator's route, matched first.
METRICS_MOUNT = {"GET": "metrics_mount"}
# Paths vLLM's prometheus-fastapi-instrumentator leaves out of http_requests_total: its excluded_handlers
# (vllm/entrypoints/serve/instrumentator/metrics.py), regexes searched in the handler, so substrings here.
UNINSTRUMENTED = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")


def reserve_port(args: ServeArgs, env: InstanceEnv, log: VllmLog) -> socket.socket:
    """Bind (without listening) the host port that stands for the port vLLM binds in the container."""
    host_port = env.host_port(args.port)
    if args.host in LOOPBACK_HOSTS and env.port_map is not None:
        log.sandbox(
            f"--host {args.host} listens on the container's loopback only: Cloud Run's probe and requests "
            "cannot reach it. Use --host 0.0.0.0."
        )
        host_port = None
    elif host_port is None:
        log.sandbox(
            f"vLLM listens on container port {args.port}, but Cloud Run sends probes and requests to "
            f"PORT={env.container_port}: nothing will reach this server (lesson 4)."
        )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, host_port or 0))
    except OSError as exc:
        sock.close()
        raise VllmStartupError(
            "OSError",
            f"[Errno {exc.errno}] error while attempting to bind on address ('{args.host or '0.0.0.0'}', "
            f"{args.port}): {exc.strerror}",
            where="vllm/entrypoints/openai/api_server.py",
        ) from None
    return sock


class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests to the API; keep-alive, chunked streams."""

    protocol_version = "HTTP/1.1"
    timeout = KEEP_ALIVE_S
    # uvicorn runs on asyncio, which sets TCP_NODELAY on every TCP socket. Without it the body (a second write
    # after the headers) waits for the client's delayed ACK: about 40 ms real, seconds on the sandbox clock.
    disable_nagle_algorithm = True
    server: ApiServer

    def version_string(self) -> str:
        """The Server header vLLM's uvicorn sends."""
        return "uvicorn"

    def log_message(self, format: str, *args: object) -> None:
        # Access lines are written by _log_access in uvicorn's format instead.
        pass

    def _log_access(self, status: int) -> None:
        # Before the response's first bytes go out, as uvicorn logs it (uvicorn/protocols/http/httptools_impl.py and
        # h11_impl.py: the access line, then transport.write of the status line and headers): a client that has its
        # answer finds the line already written.
        if self.server.access_log:
            phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
            host, port = self.client_address[:2]
            self.server.log.access(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {status} {phrase}')

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self._read_body()
        methods = _ROUTES.get(path) or (METRICS_MOUNT if path.startswith("/metrics") else None)
        method = "GET" if self.command == "HEAD" else self.command
        api = self.server.api
        # prometheus-fastapi-instrumentator's handler label: the route that fully matches, else "none". A wrong
        # method only matches its path partly, and vLLM's own route walk (vllm/entrypoints/serve/instrumentator/
        # metrics.py, _patch_instrumentator_route_walk) then returns None: a 405 counts as handler "none" too.
        # Excluded handlers go uncounted.
        instrumented = not any(excluded in path for excluded in UNINSTRUMENTED)
        label = path if methods is not None and method in methods else "none"
        if methods is None:
            response = Response(404, dumps({"detail": "Not Found"}))
        elif method not in methods:
            response = Response(405, dumps({"detail": "Method Not Allowed"}))
        elif not api.authorized(path, {k.lower(): v for k, v in self.headers.items()}):
            response = Response(401, dumps({"error": "Unauthorized"}))
            # vLLM adds its API-key middleware after the instrumentator, so Starlette runs it outside: not counted.
            instrumented = False
        else:
            name = methods[method]
            handler = getattr(api, name)
            if name in ("chat_completions", "completions"):
                response = handler(body)
            elif name == "metrics_mount":
                response = handler(self.headers.get("Accept", ""), self.headers.get("Accept-Encoding", ""))
            else:
                response = handler()
        command = self.command

        def answered() -> None:
            if instrumented:
                api.engine.http_answered(label, command, response.status)

        self._send(response, answered)

    def _send(self, response: Response, answered: Callable[[], None]) -> None:
        """Send the response; ``answered`` counts it in /metrics just before its last bytes go out (the
        instrumentator counts once the app returns; a client that has read the whole answer sees it counted)."""
        self.send_response_only(response.status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        if response.content_type:
            self.send_header("content-type", response.content_type)
        if response.content_encoding:
            self.send_header("content-encoding", response.content_encoding)
        if response.stream is None:
            self.send_header("content-length", str(len(response.body)))
            self._log_access(response.status)
            self.end_headers()
            answered()
            if self.command != "HEAD":
                self.wfile.write(response.body)
            return
        self.send_header("transfer-encoding", "chunked")
        self._log_access(response.status)
        self.end_headers()
        try:
            for chunk in response.stream:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-stream; vLLM aborts the request the same way. Its 200 was sent: it counts.
            self.close_connection = True
            # Counted before the stream's close lowers num_requests_running: no scrape sees one without the other.
            answered()
            response.stream.close()  # type: ignore[attr-defined]
            return
        answered()
        try:
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        """Route a GET request."""
        self._dispatch()

    def do_POST(self) -> None:
        """Route a POST request."""
        self._dispatch()

    def do_PUT(self) -> None:
        """Route a PUT request."""
        self._dispatch()

    def do_DELETE(self) -> None:
        """Route a DELETE request."""
        self._dispatch()

    def do_HEAD(self) -> None:
        """Route a HEAD request."""
        self._dispatch()


class ApiServer(ThreadingHTTPServer):
    """A threading HTTP server on a socket bound earlier by ``reserve_port``."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, sock: socket.socket, api: OpenAiApi, log: VllmLog, access_log: bool) -> None:
        socketserver.TCPServer.__init__(self, sock.getsockname(), _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = LOOPBACK, self.server_address[1]
        self.api = api
        self.log = log
        self.access_log = access_log

    def start_listening(self) -> None:
        """From now on connections are accepted (queued until serve_forever picks them up)."""
        self.server_activate()
