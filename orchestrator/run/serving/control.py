"""The running service's control socket and its clients: `serve status | apply | down` talk to the `serve` process.

The service listens on a Unix socket (mode 0600: only its user may change or stop it) and writes a state file
`<state dir>/<name>.json` (pid, gateway, socket, log) while it serves. Routes: `GET /status` (JSON), `POST /apply`
and `POST /down`, which stream newline-delimited JSON: `{"line": ...}` as the service says them, then `{"ok": ...}`
(apply) or `{"rc": ...}` (down, once torn down).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import httpx

if TYPE_CHECKING:
    from orchestrator.run.serving.service import Service

STATE_DIR_ENV = "PD_ORCHESTRATOR_SERVE_DIR"
LOG_ENV = "PD_ORCHESTRATOR_SERVE_LOG"  # set by `serve --detach`: where the service's output goes
DEFAULT_STATE_DIR = "runs/serve"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


class ServiceNotFound(RuntimeError):
    """No running service matches; the message says what runs and how to name one."""


def state_dir(given: str | Path | None = None) -> Path:
    return Path(given or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR).expanduser().resolve()


def socket_path(directory: Path, name: str) -> Path:
    path = directory / f"{name}.sock"
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    return Path("/tmp") / f"pdo-serve-{hashlib.sha1(str(path).encode()).hexdigest()[:12]}.sock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_services(directory: Path) -> dict[str, dict]:
    """name -> state of every service whose process lives; stale state files (a killed service) are removed."""
    out = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(int(state.get("pid", 0))):
            out[state["name"]] = state
        else:
            path.unlink(missing_ok=True)
    return out


def find_service(directory: Path, name: str | None) -> dict:
    services = running_services(directory)
    if name is not None:
        if name not in services:
            raise ServiceNotFound(f"no service named {name!r} runs (state dir {directory}); running: "
                                  f"{', '.join(services) or 'none'}")
        return services[name]
    if len(services) == 1:
        return next(iter(services.values()))
    if not services:
        raise ServiceNotFound(f"no service runs (state dir {directory}); start one with `pd-orchestrator serve "
                              "--config X --detach`")
    raise ServiceNotFound(f"{len(services)} services run ({', '.join(services)}): name one with --name")


class _Handler(BaseHTTPRequestHandler):
    server: "_UnixHTTPServer"

    def log_message(self, *args) -> None:  # the service's own lines say what happened
        pass

    def _send(self, status: int, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.end_headers()

    def _stream(self, items: Iterator[dict]) -> None:
        self._send(200, "application/x-ndjson")
        for item in items:
            self._stream_end(item)

    def _stream_end(self, item: dict) -> None:
        self.wfile.write(json.dumps(item).encode() + b"\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path != "/status":
            self._send(404, "text/plain")
            return
        try:
            body, status = self.server.service.status(), 200
        except Exception as exc:
            body, status = {"error": f"{type(exc).__name__}: {exc}"}, 500
        self._send(status, "application/json")
        self.wfile.write(json.dumps(body).encode())

    def do_POST(self) -> None:
        service = self.server.service
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/apply":
            self._stream(_apply_stream(service, request))
        elif self.path == "/down":
            start = service.line_count()
            self.server.down_streams.acquire()  # close() waits for the last item to be written
            try:
                service.request_stop("serve down")
                self._stream(({"line": line} for line in service.lines_from(start)))
                self._stream_end({"rc": service.rc})
            finally:
                self.server.down_streams.release()
        else:
            self._send(404, "text/plain")


def _apply_stream(service: "Service", request: dict) -> Iterator[dict]:
    """Run one layout change in this handler's thread, yielding its lines as they are said."""
    from orchestrator.run.serving.changes import apply_layout

    lines: list[str] = []
    done = threading.Event()
    result: dict = {}
    said = threading.Condition()

    def say(line: str) -> None:
        service.say(line)
        with said:
            lines.append(line)
            said.notify_all()

    def work() -> None:
        try:
            result["ok"] = apply_layout(service, request.get("config_yaml"), request.get("overrides") or [], say)
        except Exception as exc:  # a bug must still end the client's stream with a reason
            say(f"apply: failed: {type(exc).__name__}: {exc}")
            result["ok"] = False
        finally:
            done.set()
            with said:
                said.notify_all()

    threading.Thread(target=work, name="serve-apply", daemon=True).start()
    at = 0
    while True:
        with said:
            while at >= len(lines) and not done.is_set():
                said.wait(1.0)
            fresh, at = lines[at:], len(lines)
        yield from ({"line": line} for line in fresh)
        if done.is_set() and at >= len(lines):
            break
    yield {"ok": result.get("ok", False)}


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    service: "Service"
    down_streams: threading.BoundedSemaphore


class ControlServer:
    """The service's control socket (a thread) and state file; `close()` removes both."""

    def __init__(self, service: "Service", directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.state_path = directory / f"{service.cfg.name}.json"
        self.socket = socket_path(directory, service.cfg.name)
        self.socket.unlink(missing_ok=True)  # a killed service's leftover (running_services checked the pid)
        self.server = _UnixHTTPServer(str(self.socket), _Handler)
        os.chmod(self.socket, 0o600)
        self.server.service = service
        self.server.down_streams = threading.BoundedSemaphore(1)
        threading.Thread(target=self.server.serve_forever, name="serve-control", daemon=True).start()
        self.state_path.write_text(json.dumps({
            "name": service.cfg.name, "pid": os.getpid(), "gateway": service.gateway, "model": service.cfg.model.name,
            "socket": str(self.socket), "run_id": service.run_id, "started_at": service.started_at,
            "log": os.environ.get(LOG_ENV)}))

    def forget(self) -> None:
        """Remove the state file: from now on `serve status | apply | down` do not find this service."""
        self.state_path.unlink(missing_ok=True)

    def close(self) -> None:
        self.forget()
        if self.server.down_streams.acquire(timeout=10):  # a `serve down` client gets its last line first
            self.server.down_streams.release()
        self.server.shutdown()
        self.server.server_close()
        self.socket.unlink(missing_ok=True)


def _client(state: dict) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=state["socket"]), base_url="http://service")


def service_status(state: dict) -> dict:
    with _client(state) as client:
        r = client.get("/status", timeout=60)
    body = r.json()
    if r.status_code != 200:
        raise RuntimeError(f"service {state['name']} could not say its status: {body.get('error')}")
    return body


def stream_control(state: dict, path: str, body: dict, timeout_s: float) -> Iterator[dict]:
    """POST to the service's control socket and yield its newline-delimited JSON items as they come."""
    with _client(state) as client:
        with client.stream("POST", path, json=body, timeout=httpx.Timeout(timeout_s, connect=10)) as r:
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)


def signal_down(state: dict, timeout_s: float) -> int:
    """Stop a service whose socket does not answer: SIGTERM (its drain and teardown run), wait for its exit; 0 when
    it exited and its log (detached) says it drained, else 1."""
    import time

    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = Path(state.get("log") or "")
    text = log.read_text(errors="replace") if log.is_file() else ""
    tail = text[text.rfind("stopping ("):] if "stopping (" in text else ""
    if tail:
        print(tail.rstrip())
    if _pid_alive(pid):
        print(f"serve down: pid {pid} still runs after {timeout_s:g} s", file=sys.stderr)
        return 1
    return 0 if "drained: no request in flight" in tail else 1
