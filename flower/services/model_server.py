"""A scripted model server: the Anthropic Messages API on loopback, for tests and the demo.

The real Claude Code CLI talks to whatever ``ANTHROPIC_BASE_URL`` names; point it here
(see :func:`flower.services.cli_env.cli_env`) and it gets scripted answers, with no network
and no API key. Every request is recorded (:attr:`ModelServer.requests`), so a test can
assert what the model was sent, e.g. that a resumed session carried its earlier turns.

The script format, :data:`flower.testing.SCRIPT_FORMAT`, is appended to this docstring
below (and printed by ``flower-super model-server --help``).

In a test::

    with ModelServer(script, log_path=tmp / "requests.jsonl") as server:
        env = cli_env(tmp / "home", server.url)          # flower.services.cli_env
        subprocess.run([claude_path(), "-p", "[[build]] go", "--output-format", "json"],
                       env=env, cwd=work, capture_output=True, timeout=60)
        held = server.wait_for(lambda reqs: [r for r in reqs if r.turn == 1])
        assert not any("API Error" in t for t in server.texts_sent(held[0].session_id))

Run standalone: ``python -m flower.services.model_server --script FILE [--port N] [--log FILE]``
prints the URL once listening and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flower._errors import ConfigError

from . import _http, _wire
from ._format import SCRIPT_FORMAT
from ._log import RecordedRequest, RequestLog, redact_headers
from ._script import Script, Selection, Turn, session_id_of, system_text

__all__ = ["ModelServer", "RecordedRequest", "Script", "main"]

# One text for the format wherever it is read: help(), the docs, the command line.
__doc__ = f"{__doc__}\n{SCRIPT_FORMAT}"

T = TypeVar("T")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    app: ModelServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flower-model-server"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # the request log is ours
        pass

    def do_POST(self) -> None:
        self.server.app._handle(self)

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST


class ModelServer:
    """A loopback Messages API server answering from a script (see the module docstring).

    Thread-safe; serves many CLI processes at once. Use as a context manager or call
    :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        script: Script | dict[str, Any] | str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | Path | None = None,
    ) -> None:
        self._script = Script.coerce(script)
        self._host = host
        self._port = port
        self._log = RequestLog(log_path)
        self._lock = threading.Lock()
        self._fired: dict[tuple[str, int], int] = {}
        self._owners: dict[str, str] = {}  # one_session conversation -> the session it took
        self._conns: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._state = threading.Condition()  # notified whenever listening starts or stops
        self._dark = False
        self._outage_thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> ModelServer:
        """Bind and serve in background threads; returns self."""
        self._listen()
        return self

    def stop(self) -> None:
        """Stop listening, drop open connections (held requests too), close the log."""
        self._stopping.set()
        if self._outage_thread is not None:
            self._outage_thread.join(timeout=10)  # first: it must not listen again behind us
        self._unlisten()
        self._drop_connections()
        self._log.close()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` — the value for ``ANTHROPIC_BASE_URL``."""
        return f"http://{self._host}:{self._port}"

    @property
    def listening(self) -> bool:
        """False while stopped or in an outage."""
        return self._httpd is not None

    def wait_listening(self, listening: bool = True, timeout: float = 10.0) -> None:
        """Wait until the server is (or, with False, is not) listening; TimeoutError if not."""
        with self._state:
            if not self._state.wait_for(lambda: self.listening == listening, timeout):
                state = "listening" if listening else "stopped listening"
                raise TimeoutError(f"model server: not {state} within {timeout:g}s")

    def set_script(self, script: Script | dict[str, Any] | str | Path) -> None:
        """Replace the script and forget the ``times`` counters and which session took
        each ``one_session`` conversation."""
        parsed = Script.coerce(script)
        with self._lock:
            self._script = parsed
            self._fired.clear()
            self._owners.clear()

    def outage(self, seconds: float) -> None:
        """Drop every connection and refuse new ones for ``seconds``, then listen again."""
        with self._lock:
            if self._dark or self._stopping.is_set():
                return
            self._dark = True
        self._outage_thread = threading.Thread(
            target=self._run_outage, args=(seconds,), name="model-server-outage", daemon=True
        )
        self._outage_thread.start()

    # --- the request log ---------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a snapshot)."""
        return self._log.snapshot()

    def requests_for(self, session_id: str) -> list[RecordedRequest]:
        return [r for r in self._log.snapshot() if r.session_id == session_id]

    def texts_sent(self, session_id: str | None = None) -> list[str]:
        """All text the Messages requests carried (of one session, or of all)."""
        return [
            t
            for r in self._log.snapshot()
            if r.path == "/v1/messages" and (session_id is None or r.session_id == session_id)
            for t in r.texts()
        ]

    def wait_for(self, predicate: Callable[[list[RecordedRequest]], T], timeout: float = 10.0) -> T:
        """Wait until ``predicate(requests)`` is truthy and return it; TimeoutError if not."""
        return self._log.wait_for(predicate, timeout)

    # --- listening -----------------------------------------------------------------------

    def _listen(self) -> None:
        deadline = time.monotonic() + 5.0
        while True:
            try:
                httpd = _HTTPServer((self._host, self._port), _Handler)
                break
            except OSError:
                # Rebinding after an outage: the port can stay busy for a moment.
                if self._port == 0 or time.monotonic() > deadline:
                    raise
                self._stopping.wait(0.05)
        httpd.app = self
        self._port = httpd.server_address[1]
        thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"model-server-{self._port}",
        )
        thread.start()
        with self._state:
            self._httpd, self._thread = httpd, thread
            self._state.notify_all()

    def _unlisten(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        with self._state:  # only now: until server_close the kernel still accepts
            self._httpd = self._thread = None
            self._state.notify_all()

    def _run_outage(self, seconds: float) -> None:
        try:
            self._unlisten()
            self._drop_connections()
            if not self._stopping.wait(seconds):
                self._listen()
        finally:
            with self._lock:
                self._dark = False

    def _drop_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _http.drop(conn)

    # --- handling ------------------------------------------------------------------------

    def _handle(self, h: _Handler) -> None:
        with self._lock:
            self._conns.add(h.connection)
        h.close_connection = True  # one request per connection: outages must bite at once
        try:
            self._dispatch(h)
        except OSError:
            pass  # the client went away (killed CLI, cut stream): nothing to answer
        finally:
            with self._lock:
                self._conns.discard(h.connection)

    def _dispatch(self, h: _Handler) -> None:
        raw = _http.read_body(h)
        path = urlsplit(h.path).path.rstrip("/")
        if h.command == "HEAD":
            self._record(h, {}, answer="head")
            _http.send(h, 200, b"", "text/plain")
        elif h.command == "POST" and path == "/v1/messages":
            self._messages(h, raw)
        elif h.command == "POST" and path == "/v1/messages/count_tokens":
            body = _http.json_or_none(raw) or {}
            self._record(h, body, answer="count_tokens")
            _http.send_json(h, 200, {"input_tokens": _wire.estimate_tokens(len(raw))})
        elif h.command == "GET" and path.startswith("/v1/models"):
            self._record(h, {}, answer="models")
            _http.send_json(h, 200, _http.models_page())
        else:
            self._record(h, _http.json_or_none(raw) or {}, answer="not_found", status=404)
            err = _wire.ApiError.of(404, f"Not found: {h.command} {h.path}")
            _http.send_json(h, 404, err.body())

    def _messages(self, h: _Handler, raw: bytes) -> None:
        body = _http.json_or_none(raw)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._reject(h, body if isinstance(body, dict) else {}, "messages: Field required")
            return
        problem = _wire.tool_pairing_error(body["messages"])
        if problem:
            self._reject(h, body, problem)
            return
        with self._lock:
            sel = self._script.select(body, self._owners)
            active = self._consume(sel)
        kind, status, turn = _plan(sel, active)
        delay = sel.turn.delay if (active and sel.turn is not None) else 0.0
        self._record(h, body, sel=sel, answer=kind, status=status, delay=delay)
        if delay and self._stopping.wait(delay):
            _http.reset(h)
            return
        self._answer(h, body, raw, sel, kind, turn)

    def _consume(self, sel: Selection) -> bool:
        """Whether this request fires the turn's fault/delay (counts it if so). Holds _lock."""
        turn = sel.turn
        if turn is None or sel.conversation is None:
            return False
        if turn.fault_kind is None and not turn.delay:
            return False
        key = (sel.conversation.name, sel.index)
        if turn.times is not None and self._fired.get(key, 0) >= turn.times:
            return False
        self._fired[key] = self._fired.get(key, 0) + 1
        return True

    def _answer(
        self, h: _Handler, body: dict[str, Any], raw: bytes, sel: Selection, kind: str, turn: Turn
    ) -> None:
        if kind == "error":
            assert turn.error is not None
            _http.send_json(h, turn.error.status, turn.error.body(), turn.error.headers())
            return
        if kind == "outage":
            # Stop listening before the reset: a client that reconnects at once must find the
            # port refusing, as in a real outage, not the server still up for a moment.
            self.outage(turn.outage or 0.0)
            with contextlib.suppress(TimeoutError):
                self.wait_listening(False, timeout=5.0)
            _http.reset(h)
            return
        ids = turn.tool_ids(sel.index)
        usage = _wire.usage_for(turn, _wire.estimate_tokens(len(raw)))
        model = str(body.get("model") or "claude-scripted")
        cut = turn.cut if kind == "cut" else None
        if body.get("stream"):
            _http.send_stream(h, _wire.sse_events(turn, model, ids, usage), cut)
        else:
            _http.send_message(h, _wire.message(turn, model, ids, usage), cut)

    def _reject(self, h: _Handler, body: dict[str, Any], message: str) -> None:
        self._record(h, body, answer="rejected", status=400, detail=message)
        _http.send_json(h, 400, _wire.error_body("invalid_request_error", message))

    def _record(
        self,
        h: _Handler,
        body: dict[str, Any],
        *,
        answer: str,
        status: int = 200,
        sel: Selection | None = None,
        delay: float = 0.0,
        detail: str = "",
    ) -> None:
        stream = body.get("stream")
        self._log.add(
            RecordedRequest(
                seq=0,
                time=time.time(),
                method=h.command,
                path=urlsplit(h.path).path,
                headers=redact_headers(h.headers),
                session_id=session_id_of(body) or h.headers.get("x-claude-code-session-id"),
                conversation=sel.conversation.name if sel and sel.conversation else None,
                turn=sel.index if sel and sel.conversation else None,
                stream=bool(stream) if stream is not None else None,
                model=body.get("model"),
                system=system_text(body),
                messages=list(body.get("messages") or []),
                tools=[str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)],
                answer=answer,
                status=status,
                delay=delay,
                detail=detail,
            )
        )


def _plan(sel: Selection, active: bool) -> tuple[str, int, Turn]:
    """(answer kind, HTTP status, the turn to send) for a selection."""
    if sel.conversation is None:
        return "unmatched", 200, Turn(text="[model server] no conversation matches this request")
    turn = sel.turn
    if turn is None:
        note = f"[model server] conversation {sel.conversation.name!r} has no turn {sel.index}"
        return "exhausted", 200, Turn(text=note)
    fault = turn.fault_kind if active else None
    if fault == "error":
        assert turn.error is not None
        return "error", turn.error.status, turn
    if fault is not None:
        return fault, 200, turn
    return turn.content_kind(), 200, turn


# --- command line ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m flower.services.model_server --script FILE [--port N] [--log FILE]``."""
    parser = argparse.ArgumentParser(
        prog="model-server",
        description="Serve the Anthropic Messages API on loopback from a script (no network).",
        epilog=SCRIPT_FORMAT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--script", required=True, help="JSON script (format: below)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--log", help="append every request to this JSONL file (0600)")
    args = parser.parse_args(argv)
    try:
        server = ModelServer(args.script, host=args.host, port=args.port, log_path=args.log)
        server.start()
    except ConfigError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"model-server: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return _serve_until_signal(server)


def _serve_until_signal(server: ModelServer) -> int:
    done = threading.Event()
    previous = {s: signal.signal(s, lambda *_: done.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        print(server.url, flush=True)
        done.wait()
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
