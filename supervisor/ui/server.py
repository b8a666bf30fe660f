"""``flower-super ui``: the web view's server (Starlette on uvicorn, every asset in the
package: no network at run time).

Safety, by default and always:

- It listens on ``127.0.0.1`` unless ``--host`` says otherwise.
- A token is made at each start and printed once, in the URL. Opening that URL sets a
  cookie (HttpOnly, SameSite=Strict) and drops the token from the address bar. On loopback
  the runs and timelines are served without it; a transcript (a step's conversation) and
  every action (cancel) need it, wherever the server listens. On any other address every
  request needs it.
- Actions: cancel a live run; answer a question it waits on (posted to the run's answers
  mailbox, :mod:`flower.people.answers`: the terminal and the page race, the first wins).
- On loopback, a request whose ``Host`` is not a loopback name or address is refused (a
  web page elsewhere cannot rebind a name of its own to 127.0.0.1 and read the runs). A
  question's words (the conversation's) are in a timeline only for the token.
- An action must also come from the page itself (its ``Origin`` is this server).
- What the pages and the stream carry is what ``status``/``show`` print: no API key, no
  password (state URLs are shown masked), never the state URL in full.

Live: ``/api/stream`` is a server-sent events stream that says ``change`` when anything a
page shows changed (a new attempt, a tool call, a step's end, a run's end): it compares
:func:`supervisor.ui.model.signature` every 0.5 s (up to 1.5 s when a look is dear), the
same way for a run_dir and for a database (a poll, not the database's NOTIFY: the
listener is the cluster's mailbox relay's).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower.i18n import keys, lang, texts
from flower.state.backends import RunState
from supervisor.ui import model
from supervisor.ui import texts as _defined  # noqa: F401 - the ui.* texts

STATIC = Path(__file__).parent / "static"
COOKIE = "flower_ui"
LIVE_POLL_S = 0.5  # the stream looks this often...
LIVE_MAX_PAUSE_S = 1.5  # ...or, when a look is dear, at least this often
KEEPALIVE_S = 15.0


@dataclass
class UI:
    """What the server serves: the run state (opened once, read under a lock: one
    database connection per process), the token, and whether it listens on loopback."""

    state: RunState
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    loopback: bool = True
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on a worker thread, one at a time (the state is one connection)."""
        async with self.lock:
            return await asyncio.to_thread(fn)


def app(ui: UI) -> Any:
    """The Starlette application serving ``ui``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import (
        FileResponse,
        JSONResponse,
        RedirectResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import Route

    def cookie(request: Request) -> str:
        # one per port: browsers keep cookies per host, and two views may run side by side
        return f"{COOKIE}_{request.url.port or 80}"

    def authed(request: Request) -> bool:
        given = request.cookies.get(cookie(request)) or request.headers.get("x-flower-token") or ""
        return hmac.compare_digest(given.encode(), ui.token.encode())

    def refused() -> Response:
        return JSONResponse({"error": "token"}, status_code=403)

    def guard(request: Request, *, private: bool = False) -> Response | None:
        """None when ``request`` may be served; else the refusal."""
        if ui.loopback and not _loopback_host(request.headers.get("host", "")):
            return refused()  # a name that resolved to this machine (DNS rebinding): no
        if (private or not ui.loopback) and not authed(request):
            return refused()
        return None

    def same_origin(request: Request) -> bool:
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        return origin is not None and origin.split("://", 1)[-1] == host

    async def index(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:
            if not hmac.compare_digest(token.encode(), ui.token.encode()):
                return refused()
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(
                cookie(request), ui.token, httponly=True, samesite="strict", path="/"
            )
            return response
        if (no := guard(request)) is not None:
            return no
        page = (STATIC / "index.html").read_text(encoding="utf-8")
        boot = {"lang": lang(), "texts": _texts(), "authed": authed(request)}
        nonce = secrets.token_urlsafe(16)
        page = page.replace("__NONCE__", nonce).replace(
            "__BOOT__", json.dumps(boot, ensure_ascii=False).replace("</", "<\\/")
        )
        policy = (
            f"default-src 'self'; script-src 'self' 'nonce-{nonce}'; style-src 'self'; "
            "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
        )
        headers = {**_NO_STORE, "Content-Security-Policy": policy, "X-Frame-Options": "DENY"}
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    async def asset(request: Request) -> Response:
        if (no := guard(request)) is not None:
            return no
        name = request.path_params["name"]
        path = STATIC / name
        if name not in _ASSETS or not path.is_file():
            return Response(status_code=404)
        return FileResponse(path, headers=_NO_STORE)

    async def api_runs(request: Request) -> Response:
        if (no := guard(request)) is not None:
            return no
        data = await ui.read(lambda: model.runs(ui.state))
        return JSONResponse(data, headers=_NO_STORE)

    async def api_timeline(request: Request) -> Response:
        if (no := guard(request)) is not None:
            return no
        run = request.path_params["run"]
        try:
            data = await ui.read(lambda: model.timeline(ui.state, run))
        except KeyError:
            return JSONResponse({"error": "unknown run"}, status_code=404)
        if not authed(request):  # a question's words are the conversation's: the token's
            data["questions_hidden"] = len(data["questions"])
            data["questions"] = []
            for mark in data["marks"]:
                mark.pop("text", None)
            for attempt in data["attempts"]:  # an error's text may quote the model
                attempt["error"] = "…" if attempt["error"] else None
        return JSONResponse(data, headers=_NO_STORE)

    async def api_tools(request: Request) -> Response:
        if (no := guard(request)) is not None:
            return no
        run, sid = request.path_params["run"], request.query_params.get("session", "")
        try:
            data = await ui.read(lambda: model.tool_calls(ui.state, run, sid))
        except KeyError:
            return JSONResponse({"error": "unknown run"}, status_code=404)
        return JSONResponse({"tool_calls": data}, headers=_NO_STORE)

    async def api_step(request: Request) -> Response:
        if (no := guard(request, private=True)) is not None:
            return no
        run, label = request.path_params["run"], request.path_params["label"]
        try:
            data = await ui.read(lambda: model.step(ui.state, run, label))
        except KeyError:
            return JSONResponse({"error": "unknown step"}, status_code=404)
        return JSONResponse(data, headers=_NO_STORE)

    async def api_cancel(request: Request) -> Response:
        if (no := guard(request, private=True)) is not None:
            return no
        if not same_origin(request):
            return JSONResponse({"error": "origin"}, status_code=403)
        from flower import FlowerError
        from supervisor.inspect.cancel import cancel

        run = request.path_params["run"]
        try:
            holder = await ui.read(lambda: model.state_of_run(ui.state, run))
            # not under the read lock: cancel waits (up to 30 s) for the run to go
            done = await asyncio.to_thread(cancel, holder, run)
        except KeyError:
            return JSONResponse({"error": "unknown run"}, status_code=404)
        except FlowerError as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return JSONResponse({"run": done.record.run, "stopped": done.stopped})

    async def api_answer(request: Request) -> Response:
        if (no := guard(request, private=True)) is not None:
            return no
        if not same_origin(request):
            return JSONResponse({"error": "origin"}, status_code=403)
        from flower.people.answers import post

        try:
            body = await request.json()
            ask_id, text = str(body["id"]), str(body["text"]).strip()
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "id and text"}, status_code=400)
        if not text:
            return JSONResponse({"error": "empty answer"}, status_code=400)
        run = request.path_params["run"]
        try:
            await ui.read(lambda: post(model.state_of_run(ui.state, run).events, run, ask_id, text))
        except KeyError:
            return JSONResponse({"error": "unknown run"}, status_code=404)
        return JSONResponse({"run": run, "id": ask_id, "posted": True})

    async def stream(request: Request) -> Response:
        if (no := guard(request)) is not None:
            return no

        async def changes() -> AsyncIterator[bytes]:
            positions: dict[str, int] = {}
            seen = await ui.read(lambda: model.signature(ui.state, positions))
            yield b"retry: 1000\n\n"
            quiet, pause = 0.0, LIVE_POLL_S
            while True:
                await asyncio.sleep(pause)
                if await request.is_disconnected():
                    return
                began = time.monotonic()
                now = await ui.read(lambda: model.signature(ui.state, positions))
                # a look that costs more (thousands of runs) is taken less often, never
                # more than a third of the time, and at least every 1.5 s (live within 2 s)
                pause = min(LIVE_MAX_PAUSE_S, max(LIVE_POLL_S, 2 * (time.monotonic() - began)))
                if now != seen:
                    seen = now
                    quiet = 0.0
                    yield b"event: change\ndata: {}\n\n"
                else:
                    quiet += pause
                    if quiet >= KEEPALIVE_S:
                        quiet = 0.0
                        yield b": keepalive\n\n"

        return StreamingResponse(
            changes(),
            media_type="text/event-stream",
            headers={**_NO_STORE, "X-Accel-Buffering": "no"},
        )

    return Starlette(
        routes=[
            Route("/", index),
            Route("/static/{name}", asset),
            Route("/api/runs", api_runs),
            Route("/api/runs/{run}/timeline", api_timeline),
            Route("/api/runs/{run}/tools", api_tools),
            Route("/api/runs/{run}/steps/{label:path}", api_step),
            Route("/api/runs/{run}/cancel", api_cancel, methods=["POST"]),
            Route("/api/runs/{run}/answer", api_answer, methods=["POST"]),
            Route("/api/stream", stream),
        ]
    )


_ASSETS = {"app.js", "app.css"}


def _loopback_host(host: str) -> bool:
    """Is the request's ``Host`` this machine by a loopback name or address?"""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]", 1)[0]
    if name in ("localhost", "::1"):
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


_NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def _texts() -> dict[str, list[str]]:
    """Every ``ui.*`` text of the catalogue, both languages (the page picks one)."""
    return {k: list(texts(k)) for k in keys() if k.startswith("ui.")}


def serve(ui: UI, host: str, port: int, on_ready: Callable[[int], None]) -> None:
    """Serve ``ui`` on ``host:port`` (0: any free port) until Ctrl-C; ``on_ready(port)``
    once it listens."""
    import socket

    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    config = uvicorn.Config(
        app(ui), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    on_ready(sock.getsockname()[1])
    server.run(sockets=[sock])
