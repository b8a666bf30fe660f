"""HTTP plumbing of the model server: reading requests, writing JSON, SSE and resets."""

from __future__ import annotations

import json
import socket
import struct
from http.server import BaseHTTPRequestHandler as Handler
from typing import Any

from . import _wire

_MAX_BODY = 64 * 1024 * 1024
Headers = dict[str, str] | None


def read_body(h: Handler) -> bytes:
    try:
        n = int(h.headers.get("content-length") or 0)
    except ValueError:
        n = 0
    return h.rfile.read(min(max(n, 0), _MAX_BODY)) if n else b""


def json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def models_page() -> dict[str, Any]:
    model = {
        "type": "model",
        "id": "claude-scripted",
        "display_name": "Scripted",
        "created_at": "2026-01-01T00:00:00Z",
    }
    return {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}


def start_response(h: Handler, status: int, ctype: str, extra: Headers = None) -> None:
    h.send_response(status)
    h.send_header("content-type", ctype)
    h.send_header("request-id", _wire.new_id("req_011C"))
    h.send_header("connection", "close")
    for k, v in (extra or {}).items():
        h.send_header(k, v)


def send(h: Handler, status: int, data: bytes, ctype: str, extra: Headers = None) -> None:
    start_response(h, status, ctype, extra)
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(data)
    h.wfile.flush()


def send_json(h: Handler, status: int, obj: Any, extra: Headers = None) -> None:
    send(h, status, json.dumps(obj, ensure_ascii=False).encode(), "application/json", extra)


def send_message(h: Handler, msg: dict[str, Any], cut: int | None) -> None:
    data = json.dumps(msg, ensure_ascii=False).encode()
    if cut is None:
        send(h, 200, data, "application/json")
        return
    start_response(h, 200, "application/json")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data[: len(data) // 2])
    h.wfile.flush()
    reset(h)


def send_stream(h: Handler, events: list[bytes], cut: int | None) -> None:
    """SSE over chunked encoding, as the real API; ``cut`` resets after that many events."""
    start_response(h, 200, "text/event-stream; charset=utf-8", {"cache-control": "no-cache"})
    h.send_header("transfer-encoding", "chunked")
    h.end_headers()
    for n, event in enumerate(events):
        if cut is not None and n >= cut:
            h.wfile.flush()
            reset(h)
            return
        h.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        h.wfile.flush()
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


def reset(h: Handler) -> None:
    """Abort this handler's connection with RST, the way a dropped network path looks."""
    try:
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.rfile.close()  # the fd closes only once no file object refers to it
        h.connection.close()
    except OSError:
        pass


def drop(conn: socket.socket) -> None:
    """Break a connection another thread is serving: it sees EOF/errors, the client a reset."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
