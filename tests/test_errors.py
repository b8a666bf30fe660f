"""flower's errors cross process boundaries whole (DBOS-style ``__reduce__``)."""

from __future__ import annotations

import pickle

from flower import AttemptCrash, ConfigError


def test_a_crash_survives_crossing_a_process_boundary() -> None:
    crash = AttemptCrash("KeyError", "'usage'", detail="Traceback …", log="/runs/logs/s.log")
    back = pickle.loads(pickle.dumps(crash))
    assert (back.kind, back.text, back.detail, back.log) == (
        "KeyError",
        "'usage'",
        "Traceback …",
        "/runs/logs/s.log",
    )
    assert back.one_line() == crash.one_line() and "not retried" in back.one_line()


def test_a_flower_error_keeps_its_message_and_hint() -> None:
    err = ConfigError("bad flow", hint="pass FILE.py:ATTR")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ConfigError and (back.message, back.hint) == (
        "bad flow",
        "pass FILE.py:ATTR",
    )
