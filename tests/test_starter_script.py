"""``flower.testing.starter_script`` as pure logic: the script it builds parses, and each role's
request, built from the prompts and rules flower really sends, picks that role's conversation.
The same script against the real CLI is in tests/test_e2e_starter_script.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flower import Brief, ConfigError, Goal, Verdict
from flower.agents.roles import CLARIFIER_RULES, JUDGE_RULES
from flower.testing import Script, starter_script
from flower.workflow.goal import GOAL_PROMPT, VERIFY_PROMPT
from flower.workflow.starter import WORK_PROMPT

BASH = {"tool_use": {"name": "Bash", "input": {"command": "echo hi > hi.txt"}}}


def request(prompt: str, *, system: str = "", session: str = "s-1") -> dict[str, Any]:
    meta = {"user_id": json.dumps({"session_id": session})}
    return {
        "system": [{"type": "text", "text": system}],
        "metadata": meta,
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
    }


def who(script: Script, body: dict[str, Any], owners: dict[str, str] | None = None) -> str:
    conv = script.conversation_for(body, owners)
    return conv.name if conv else "-"


def test_each_role_is_matched_by_what_flower_sends_it():
    script = Script.from_dict(starter_script(work=[[BASH], "Nothing left."]))
    brief, goal = Brief("g", "a", "b", "u").prompt_block(), Goal("s", ["c"]).prompt_block()
    assert who(script, request("make hi.txt", system=CLARIFIER_RULES)) == "clarifier"
    assert who(script, request(GOAL_PROMPT.format(brief=brief), system=JUDGE_RULES)) == "goal"
    assert who(script, request(WORK_PROMPT.format(brief=brief) + goal)) == "work"
    assert who(script, request("[[coder-1]] Do round 1 of the work.")) == "coder-1"
    assert who(script, request("hi")) == "probe"
    # A judge round per fresh session, in order; one more than scripted is nobody's.
    owners: dict[str, str] = {}
    judged = [
        who(script, request(VERIFY_PROMPT.format(goal=goal), system=JUDGE_RULES, session=s), owners)
        for s in ("j1", "j2", "j1", "j3")
    ]
    assert judged == ["judge-1", "judge-2", "judge-1", "-"]


def test_rounds_questions_and_the_default_verdicts():
    made = starter_script(
        work=[[BASH], [BASH, "Appended."], "Nothing left."],
        questions=["Which file?", ("Which shell?", ["bash", "sh"])],
    )
    convs = {c["name"]: c for c in made["conversations"]}
    assert [t["tool_use"]["input"] for t in convs["clarifier"]["turns"][:2]] == [
        {"question": "Which file?"},
        {"question": "Which shell?", "options": ["bash", "sh"]},
    ]
    assert Brief.parse(convs["clarifier"]["turns"][2]).complete()
    assert Goal.parse(convs["goal"]["turns"][0]).complete()
    work = convs["work"]["turns"]
    agents = [t["tool_use"]["input"] for t in work if isinstance(t, dict)]
    assert [a["subagent_type"] for a in agents] == ["coder", "coder"]
    assert "[[coder-1]]" in agents[0]["prompt"] and "[[coder-2]]" in agents[1]["prompt"]
    assert [t for t in work if isinstance(t, str)] == [
        "Round 1 done.",
        "Round 2 done.",
        "Nothing left.",
    ]
    # A round that ends on a tool call gets a closing text; one that ends on a text keeps it.
    assert convs["coder-1"]["turns"] == [BASH, "Round 1 done."]
    assert convs["coder-2"]["turns"] == [BASH, "Appended."]
    verdicts = [Verdict.parse(convs[f"judge-{n}"]["turns"][0]) for n in (1, 2, 3)]
    assert [v.state for v in verdicts] == ["not_yet", "not_yet", "achieved"]
    assert verdicts[0].failed == ["It is done as asked."] and verdicts[0].reason
    assert all(convs[f"judge-{n}"]["one_session"] for n in (1, 2, 3))


def test_documents_and_verdicts_as_objects_mappings_or_text():
    made = starter_script(
        work=["Done."],
        brief={"goal": "hi.txt", "accept": "says hi", "bounds": "one file", "unknowns": "none"},
        goal=[Goal("hi.txt says hi", ["cat hi.txt prints hi"]), "## 目标\nagain"],
        verdicts=[Verdict("unreachable", "no shell here"), "Looks fine."],
    )
    convs = {c["name"]: c for c in made["conversations"]}
    assert Brief.parse(convs["clarifier"]["turns"][0]) == Brief(
        "hi.txt", "says hi", "one file", "none"
    )
    assert [Goal.parse(t).statement for t in convs["goal"]["turns"]] == ["hi.txt says hi", "again"]
    first = Verdict.parse(convs["judge-1"]["turns"][0])
    assert first.unreachable and first.reason == "no shell here"
    assert convs["judge-2"]["turns"] == ["Looks fine."]  # the judge's whole reply, as given
    assert not Verdict.parse("Looks fine.").ok


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"work": []}, "at least one round"),
        ({"work": ["Same.", "Same."]}, "the same text twice"),
        ({"work": [[3]]}, "a turn is a text or a turn object"),
        ({"work": ["x"], "brief": {"goals": "g"}}, "unknown sections ['goals']"),
        ({"work": ["x"], "goal": []}, "an empty list"),
    ],
)
def test_a_malformed_argument_is_a_config_error(kw, says):
    with pytest.raises(ConfigError, match="starter_script") as caught:
        starter_script(**kw)
    assert says in str(caught.value) and caught.value.hint
