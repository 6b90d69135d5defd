"""The slice of the kubelet's HTTPS API that `kubectl logs` needs: GET /containerLogs/...

The apiserver reaches it at the node's InternalIP and daemonEndpoints port. It does not verify
kubelet certificates unless --kubelet-certificate-authority is set, so a self-signed one (made
with the openssl CLI once per state dir) serves. Client certificates are not checked: the
server listens on loopback only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)
# (namespace, pod, container) -> (log files oldest first, newest still being written) or None
LogSource = Callable[[str, str, str], tuple[list[Path], bool] | None]
FOLLOW_POLL_S = 0.2


def ensure_cert(directory: Path) -> tuple[Path, Path]:
    crt, key = directory / "kubelet.crt", directory / "kubelet.key"
    if not (crt.exists() and key.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "3650",
                "-subj",
                "/CN=genpool-podrunner",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(crt),
            ],
            check=True,
            capture_output=True,
        )
        key.chmod(0o600)
    return crt, key


def _parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Entry:
    __slots__ = ("final", "stamp", "text")

    def __init__(self, line: bytes) -> None:
        stamp, _stream, tag, text = ([*line.rstrip(b"\n").split(b" ", 3), b"", b"", b""])[:4]
        self.stamp, self.final, self.text = stamp.decode(), tag != b"P", text

    def render(self, timestamps: bool) -> bytes:
        head = self.stamp.encode() + b" " if timestamps else b""
        return head + self.text + (b"\n" if self.final else b"")


class LogQuery:
    def __init__(self, query: dict[str, list[str]]) -> None:
        def one(key: str) -> str:
            return (query.get(key) or [""])[0]

        self.follow = one("follow") == "true"
        self.previous = one("previous") == "true"
        self.timestamps = one("timestamps") == "true"
        self.tail = int(one("tailLines")) if one("tailLines") else None
        self.limit = int(one("limitBytes")) if one("limitBytes") else None
        self.since = 0.0
        if one("sinceSeconds"):
            self.since = time.time() - int(one("sinceSeconds"))
        elif one("sinceTime"):
            self.since = _parse_time(one("sinceTime"))

    def keep(self, entry: Entry) -> bool:
        return not self.since or _parse_time(entry.stamp) >= self.since


def _entries(fh: BinaryIO) -> Iterator[Entry]:
    """Complete lines from the current position; a half-written last line waits for next time."""
    while True:
        pos = fh.tell()
        line = fh.readline()
        if not line.endswith(b"\n"):
            fh.seek(pos)
            return
        yield Entry(line)


class Handler(BaseHTTPRequestHandler):
    server: KubeletServer

    def log_message(self, format: str, *args: object) -> None:
        log.debug("kubelet api: " + format, *args)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["healthz"]:
            return self._reply(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._reply(404, b"not found: the pod runner serves only containerLogs")
        found = self.server.logs(parts[1], parts[2], parts[3])
        if found is None:
            return self._reply(404, f"container {parts[3]} of pod {parts[2]} not found".encode())
        q = LogQuery(parse_qs(url.query))
        files = found[0][:-1] if q.previous else found[0]
        if not files:
            which = "previous terminated" if q.previous else "a started"
            return self._reply(400, f"{which} container {parts[3]} not found".encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self._stream(files[-1], q, parts[1:], follow=q.follow and not q.previous)

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, path: Path, q: LogQuery, key: list[str], follow: bool) -> None:
        budget = q.limit
        with open(path, "rb") as fh:
            backlog = [e for e in _entries(fh) if q.keep(e)]
            if q.tail is not None:
                backlog = backlog[-q.tail :] if q.tail > 0 else []
            budget = self._send(backlog, q.timestamps, budget)
            while follow and budget != 0:
                fresh = list(_entries(fh))
                if fresh:
                    budget = self._send(fresh, q.timestamps, budget)
                    continue
                now = self.server.logs(*key)
                if now is None or not now[1] or now[0][-1] != path:
                    # The container stopped (or restarted): drain what is left, then end.
                    self._send(list(_entries(fh)), q.timestamps, budget)
                    return
                time.sleep(FOLLOW_POLL_S)

    def _send(self, entries: list[Entry], timestamps: bool, budget: int | None) -> int | None:
        data = b"".join(e.render(timestamps) for e in entries)
        if budget is not None:
            data, budget = data[:budget], budget - min(budget, len(data))
        if data:
            self.wfile.write(data)
            self.wfile.flush()
        return budget


class KubeletServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, cert_dir: Path, logs: LogSource) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        crt, key = ensure_cert(cert_dir)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(crt, key)
        self.logs = logs

    def finish_request(self, request: socketserver._RequestType, client_address: object) -> None:
        # TLS handshake in the request's own thread, so a stalled client cannot block accept().
        tls = self.ctx.wrap_socket(request, server_side=True)  # type: ignore[arg-type]
        super().finish_request(tls, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True, name="kubelet-api").start()
