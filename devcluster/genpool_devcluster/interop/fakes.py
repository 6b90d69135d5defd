"""Recording fakes for ``capture``: HTTP servers that log each request the sidecar sends them
and answer as a GenPool prefill worker (or a failing one) and a decode worker would."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from genpool_devcluster.interop.common import FAKE_MODE_HEADER


class Recorder(ThreadingHTTPServer):
    """An HTTP server that records every request and answers as ``answer`` says."""

    daemon_threads = True

    def __init__(self, role: str, answer: Callable[[Recorder, dict[str, Any]], Any]) -> None:
        self.role = role
        self.answer = answer
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _RecordingHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.records.append(entry)


class _RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recorder

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        entry = {
            "to": self.server.role,
            "method": self.command,
            "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body": raw.decode(errors="replace"),
        }
        self.server.record(entry)
        status, headers, body = self.server.answer(self.server, entry)
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        if isinstance(body, list):  # SSE chunks
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for chunk in body:
                data = chunk.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = body.encode()
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    do_POST = _handle
    do_GET = _handle
    do_DELETE = _handle


def _header(entry: dict[str, Any], name: str) -> str:
    return next((v for k, v in entry["headers"] if k.lower() == name), "")


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def fake_prefill_answer(server: Recorder, entry: dict[str, Any]) -> tuple[int, list[Any], str]:
    """What a GenPool prefill worker answers (docs/pd.md), or a failure on request."""
    mode = _header(entry, FAKE_MODE_HEADER) or "ok"
    if mode == "status-503":
        return 503, [("content-type", "application/json")], '{"error": "busy"}'
    host_header = _header(entry, "host")
    chat = entry["path"].startswith("/v1/chat")
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": " Paris"}
    else:
        choice["text"] = " Paris"
    reply: dict[str, Any] = {
        "id": "cmpl-fake-prefill",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": "synthetic:tiny",
        "choices": [choice],
        "usage": _usage(5, 1, cached=3),
    }
    if mode != "no-kv":
        reply["kv_transfer_params"] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "genpool": {
                "version": 1,
                "transfer_id": uuid.uuid4().hex,
                "host_header_seen": host_header,  # what the prefiller would take for its host
                "num_prompt_tokens": 5,
                "first_token": 42,
            },
        }
    return 200, [("content-type", "application/json")], json.dumps(reply)


def fake_decode_answer(server: Recorder, entry: dict[str, Any]) -> tuple[int, list[Any], Any]:
    body = json.loads(entry["body"] or "{}")
    chat = entry["path"].startswith("/v1/chat")
    if body.get("stream"):
        chunks = []
        for text in (" Paris", ".", ""):
            delta = {"content": text} if text else {}
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                     "model": "synthetic:tiny",
                     "choices": [{"index": 0, "delta": delta,
                                  "finish_reason": None if text else "stop"}]}  # fmt: skip
            chunks.append(f"data: {json.dumps(chunk)}\n\n")
        usage = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                 "model": "synthetic:tiny", "choices": [], "usage": _usage(5, 2, None)}  # fmt: skip
        chunks += [f"data: {json.dumps(usage)}\n\n", "data: [DONE]\n\n"]
        return 200, [("content-type", "text/event-stream")], chunks
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": " Paris."}
    else:
        choice["text"] = " Paris."
    reply = {"id": "cmpl-fake-decode", "object": "chat.completion" if chat else "text_completion",
             "created": 0, "model": "synthetic:tiny", "choices": [choice],
             "usage": _usage(5, 2, None)}  # fmt: skip
    return 200, [("content-type", "application/json")], json.dumps(reply)


@contextmanager
def serving(recorder: Recorder) -> Iterator[Recorder]:
    thread = threading.Thread(target=recorder.serve_forever, name=recorder.role, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.shutdown()
        recorder.server_close()
