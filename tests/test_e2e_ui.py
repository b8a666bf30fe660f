"""``flower-super ui`` in a real browser (Debian's Chromium, headless, driven by Playwright)
against runs made by the real CLI and the scripted model server.

- A run killed with kill -9 in its second step and carried on: the step's row holds the
  killed attempt and the continued one, in the same session, with the wake mark; the step's
  page shows that one conversation. With local state and with PostgreSQL.
- A running flow: its next step appears on the open timeline without a reload, within 2 s;
  cancel from the page stops the run as ``flower-super cancel`` does (one killed-by-signal
  row). With local state and with PostgreSQL (the page follows its notifications).
- A question an attempt asks, answered from the page while the terminal waits: the
  attempt gets the page's answer, the terminal shows it answered.
- On the cluster (PostgreSQL, Temporal workers): a worker killed mid-step shows the
  takeover, two bars on two workers, and the tool call the ledger kept from running again.
- The token: on loopback a conversation and every action need it; on another address every
  request does.

Screenshots (runs, a timeline, a step page; light and dark) are written to
``artifacts/ui/`` (``FLOWER_UI_SHOTS`` moves it), which CI keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import REPO, Flower, answers, kill, wait_until
from tests.e2e_pg import STATES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FLOW = "tests.flows.basic:two"
HOLD = 90
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("FLOWER_UI_SHOTS") or REPO / "artifacts" / "ui")
GATED = "touch tool.started; until [ -e gate ]; do sleep 0.1; done; echo through"


def bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "t"}}}


@pytest.fixture(params=STATES)
def state(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Chromium is missing: the test command installs it (apt)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def on_cluster(
    model_server: Any,
    flower_env: Any,
    temporal_target: str,
    temporal_queue: str,
    pg_dsn: str,
    tmp_path: Path,
) -> Iterator[Any]:
    """tests/test_e2e_cluster.py's cluster: a workspace whose attempts run on workers."""
    from tests.test_e2e_cluster import Cluster

    made: list[Any] = []

    def make(spec: dict[str, Any]) -> Any:
        f = flower_env(model_server(spec))
        made.append(Cluster(f, temporal_target, temporal_queue, pg_dsn, tmp_path / "workers"))
        return made[-1]

    yield make
    for c in made:
        c.stop()


class UI:
    """One ``flower-super ui`` process serving a Flower's run state."""

    def __init__(self, f: Flower, *args: str) -> None:
        argv = f.argv("ui", "-r", str(f.runs), "-w", str(f.ws), "--port", "0", *args)
        self.proc = subprocess.Popen(
            argv,
            cwd=f.root,
            env=f.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        f.procs.append(self.proc)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode("utf-8", "replace")
        found = re.search(r"(http://\S+)/\?token=(\S+)", line)
        assert found, f"flower-super ui printed no URL: {line!r}"
        self.base, self.token = found.group(1), found.group(2)
        self.url = f"{self.base}/?token={self.token}"

    def get(self, path: str, token: str | None = None, host: str | None = None) -> int:
        req = urllib.request.Request(self.base + path)
        if token is not None:
            req.add_header("X-Flower-Token", token)
        if host is not None:
            req.add_header("Host", host)
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                return int(res.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


def page_of(browser: Any, ui: UI, theme: str = "light") -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 760}, color_scheme=theme)
    page.goto(ui.url)  # the token becomes a cookie; the address bar drops it
    page.wait_for_selector("body[data-view='runs']", timeout=15_000)
    assert "token" not in page.url
    return page


def shoot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(200)  # the last paint
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def latest_run(f: Flower) -> str:
    _code, out = f.status("-w", str(f.ws), "--json")
    return str(json.loads(out)["flowers"][-1]["run"])


def test_a_kill_9_and_its_wake_show_in_one_row_in_one_session(
    model_server: Any, flower_env: Any, state: str | None, browser: Any
) -> None:
    server = model_server(
        {
            "conversations": [
                {"name": "first", "match": {"marker": "[[first]]"}, "turns": [{"text": "ok."}]},
                {
                    "name": "second",
                    "match": {"marker": "[[second]]"},
                    "turns": [
                        bash("echo ran >> counter.txt"),
                        {"text": "second done.", "delay": HOLD, "times": 1},
                    ],
                },
            ]
        }
    )
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    server.wait_for(
        lambda reqs: any(r.conversation == "second" and r.turn == 1 for r in reqs), timeout=60
    )
    sid = f.lineage()["steps"]["second"]
    wait_until(lambda: f.has_tool_result(sid), 10, "the tool result in the store")
    assert kill(proc) == -signal.SIGKILL
    code, out = f.run(flow=FLOW)
    assert code == 0, out
    run = latest_run(f)

    ui = UI(f)
    for theme in ("light", "dark"):
        page = page_of(browser, ui, theme)
        assert page.locator("#runs tr.run").count() == 2
        if state is None:
            shoot(page, f"runs-{theme}")
        page.click(f"a[href='#/run/{run}']")
        page.wait_for_selector("body[data-view='run']")
        bars = page.locator(".tl-row[data-step='second'] .bar")
        outcomes = [bars.nth(i).get_attribute("data-outcome") for i in range(bars.count())]
        assert outcomes == ["killed-woken", "ok"], outcomes
        sessions = {bars.nth(i).get_attribute("data-session") for i in range(bars.count())}
        assert sessions == {sid}, sessions
        assert page.locator(".mark[data-kind='wake']").count() == 1
        assert page.locator(".tl-row[data-step='first'] .bar").count() >= 1
        bars.first.click()
        assert page.locator("#detail .session").inner_text() == sid
        # the killed attempt's Bash call, as the ledger holds it: done before the kill
        page.wait_for_selector("#detail .tool-line .ledger.done")
        assert page.locator("#detail .tool-line").count() == 1
        if state is None:
            shoot(page, f"timeline-{theme}")
        page.click("#detail a")
        page.wait_for_selector("body[data-view='step']")
        shown = page.locator("code.session-id")
        assert shown.count() == 1 and shown.inner_text() == sid
        assert page.locator("details.tool[data-tool='Bash'] .ledger.done").count() == 1
        assert page.locator("details.steplog").count() == 2  # the step's log of each run
        if state is None:
            shoot(page, f"step-{theme}")
        page.close()


def test_a_new_step_shows_live_and_cancel_from_the_page_stops_the_run(
    model_server: Any, flower_env: Any, state: str | None, browser: Any
) -> None:
    server = model_server(
        {
            "conversations": [
                {
                    "name": "first",
                    "match": {"marker": "[[first]]"},
                    "turns": [bash(GATED), {"text": "first done."}],
                },
                {
                    "name": "second",
                    "match": {"marker": "[[second]]"},
                    "turns": [{"text": "second done.", "delay": HOLD}],
                },
            ]
        }
    )
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    try:
        wait_until(lambda: (f.ws / "tool.started").exists(), 60, "the held tool call")
        run = latest_run(f)
        ui = UI(f)
        page = page_of(browser, ui)
        page.goto(f"{ui.base}/#/run/{run}")
        page.wait_for_selector(".tl-row[data-step='first'] .bar[data-outcome='running']")
        assert page.locator(".tl-row[data-step='second'] .bar").count() == 0
        (f.ws / "gate").touch()
        server.wait_for(lambda reqs: any(r.conversation == "second" for r in reqs), timeout=60)
        seen_at = time.monotonic()  # the second step began before it asked the model
        page.wait_for_selector(".tl-row[data-step='second'] .bar", timeout=15_000)
        took = time.monotonic() - seen_at
        assert took <= 2.0, f"the new step showed {took:.2f} s after it began"
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#cancel")
        code = proc.wait(timeout=60)
        assert code == -signal.SIGTERM, code  # what flower-super cancel does to it
        page.wait_for_selector("[role='status']", timeout=15_000)
        rows = [r for r in f.manifest() if r["step"] == "second"]
        assert [r.get("error") for r in rows] == ["killed-by-signal"], rows
        page.wait_for_selector(".tl-row[data-step='second'] .bar[data-outcome='killed-by-signal']")
        page.close()
    finally:
        (f.ws / "gate").touch()
        if proc.poll() is None:
            kill(proc)


def test_the_token_guards_conversations_actions_and_other_addresses(
    model_server: Any, flower_env: Any, browser: Any
) -> None:
    server = model_server(answers("first", "second"))
    f: Flower = flower_env(server)
    code, out = f.run(flow=FLOW)
    assert code == 0, out
    run = latest_run(f)

    local = UI(f)  # loopback: lists and timelines open, a conversation and cancel need it
    assert local.get("/api/runs") == 200
    assert local.get(f"/api/runs/{run}/timeline") == 200
    assert local.get(f"/api/runs/{run}/steps/second") == 403
    assert local.get(f"/api/runs/{run}/steps/second", token=local.token) == 200
    assert local.get(f"/api/runs/{run}/steps/second", token="wrong") == 403
    # a name of someone else's that resolves here (DNS rebinding) is not this machine's page
    assert local.get("/api/runs", host="rebind.example:80") == 403
    for action in ("cancel", "answer"):  # without the token, or from another page: no
        for headers in ({}, {"X-Flower-Token": local.token, "Origin": "http://evil.example"}):
            req = urllib.request.Request(
                f"{local.base}/api/runs/{run}/{action}",
                method="POST",
                data=b'{"id": "q1", "text": "yes"}',
                headers={"Content-Type": "application/json", **headers},
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 403, (action, headers)

    anywhere = UI(f, "--host", "0.0.0.0")  # another address: every request needs it
    assert anywhere.get("/") == 403 and anywhere.get("/api/runs") == 403
    assert anywhere.get("/static/app.js") == 403 and anywhere.get("/api/stream") == 403
    assert anywhere.get("/api/runs", token=anywhere.token) == 200
    page = browser.new_page()
    page.goto(f"{anywhere.base}/")
    assert "token" in page.content()  # the refusal, not the page
    page.goto(anywhere.url)
    page.wait_for_selector("body[data-view='runs']")
    assert page.locator("#runs tr.run").count() == 1
    # nothing secret on the page: no key, no token in what it shows
    text = page.content()
    assert f.env["ANTHROPIC_API_KEY"] not in text and anywhere.token not in text
    page.close()
    for each in (local, anywhere):
        each.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            each.proc.wait(timeout=10)
        assert each.proc.poll() is not None, "flower-super ui did not stop on Ctrl-C"


def test_a_question_is_answered_from_the_page_and_the_terminal_sees_it_answered(
    model_server: Any, flower_env: Any, browser: Any, tmp_path: Path
) -> None:
    from tests.test_e2e_starter import ASK, BRIEF, MET, script, tool

    clarify = [tool("mcp__human__ask", question="输出放哪个文件?", options=["out.html", "out.md"])]
    ws = tmp_path / "f0" / "ws"  # where flower_env puts its first workspace
    server = model_server(
        script(ws, clarify=[*clarify, BRIEF], coordinate=["做完了。"], verdict=MET)
    )
    f: Flower = flower_env(server)
    assert f.ws == ws
    # stdin open and silent: a person at the terminal who does not answer
    proc = f.start(ASK, "--no-goal", stdin=subprocess.PIPE)
    try:
        wait_until(lambda: f.runs.joinpath("flowers").exists(), 60, "the run's record")
        ui = UI(f)
        page = page_of(browser, ui)
        page.goto(f"{ui.base}/#/run/{latest_run(f)}")
        page.wait_for_selector(".question button.option", timeout=60_000)
        assert page.locator(".question").count() == 1
        page.click(".question button.option:text('out.md')")
        page.wait_for_selector("[role='status']")
        # the clarifier asks again once it has the answer (the tool's result)
        server.wait_for(lambda reqs: len([r for r in reqs if r.conversation == "clarify"]) >= 2)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill(proc)
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text
    assert "+ out.md" in text, text  # the terminal saw it answered, by the page
    asked = [r for r in server.requests if r.conversation == "clarify"]
    assert any("out.md" in json.dumps(r.messages[-1], ensure_ascii=False) for r in asked[1:])
    page.reload()
    page.wait_for_selector("body[data-view='run']")
    assert page.locator(".question").count() == 0
    page.close()


def test_a_takeover_on_the_cluster_shows_two_bars_on_two_workers_and_the_kept_tool_call(
    on_cluster: Any, browser: Any
) -> None:
    """PostgreSQL + Temporal workers: the worker running B is killed after B's Bash call
    finished; the other takes B over in its session. The page shows both attempts in B's
    row, the second on the other worker, and the Bash call once, done (the ledger kept it
    from running again)."""
    from tests.test_e2e_cluster import ABC, B_WAITS, abc_script, finish, kill_worker

    c = on_cluster(abc_script(B_WAITS))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    server.wait_for(lambda reqs: any(r.conversation == "B" and r.turn == 1 for r in reqs), 90)
    victim = c.running("B")
    other = next(w for w in c.workers if w is not victim)
    sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
    wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
    assert kill_worker(victim) == -signal.SIGKILL
    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [victim.name]

    ui = UI(f)
    page = page_of(browser, ui)
    page.goto(f"{ui.base}/#/run/{latest_run(f)}")
    page.wait_for_selector("body[data-view='run']")
    bars = page.locator(".tl-row[data-step='B'] .bar")
    outcomes = [bars.nth(i).get_attribute("data-outcome") for i in range(bars.count())]
    assert outcomes == ["taken-over", "ok"], outcomes
    workers = [bars.nth(i).get_attribute("data-worker") for i in range(2)]
    assert workers[0] and workers[1] and workers[0] != workers[1], workers
    assert {bars.nth(i).get_attribute("data-session") for i in range(2)} == {sid}
    assert page.locator(".mark[data-kind='takeover']").count() == 1
    bars.nth(0).click()  # the attempt on the killed worker: its Bash call done, kept
    page.wait_for_selector("#detail .tool-line .ledger.done")
    bars.nth(1).click()
    assert page.locator("#detail .where").inner_text().endswith(str(workers[1]))
    shoot(page, "timeline-takeover")
    page.click("#detail a")
    page.wait_for_selector("body[data-view='step']")
    calls = page.locator("details.tool[data-tool='Bash']")
    assert calls.count() == 1 and calls.locator(".ledger.done").count() == 1
    assert page.locator("code.session-id").inner_text() == sid
    page.close()
    assert other.proc.poll() is None
