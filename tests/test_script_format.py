"""The documented script format is the parser's: every key listed under a ``... keys:``
heading of ``SCRIPT_FORMAT`` is one ``_script.py`` accepts and vice versa, so the doc
cannot drift; and the text reaches every place a person reads it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import flower.testing
from flower import ConfigError
from flower.services import _script, _wire
from flower.services._format import SCRIPT_FORMAT
from flower.services._script import Script
from supervisor.commands.cli import main as flower_super
from tests.e2e import REPO

# "Turn keys (a plain string is short for {"text": ...}):" -> ("Turn", "keys")
_HEADING = re.compile(r"^(?P<what>[A-Z][a-z-]+) (?P<kind>keys|presets)\b.*:$")
_ENTRY = re.compile(r"^  (?P<key>[a-z_]+)(?:\s+(?P<rest>\S.*))?$")


def documented() -> dict[str, dict[str, str]]:
    """``{"Turn keys": {"text": "the assistant's text", ...}, ...}`` from SCRIPT_FORMAT.

    An entry is a line two spaces in; deeper lines continue the entry above; anything else
    ends the list.
    """
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in SCRIPT_FORMAT.splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = out.setdefault(f"{heading['what']} {heading['kind']}", {})
        elif current is not None and (entry := _ENTRY.match(line)):
            current[entry["key"]] = entry["rest"] or ""
        elif current is not None and line.startswith("   "):
            continue
        else:
            current = None
    return out


def test_every_documented_key_is_accepted_and_no_other():
    assert {name: set(keys) for name, keys in documented().items()} == {
        "Top-level keys": _script._TOP_KEYS,
        "Conversation keys": _script._CONVERSATION_KEYS,
        "Match keys": _script._MATCH_KEYS,
        "Turn keys": _script._TURN_KEYS,
        "Usage keys": _script._USAGE_KEYS,
        "Error presets": set(_wire.ERROR_PRESETS),
        "Error keys": _wire.ERROR_KEYS,
    }


def test_error_presets_document_their_status_and_type():
    for name, line in documented()["Error presets"].items():
        status, message = _wire.ERROR_PRESETS[name]
        err = _wire.ApiError.of(status, message)
        assert line.split()[:2] == [str(err.status), err.type], (name, line)


def test_the_match_keys_are_the_fields_a_match_has():
    assert set(_script.Match.__dataclass_fields__) == _script._MATCH_KEYS


def test_the_documented_example_parses_and_uses_every_fault():
    example = SCRIPT_FORMAT.split("::", 1)[1].split("\nConversations:", 1)[0]
    script = Script.from_dict(json.loads(example))
    turns = script.conversations[0].turns
    assert {t.fault_kind for t in turns} == {None, "error", "cut", "outage"}
    assert script.default is not None and script.default.turns[0].text == "ok"


@pytest.mark.parametrize(
    ("default", "ok"),
    [
        (["x"], True),
        ({"turns": ["x"]}, True),
        ({"name": "fallback", "turns": ["x"]}, True),
        ({"match": {"marker": "m"}, "turns": ["x"]}, False),
        ({"turns": ["x"], "times": 1}, False),
    ],
)
def test_default_takes_exactly_the_documented_forms(default, ok):
    if ok:
        assert Script.from_dict({"default": default}).default is not None
    else:
        with pytest.raises(ConfigError, match="'default' is a list of turns"):
            Script.from_dict({"default": default})


def test_a_bad_script_hints_at_where_the_format_is():
    with pytest.raises(ConfigError) as caught:
        Script.from_dict({"default": [{"txt": "x"}]})
    assert "flower-super model-server --help" in (caught.value.hint or "")


def test_flower_super_model_server_help_prints_the_format_as_written():
    done = CliRunner().invoke(flower_super, ["model-server", "--help"], terminal_width=200)
    assert done.exit_code == 0, done.output
    shown = done.output.splitlines()
    for line in SCRIPT_FORMAT.splitlines():
        if line.strip():
            assert "  " + line in shown, line  # verbatim: Click rewrapped nothing


def test_the_format_lines_fit_an_80_column_help():
    assert max(len(line) for line in SCRIPT_FORMAT.splitlines()) <= 76


def test_the_standalone_server_help_prints_it_too(capsys):
    from flower.services.model_server import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert SCRIPT_FORMAT.splitlines()[-1] in capsys.readouterr().out


def test_help_on_the_package_and_the_server_shows_the_format():
    from flower.services import model_server

    assert (flower.testing.__doc__ or "").endswith(SCRIPT_FORMAT)
    assert (model_server.__doc__ or "").endswith(SCRIPT_FORMAT)
    assert flower.testing.SCRIPT_FORMAT is _script.SCRIPT_FORMAT is SCRIPT_FORMAT


def test_the_public_surface_resolves():
    for name in flower.testing.__all__:
        assert getattr(flower.testing, name) is not None, name
    assert set(flower.testing.__all__) <= set(dir(flower.testing))


@pytest.mark.timeout(30)  # two fresh interpreters
def test_the_help_stays_cheap_to_import():
    code = (
        "import sys, supervisor.commands.cli; "
        "print(sorted(m for m in ('claude_agent_sdk', 'flower.services.model_server', "
        "'flower.services._script') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=25
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
