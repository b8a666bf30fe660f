"""The scripted model server: wire shapes, turn selection, faults, log — and the real CLI on it.

Unit tests speak plain HTTP (http.client); tests marked ``e2e`` run the bundled Claude
Code CLI (and once the Python SDK) against the server, with no network and no key.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flower._errors import ConfigError
from flower.services.model_server import main
from flower.testing import ModelServer, Script, claude_path, cli_env
from flower.testing.pytest_helpers import (  # the fixtures come by name from conftest
    Reaper,
    make_claude_home,
    pids_alive,
    read_transcript,
    run_claude,
)

# --- a tiny client -------------------------------------------------------------------------


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _body(*messages: dict[str, Any], stream: bool = False, **extra: Any) -> dict[str, Any]:
    sid = extra.pop("session", "11111111-2222-3333-4444-555555555555")
    meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": sid})}
    return {
        "model": "claude-test",
        "max_tokens": 100,
        "stream": stream,
        "metadata": meta,
        "messages": list(messages),
        **extra,
    }


def _post(
    server: ModelServer, body: Any, path: str = "/v1/messages"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request(
            "POST", path, data, {"content-type": "application/json", "x-api-key": "sk-secret-xyz"}
        )
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def _assemble(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Rebuild the message from SSE events the way a client does."""
    msg: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "message_start":
            msg = data["message"]
        elif name == "content_block_start":
            msg["content"].append(dict(data["content_block"]))
        elif name == "content_block_delta":
            block, delta = msg["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "content_block_stop" and data["index"] in partial:
            msg["content"][data["index"]]["input"] = json.loads(partial[data["index"]])
        elif name == "message_delta":
            msg.update(data["delta"])
            msg["usage"] = data["usage"]
    return msg


def _tool_turn_history(first: dict[str, Any], answer: dict[str, Any]) -> list[dict[str, Any]]:
    """History after a tool_use answer: the request, the answer, and tool results."""
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": "out"}
        for b in answer["content"]
        if b["type"] == "tool_use"
    ]
    return [
        first,
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": results},
    ]


TOOL_SCRIPT = {
    "conversations": [
        {
            "name": "work",
            "match": {"marker": "[[work]]"},
            "turns": [
                {
                    "text": "Looking.",
                    "tool_use": [
                        {"name": "Bash", "input": {"command": "ls -la", "description": "list"}},
                        {"name": "Read", "input": {"file_path": "/etc/hostname"}},
                    ],
                },
                {"text": "Done with the work."},
                {"text": "Second prompt answered."},
            ],
        },
    ],
    "default": ["default answer"],
}


# --- wire shapes ---------------------------------------------------------------------------


def test_streamed_text_turn_has_the_real_event_sequence(model_server):
    server = model_server({"default": [{"text": "Hello there, " * 10}]})
    status, headers, raw = _post(server, _body(_user("hi"), stream=True))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = _events(raw)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 1
    assert names.count("content_block_delta") > 1  # really streamed in pieces
    msg = _assemble(events)
    assert msg["content"] == [{"type": "text", "text": "Hello there, " * 10}]
    assert msg["stop_reason"] == "end_turn" and msg["role"] == "assistant"
    assert msg["usage"]["output_tokens"] > 0 and msg["model"] == "claude-test"


def test_streamed_tool_use_reassembles_from_input_json_deltas(model_server):
    server = model_server(TOOL_SCRIPT)
    _, _, raw = _post(server, _body(_user("[[work]] go"), stream=True))
    msg = _assemble(_events(raw))
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use", "tool_use"]
    bash, read = msg["content"][1], msg["content"][2]
    assert bash["input"] == {"command": "ls -la", "description": "list"}
    assert read["name"] == "Read" and read["input"] == {"file_path": "/etc/hostname"}
    assert bash["id"].startswith("toolu_01") and bash["id"] != read["id"]
    assert msg["stop_reason"] == "tool_use"


def test_non_streaming_answer_is_one_message_json(model_server):
    server = model_server(TOOL_SCRIPT)
    status, headers, raw = _post(server, _body(_user("[[work]] go")))
    msg = json.loads(raw)
    assert status == 200 and headers["content-type"] == "application/json"
    assert msg["type"] == "message" and msg["stop_reason"] == "tool_use"
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use", "tool_use"]
    assert msg["id"].startswith("msg_") and headers["request-id"].startswith("req_")


def test_usage_override_reaches_start_and_delta(model_server):
    usage = {"input_tokens": 150_000, "cache_read_input_tokens": 20_000, "output_tokens": 7}
    server = model_server({"default": [{"text": "big", "usage": usage}]})
    events = _events(_post(server, _body(_user("hi"), stream=True))[2])
    start = events[0][1]["message"]["usage"]
    assert start["input_tokens"] == 150_000 and start["cache_read_input_tokens"] == 20_000
    final = _assemble(events)["usage"]
    assert final["output_tokens"] == 7 and final["cache_creation_input_tokens"] == 0


# --- turn selection ------------------------------------------------------------------------


def test_turn_follows_the_history_not_a_counter(model_server):
    server = model_server(TOOL_SCRIPT)
    first = _user("[[work]] go")
    answer = json.loads(_post(server, _body(first))[2])
    history = _tool_turn_history(first, answer)
    # The same request twice gets the same turn: nothing is counted per conversation.
    for _ in range(2):
        assert (
            json.loads(_post(server, _body(*history))[2])["content"][0]["text"]
            == "Done with the work."
        )
    later = [
        *history,
        {"role": "assistant", "content": [{"type": "text", "text": "Done with the work."}]},
        _user("next"),
    ]
    assert (
        json.loads(_post(server, _body(*later))[2])["content"][0]["text"]
        == "Second prompt answered."
    )
    assert [r.turn for r in server.requests] == [0, 1, 1, 2]


def test_turn_selection_ignores_synthetic_and_merged_entries():
    script = Script.from_dict(TOOL_SCRIPT)
    tid = "toolu_01FLWR000001abcdefghijkl"  # turn 0, second block
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": "[[work]] go"},
            ],
        },
        {"role": "system", "content": "environment"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": tid, "name": "Read", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tid,
                    "content": "[Tool call interrupted: ...]",
                    "is_error": True,
                }
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "No response requested."}]},
        {"role": "user", "content": "carry on"},
    ]
    sel = script.select({"messages": messages})
    assert sel.conversation is not None and sel.conversation.name == "work" and sel.index == 1
    assert sel.turn is not None and sel.turn.text == "Done with the work."


def test_text_turns_are_recognised_in_order_even_when_repeated():
    script = Script.from_dict({"default": ["same", "other", "same", "last"]})
    said = [
        {"role": "assistant", "content": [{"type": "text", "text": t}]}
        for t in ("same", "other", "same")
    ]
    messages = [m for s in said for m in (_user("q"), s)] + [_user("q")]
    assert script.select({"messages": messages}).index == 3
    assert script.select({"messages": messages[:3]}).index == 1


def test_matching_marker_system_session_and_default():
    script = Script.from_dict(
        {
            "conversations": [
                {"name": "by-session", "match": {"session": "sess-1"}, "turns": ["s"]},
                {"name": "by-system", "match": {"system": "You are the judge"}, "turns": ["j"]},
                {"name": "both", "match": {"marker": "[[m]]", "system": "worker"}, "turns": ["b"]},
                {"name": "by-marker", "match": {"marker": "[[m]]"}, "turns": ["m"]},
            ],
            "default": ["d"],
        }
    )

    def name(body: dict[str, Any]) -> str | None:
        conv = script.conversation_for(body)
        return conv.name if conv else None

    assert name(_body(_user("hello"), session="sess-1")) == "by-session"
    assert (
        name(_body(_user("hello"), system=[{"type": "text", "text": "You are the judge."}]))
        == "by-system"
    )
    assert name(_body(_user("x [[m]] y"), system="a worker")) == "both"
    assert name(_body(_user("x [[m]] y"))) == "by-marker"
    tool_result_only = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "[[m]]"}],
    }
    assert name(_body(_user("plain"), tool_result_only)) == "default"
    assert Script.from_dict({"conversations": []}).conversation_for(_body(_user("x"))) is None


def test_prompt_matches_a_user_text_exactly():
    script = Script.from_dict(
        {"conversations": [{"name": "probe", "match": {"prompt": "hi"}, "turns": ["ok"]}]}
    )

    def name(text: str) -> str | None:
        conv = script.conversation_for(_body(_user(text)))
        return conv.name if conv else None

    assert name("hi") == "probe" and name("  hi\n") == "probe"
    assert name("this") is None and name("hi there") is None
    as_string = {"messages": [{"role": "user", "content": "hi"}]}  # flower's probe sends this
    assert script.conversation_for(as_string) is not None


def test_one_session_conversations_answer_one_session_each(model_server):
    judge = {"marker": "[[judge]]"}
    server = model_server(
        {
            "conversations": [
                {"name": "round-1", "match": judge, "one_session": True, "turns": ["A1", "A2"]},
                {"name": "round-2", "match": judge, "one_session": True, "turns": ["B1"]},
            ]
        }
    )

    def ask(session: str, *history: dict[str, Any]) -> str:
        sent = _body(_user("[[judge]] rule"), *history, session=session)
        return str(json.loads(_post(server, sent)[2])["content"][0]["text"])

    assert ask("s1") == "A1"
    assert ask("s2") == "B1"  # a fresh session: the next conversation that matches
    said = {"role": "assistant", "content": [{"type": "text", "text": "A1"}]}
    assert ask("s1", said, _user("more")) == "A2"  # s1 keeps its own
    assert "no conversation matches" in ask("s3")  # both are taken
    no_session = _body(_user("[[judge]] rule"))
    no_session.pop("metadata")
    assert (
        "no conversation matches" in json.loads(_post(server, no_session)[2])["content"][0]["text"]
    )
    assert [r.conversation for r in server.requests] == [
        "round-1",
        "round-2",
        "round-1",
        None,
        None,
    ]
    # A new script forgets who took what.
    server.set_script(
        {
            "conversations": [
                {"name": "round-1", "match": judge, "one_session": True, "turns": ["C1"]}
            ]
        }
    )
    assert ask("s2") == "C1"


def test_exhausted_and_unmatched_answer_a_text_and_say_so(model_server):
    server = model_server({"conversations": [{"match": {"marker": "[[one]]"}, "turns": ["only"]}]})
    msg = json.loads(_post(server, _body(_user("nothing matches")))[2])
    assert "no conversation matches" in msg["content"][0]["text"]
    history = [
        _user("[[one]]"),
        {"role": "assistant", "content": [{"type": "text", "text": "only"}]},
        _user("more"),
    ]
    msg = json.loads(_post(server, _body(*history))[2])
    assert "has no turn 1" in msg["content"][0]["text"]
    assert [r.answer for r in server.requests] == ["unmatched", "exhausted"]


# --- faults --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "etype", "message"),
    [
        (529, 529, "overloaded_error", "Overloaded"),
        (500, 500, "api_error", "Internal server error"),
        (401, 401, "authentication_error", "invalid x-api-key"),
        (
            "rate_limit",
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        ),
        (
            "prompt_too_long",
            400,
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
        ),
        (
            {"status": 400, "message": "prompt is too long: 5 tokens > 4 maximum"},
            400,
            "invalid_request_error",
            "prompt is too long: 5 tokens > 4 maximum",
        ),
    ],
)
def test_error_answers_have_the_real_api_shape(model_server, error, status, etype, message):
    server = model_server({"default": [{"error": error}]})
    got, headers, raw = _post(server, _body(_user("hi"), stream=True))
    body = json.loads(raw)
    assert got == status and headers["content-type"] == "application/json"
    assert body["type"] == "error" and body["error"] == {"type": etype, "message": message}
    assert body["request_id"].startswith("req_")
    assert server.requests[0].answer == "error" and server.requests[0].status == status


def test_retry_after_header_and_times_limit(model_server):
    server = model_server(
        {"default": [{"error": {"status": 429, "retry_after": 2}, "times": 2, "text": "through"}]}
    )
    first = _post(server, _body(_user("hi")))
    second = _post(server, _body(_user("hi")))
    third = _post(server, _body(_user("hi")))
    assert first[0] == second[0] == 429 and first[1]["retry-after"] == "2"
    assert third[0] == 200 and json.loads(third[2])["content"][0]["text"] == "through"
    assert [r.answer for r in server.requests] == ["error", "error", "text"]


def test_permanent_fault_needs_no_content_and_fires_every_time(model_server):
    server = model_server({"default": [{"error": 401}]})
    assert [_post(server, _body(_user("hi")))[0] for _ in range(3)] == [401, 401, 401]


def test_stream_cut_sends_some_events_then_resets(model_server):
    server = model_server({"default": [{"cut": 2, "times": 1, "text": "whole " * 50}]})
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    payload = json.dumps(_body(_user("hi"), stream=True)).encode()
    sock.sendall(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    received = b""
    with pytest.raises(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    sock.close()
    assert b"event: message_start" in received and b"event: message_stop" not in received
    again = _post(server, _body(_user("hi"), stream=True))
    assert _assemble(_events(again[2]))["content"][0]["text"] == "whole " * 50


def test_outage_refuses_connections_then_listens_on_the_same_port(model_server):
    server = model_server({"default": [{"outage": 1.0, "times": 1, "text": "back"}]})
    port = server.port
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        _post(server, _body(_user("hi")))
    server.wait_listening(False, timeout=5)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    server.wait_listening(True, timeout=10)
    assert server.port == port
    assert json.loads(_post(server, _body(_user("hi")))[2])["content"][0]["text"] == "back"


def test_delay_holds_the_request_and_stop_releases_it(tmp_path):
    server = ModelServer({"default": [{"text": "late", "delay": 30}]}).start()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            _post(server, _body(_user("hi")))
        except BaseException as exc:  # noqa: BLE001 - the reset is what we expect
            errors.append(exc)

    t = threading.Thread(target=call)
    t.start()
    server.wait_for(lambda reqs: reqs, timeout=5)
    assert server.requests[0].delay == 30
    started = time.monotonic()
    server.stop()
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - started < 5 and errors


def test_concurrent_requests_are_served_in_parallel():
    script = {
        "conversations": [{"match": {"marker": "[[held]]"}, "turns": [{"text": "x", "delay": 60}]}],
        "default": ["fast"],
    }
    server = ModelServer(script).start()
    held = [
        threading.Thread(target=_post_quietly, args=(server, m))
        for m in ("[[held]] a", "[[held]] b")
    ]
    try:
        for t in held:
            t.start()
        server.wait_for(lambda reqs: len(reqs) == 2, timeout=10)  # both held at once
        assert json.loads(_post(server, _body(_user("quick")))[2])["content"][0]["text"] == "fast"
    finally:
        server.stop()
        for t in held:
            t.join(timeout=10)
    assert not any(t.is_alive() for t in held)


def _post_quietly(server: ModelServer, text: str) -> None:
    with contextlib.suppress(OSError, http.client.HTTPException):
        _post(server, _body(_user(text)))  # released by stop(): the connection is dropped


# --- validation ----------------------------------------------------------------------------


def test_tool_use_without_result_is_rejected_like_the_real_api(model_server):
    server = model_server(TOOL_SCRIPT)
    tid = "toolu_01FLWR000000abcdefghijkl"
    messages = [
        _user("[[work]] go"),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": tid, "name": "Bash", "input": {}}],
        },
        _user("no result here"),
    ]
    status, _, raw = _post(server, _body(*messages))
    assert status == 400
    assert json.loads(raw)["error"] == {
        "type": "invalid_request_error",
        "message": "messages.1: `tool_use` ids were found without `tool_result` blocks "
        f"immediately after: {tid}. Each `tool_use` block must have a corresponding "
        "`tool_result` block in the next message.",
    }
    assert server.requests[0].answer == "rejected"


def test_tool_result_without_tool_use_is_rejected(model_server):
    server = model_server(TOOL_SCRIPT)
    orphan = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "o"}],
    }
    status, _, raw = _post(
        server, _body(_user("[[work]]"), {"role": "assistant", "content": "hm"}, orphan)
    )
    assert status == 400
    assert json.loads(raw)["error"]["message"].startswith(
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x."
    )


def test_the_documented_example_script_parses():
    from flower.services import model_server as module

    doc = module.__doc__ or ""
    example = doc.split("Script format (a dict, or a JSON file holding one)::", 1)[1]
    script = Script.from_dict(json.loads(example.split("Conversations:", 1)[0]))
    assert [len(c.turns) for c in script.conversations] == [6] and script.default is not None


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"default": []},
        {"default": [{"error": 529, "times": 1}]},
        {"default": [{"error": 529, "cut": 1, "text": "x"}]},
        {"default": [{"error": "nope"}]},
        {"default": [{"text": "x", "usage": {"tokens": 1}}]},
        {"default": [{"txt": "x"}]},
        {"conversations": [{"match": {}, "turns": ["x"]}]},
        {"conversations": [{"match": {"cwd": "x"}, "turns": ["x"]}]},
        {"default": [{"text": "x", "delay": -1}]},
        {"conversations": [{"match": {"marker": "x"}, "one_session": 1, "turns": ["x"]}]},
        {"conversations": [{"match": {"prompt": ""}, "turns": ["x"]}]},
    ],
)
def test_bad_scripts_are_config_errors(bad):
    with pytest.raises(ConfigError, match="bad model-server script"):
        Script.from_dict(bad)


# --- the log and the other endpoints --------------------------------------------------------


def test_log_records_everything_owner_only_without_the_key(model_server, tmp_path):
    log = tmp_path / "req.jsonl"
    server = model_server(TOOL_SCRIPT, log_path=log)
    _post(server, _body(_user("[[work]] go"), stream=True, system="sys text"))
    _post(server, {"messages": []}, path="/v1/messages/count_tokens")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/v1/models")
    assert json.loads(conn.getresponse().read())["data"][0]["type"] == "model"
    conn.request("HEAD", "/")
    assert conn.getresponse().status == 200
    conn.close()
    status, _, raw = _post(server, {}, path="/v1/other")
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert "sk-secret-xyz" not in text and "[redacted]" in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert [x["answer"] for x in lines] == [
        "tool_use",
        "count_tokens",
        "models",
        "head",
        "not_found",
    ]
    first = lines[0]
    assert (
        first["session_id"] == "11111111-2222-3333-4444-555555555555"
        and first["conversation"] == "work"
    )
    assert first["turn"] == 0 and first["stream"] is True and first["model"] == "claude-test"
    assert (
        first["system"] == "sys text"
        and first["messages"][0]["content"][0]["text"] == "[[work]] go"
    )


def test_requests_for_texts_sent_and_wait_for(model_server):
    server = model_server(TOOL_SCRIPT)
    _post(server, _body(_user("[[work]] alpha"), session="s-a"))
    _post(server, _body(_user("beta"), session="s-b"))
    assert [r.session_id for r in server.requests_for("s-a")] == ["s-a"]
    assert any("alpha" in t for t in server.texts_sent("s-a"))
    assert not any("beta" in t for t in server.texts_sent("s-a"))
    assert server.wait_for(lambda reqs: len(reqs) == 2, timeout=1)
    with pytest.raises(TimeoutError, match="2 requests received"):
        server.wait_for(lambda reqs: len(reqs) > 2, timeout=0.2)


def test_cli_entry_point_prints_url_and_stops_on_sigterm(tmp_path, reaper: Reaper):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"default": ["from the command line"]}))
    log = tmp_path / "log.jsonl"
    proc = reaper.popen(
        [
            sys.executable,
            "-m",
            "flower.services.model_server",
            "--script",
            str(script),
            "--port",
            "0",
            "--log",
            str(log),
        ],
        env=os.environ,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:")
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/v1/messages", json.dumps(_body(_user("x"))))
    assert json.loads(conn.getresponse().read())["content"][0]["text"] == "from the command line"
    conn.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert "RuntimeWarning" not in (proc.stderr.read() if proc.stderr else "")
    assert len(log.read_text().splitlines()) == 1


def test_cli_entry_point_rejects_a_bad_script(tmp_path, capsys):
    script = tmp_path / "bad.json"
    script.write_text("{not json")
    assert main(["--script", str(script)]) == 2
    assert "cannot read model-server script" in capsys.readouterr().err


def test_cli_env_is_isolated_and_capped(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "real-token")
    env = cli_env(tmp_path / "h", "http://127.0.0.1:1", max_retries=2, extra={"X_EXTRA": "1"})
    assert env["HOME"] == str(tmp_path / "h") and env["CLAUDE_CONFIG_DIR"] == str(
        tmp_path / "h" / ".claude"
    )
    assert (
        env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1" and env["CLAUDE_CODE_MAX_RETRIES"] == "2"
    )
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["X_EXTRA"] == "1"
    assert env["ANTHROPIC_AUTH_TOKEN"] == ""  # blanks what the SDK would inherit
    assert "CLAUDE_CODE_MAX_RETRIES" not in cli_env(tmp_path / "g", "http://x", max_retries=None)


# --- the real CLI -------------------------------------------------------------------------

E2E_SCRIPT: dict[str, Any] = {
    "conversations": [
        {
            "name": "bash",
            "match": {"marker": "[[bash]]"},
            "turns": [
                {
                    "tool_use": {
                        "name": "Bash",
                        "input": {
                            "command": "echo bash-ran-$((6*7)) > proof.txt; cat proof.txt",
                            "description": "prove it ran",
                        },
                    }
                },
                {"text": "The command ran."},
            ],
        },
        {
            "name": "write",
            "match": {"marker": "[[write]]"},
            "turns": [
                {
                    "tool_use": {
                        "name": "Write",
                        "input": {"file_path": "WRITE_PATH", "content": "written by the model\n"},
                    }
                },
                {"text": "File written."},
            ],
        },
        {
            "name": "overloaded",
            "match": {"marker": "[[529]]"},
            "turns": [{"error": 529, "times": 1, "text": "Made it after 529."}],
        },
        {"name": "auth", "match": {"marker": "[[401]]"}, "turns": [{"error": 401}]},
        {
            "name": "too-long",
            "match": {"marker": "[[ptl]]"},
            "turns": [{"error": "prompt_too_long"}],
        },
        # Cut after message_start and ping: a turn with no content streams message_delta
        # (stop_reason end_turn) third, and a CLI that parses it before it sees the reset
        # takes the turn as finished (seen under load).
        {"name": "cut", "match": {"marker": "[[cut]]"}, "turns": [{"cut": 2}]},
        {
            "name": "cut-once",
            "match": {"marker": "[[cut-once]]"},
            "turns": [{"cut": 4, "times": 1, "text": "Whole after the cut."}],
        },
        {
            "name": "outage",
            "match": {"marker": "[[outage]]"},
            "turns": [{"outage": 1.0, "times": 1, "text": "Back after the outage."}],
        },
        {
            "name": "resume",
            "match": {"marker": "[[resume]]"},
            "turns": [
                {
                    "tool_use": {
                        "name": "Bash",
                        "input": {"command": "echo first-step", "description": "step"},
                    }
                },
                {"text": "Second turn, answered after the resume.", "delay": 60, "times": 1},
            ],
        },
    ],
    "default": ["Hello from the scripted model."],
}


def _claude(reaper: Reaper, home, prompt: str, *extra: str, timeout: float = 45.0):
    return run_claude(
        reaper,
        ["-p", prompt, "--output-format", "json", *extra],
        env=home.env,
        cwd=home.cwd,
        timeout=timeout,
    )


@pytest.fixture
def e2e_server(model_server):
    return model_server(E2E_SCRIPT)


@pytest.mark.e2e
def test_cli_text_turn(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    run = _claude(reaper, home, "say hello")
    res = run.result
    assert (
        run.returncode == 0
        and res["is_error"] is False
        and res["result"] == "Hello from the scripted model."
    )
    (req,) = e2e_server.requests
    assert (
        req.session_id == res["session_id"] and req.stream is True and req.conversation == "default"
    )
    assert "Bash" in req.tools and req.headers["x-api-key"] == "[redacted]"
    entries = read_transcript(home.config, res["session_id"])
    assert [e["type"] for e in entries if e["type"] in ("user", "assistant")] == [
        "user",
        "assistant",
    ]


@pytest.mark.e2e
def test_cli_bash_tool_really_runs_and_its_result_is_sent(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    res = _claude(reaper, home, "[[bash]] run it", "--allowedTools", "Bash").result
    assert (
        res["is_error"] is False and res["result"] == "The command ran." and res["num_turns"] == 2
    )
    assert (home.cwd / "proof.txt").read_text() == "bash-ran-42\n"
    second = e2e_server.requests[-1]
    assert second.turn == 1
    result = second.messages[-1]["content"][0]
    assert result["type"] == "tool_result" and "bash-ran-42" in str(result["content"])


@pytest.mark.e2e
def test_cli_write_tool_with_accept_edits(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    # acceptEdits approves writes inside the working directory only (outside: denied).
    target = home.cwd / "written.txt"
    e2e_server.set_script(json.loads(json.dumps(E2E_SCRIPT).replace("WRITE_PATH", str(target))))
    res = _claude(reaper, home, "[[write]] write it", "--permission-mode", "acceptEdits").result
    assert (
        res["is_error"] is False
        and res["result"] == "File written."
        and res["permission_denials"] == []
    )
    assert target.read_text() == "written by the model\n"


@pytest.mark.e2e
def test_cli_retries_529_once_then_succeeds(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server, max_retries=1)
    res = _claude(reaper, home, "[[529]] try").result
    assert res["is_error"] is False and res["result"] == "Made it after 529."
    assert [(r.answer, r.status) for r in e2e_server.requests] == [("error", 529), ("text", 200)]


@pytest.mark.e2e
def test_cli_401_is_an_error_result(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    res = _claude(reaper, home, "[[401]] try").result
    assert res["is_error"] is True and res["api_error_status"] == 401
    assert res["result"] == "Invalid API key · Fix external API key"
    assert len(e2e_server.requests) == 1


@pytest.mark.e2e
def test_cli_prompt_too_long(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    res = _claude(reaper, home, "[[ptl]] try").result
    assert res["is_error"] is True and res["api_error_status"] == 400
    assert (
        res["terminal_reason"] == "prompt_too_long"
        and "prompt is too long" in res["result"].lower()
    )
    entries = read_transcript(home.config, res["session_id"])
    synthetic = [e for e in entries if e.get("isApiErrorMessage")]
    assert synthetic and synthetic[-1]["message"]["model"] == "<synthetic>"
    assert "prompt is too long" in synthetic[-1]["errorDetails"]


@pytest.mark.e2e
def test_cli_stream_cut(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    res = _claude(reaper, home, "[[cut]] try").result
    answers = [(r.answer, r.stream, r.status, r.detail) for r in e2e_server.requests]
    assert res["is_error"] is True and res["api_error_status"] is None, (res, answers)
    assert "Connection to the API was lost" in res["result"]
    # After a broken stream the CLI falls back to a non-streaming request, even with
    # retries=0 (under load it sometimes tries one more stream first).
    answers = [(r.answer, r.stream) for r in e2e_server.requests]
    assert answers[0] == ("cut", True) and answers[-1] == ("cut", False)
    assert {a for a, _ in answers} == {"cut"} and len(answers) <= 3
    home2 = claude_home(e2e_server, max_retries=1)
    res2 = _claude(reaper, home2, "[[cut-once]] try").result
    assert res2["is_error"] is False and res2["result"] == "Whole after the cut."


@pytest.mark.e2e
def test_cli_rides_out_an_outage_with_its_own_retries(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server, max_retries=4)
    res = _claude(reaper, home, "[[outage]] go").result
    assert res["is_error"] is False and res["result"] == "Back after the outage."
    assert [r.answer for r in e2e_server.requests] == ["outage", "text"]
    assert e2e_server.requests[1].time - e2e_server.requests[0].time >= 1.0


@pytest.mark.e2e
def test_cli_connection_refused(claude_home, reaper):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed at once: nothing listens there
    home = claude_home(f"http://127.0.0.1:{port}")
    res = _claude(reaper, home, "hello?").result
    assert res["is_error"] is True and res["api_error_status"] is None
    assert (
        res["result"]
        == "API Error: Connection refused — a firewall or proxy may be blocking it (ECONNREFUSED)"
    )
    synthetic = [
        e for e in read_transcript(home.config, res["session_id"]) if e.get("isApiErrorMessage")
    ]
    assert len(synthetic) == 1 and synthetic[0]["apiError"] == "connection_failed"


@pytest.mark.e2e
@pytest.mark.timeout(120)  # two CLI runs plus a kill; each CLI start is ~1-2 s on these machines
def test_cli_resume_after_sigkill_while_the_server_holds_a_turn(e2e_server, claude_home, reaper):
    home = claude_home(e2e_server)
    proc = reaper.popen(
        [
            str(claude_path()),
            "-p",
            "[[resume]] start",
            "--output-format",
            "stream-json",
            "--verbose",
            "--allowedTools",
            "Bash",
        ],
        env=home.env,
        cwd=home.cwd,
    )
    held = e2e_server.wait_for(lambda reqs: [r for r in reqs if r.turn == 1], timeout=40)[0]
    sid = held.session_id
    assert held.delay == 60
    # The CLI writes a turn's entries only after it has sent the next request (60-90 ms
    # measured, longer under load): kill it once the tool result is in its transcript.
    from tests.e2e import wait_until

    def result_written() -> bool:
        try:
            entries = read_transcript(home.config, sid)
        except (AssertionError, OSError, ValueError):  # not written yet, or mid-line
            return False
        return any(
            isinstance(e.get("message"), dict)
            and any(
                isinstance(b, dict) and b.get("type") == "tool_result"
                for b in (e["message"].get("content") or [])
                if isinstance(e["message"].get("content"), list)
            )
            for e in entries
        )

    wait_until(result_written, 10, "the tool result in the CLI's transcript")
    reaper.kill_tree(proc.pid)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    res = _claude(
        reaper, home, "[[resume]] carry on", "--resume", sid, "--allowedTools", "Bash"
    ).result
    assert res["is_error"] is False and res["session_id"] == sid
    assert res["result"] == "Second turn, answered after the resume."
    last = e2e_server.requests[-1]
    assert last.session_id == sid and last.turn == 1 and last.delay == 0
    kinds = [
        (m["role"], b.get("type"))
        for m in last.messages
        if m["role"] != "system"
        for b in (m["content"] if isinstance(m["content"], list) else [{"type": "text"}])
    ]
    assert ("assistant", "tool_use") in kinds and ("user", "tool_result") in kinds
    assert any("first-step" in t for t in e2e_server.texts_sent(sid))
    assert not any("API Error" in t for t in e2e_server.texts_sent(sid))


@pytest.mark.e2e
def test_sdk_query_against_the_server(e2e_server, tmp_path):
    import anyio
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

    home = make_claude_home(tmp_path / "sdk", e2e_server.url)
    opts = ClaudeAgentOptions(cwd=str(home.cwd), env=home.env, allowed_tools=["Bash"])

    async def run() -> list[Any]:
        return [m async for m in query(prompt="[[bash]] via the SDK", options=opts)]

    messages = anyio.run(run)
    result = next(m for m in messages if isinstance(m, ResultMessage))
    assert result.is_error is False and result.result == "The command ran."
    assert (home.cwd / "proof.txt").read_text() == "bash-ran-42\n"
    assert {r.session_id for r in e2e_server.requests} == {result.session_id}
    assert "sdk-py" in e2e_server.requests[0].headers["User-Agent"]


def test_reaper_kills_a_tree_even_after_reparenting(tmp_path, reaper: Reaper):
    # The shape of the CLI's Bash tool: a grandchild in its own session outlives its parent.
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(60)"
    )
    proc = reaper.popen([sys.executable, "-c", code], env=os.environ, cwd=tmp_path)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    reaper.kill_tree(proc.pid)
    assert pids_alive([proc.pid, grandchild]) == []


# --- the recorded transcripts (tests/fixtures/transcripts, made by record.py there) --------

TRANSCRIPTS = Path(__file__).parent / "fixtures" / "transcripts"


def _entries(name: str) -> list[dict[str, Any]]:
    lines = (TRANSCRIPTS / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _results(entries: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (e, b)
        for e in entries
        if e["type"] == "user" and isinstance(e["message"]["content"], list)
        for b in e["message"]["content"]
        if b.get("type") == "tool_result"
    ]


def test_fixture_a_holds_the_synthetic_api_error_then_a_resume():
    entries = _entries("a-refused-then-resumed.jsonl")
    (err,) = [e for e in entries if e.get("isApiErrorMessage")]
    assert err["message"]["model"] == "<synthetic>" and err["apiError"] == "connection_failed"
    assert err["message"]["content"][0]["text"].startswith("API Error: Connection refused")
    after = [e for e in entries if e.get("parentUuid") == err["uuid"]]
    assert after and after[0]["type"] == "user"  # the resume's prompt hangs off the synthetic leaf
    assert entries[-1]["type"] != "assistant" or not entries[-1].get("isApiErrorMessage")
    assert any(e["type"] == "assistant" and e["message"]["model"] != "<synthetic>" for e in entries)


def test_fixture_b_holds_the_interrupted_result_and_no_response_requested():
    entries = _entries("b-killed-mid-tool-resumed.jsonl")
    ((entry, block),) = _results(entries)
    assert block["is_error"] is True and block["content"].startswith("[Tool call interrupted:")
    (synthetic,) = [
        e for e in entries if e["type"] == "assistant" and e["message"]["model"] == "<synthetic>"
    ]
    assert synthetic["isApiErrorMessage"] is False and synthetic["parentUuid"] == entry["uuid"]
    assert synthetic["message"]["content"] == [{"type": "text", "text": "No response requested."}]


def test_fixture_c_holds_denials_of_three_kinds():
    kinds = [e.get("toolDenialKind") for e, _ in _results(_entries("c-denied-tools.jsonl"))]
    assert kinds == [
        "user-rejected",
        None,
        "user-rejected",
        "permission-rule",
    ]  # None: disallowed tool


def test_fixture_d_holds_one_off_bash_calls_a_big_output_and_a_read():
    entries = _entries("d-bash-and-read.jsonl")
    commands = [
        b["input"].get("command")
        for e in entries
        if e["type"] == "assistant"
        for b in e["message"]["content"]
        if b["type"] == "tool_use"
    ]
    assert commands == ["ls", "git status", "cat notes.txt", "seq 1 700", None]
    sizes = [len(json.dumps(b["content"])) for _, b in _results(entries)]
    assert max(sizes) > 2000 and sorted(sizes)[-2] < 2000


def test_fixture_e_holds_an_image_tool_result():
    ((_, block),) = _results(_entries("e-read-png.jsonl"))
    assert block["content"][0]["type"] == "image"
    assert block["content"][0]["source"]["media_type"] == "image/png"


def test_fixtures_carry_no_api_key():
    for path in TRANSCRIPTS.glob("*.jsonl"):
        assert "sk-ant-" not in path.read_text(encoding="utf-8"), path.name
