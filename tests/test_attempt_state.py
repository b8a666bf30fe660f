"""AttemptState's session announcement (pure logic: SDK message objects in, what is
announced out). The init message names the session before the first request; it is
announced only once the store holds a conversation the CLI can resume, whatever message
names it."""

from __future__ import annotations

import asyncio

import pytest
from claude_agent_sdk import AssistantMessage, SystemMessage, TextBlock

from flower import AgentSpec
from flower.step.attempt import AttemptState
from flower.step.call import StepCall
from flower.step.placement import Watch

pytestmark = pytest.mark.timeout(30)


class Store:
    def __init__(self) -> None:
        self.stored: set[str] = set()

    def has_session(self, project_key: str | None, session_id: str) -> bool:
        return session_id in self.stored


def state(store: Store, said: list[str]) -> AttemptState:
    watch = Watch(on_session=said.append, on_event=lambda e: None, on_handle=lambda h: None)
    call = StepCall(AgentSpec(name="t", instructions="x"), "go", "t")
    return AttemptState(call, watch, store=store)


def init(sid: str) -> SystemMessage:
    return SystemMessage(subtype="init", data={"session_id": sid, "model": "m"})


def reply(sid: str) -> AssistantMessage:
    return AssistantMessage(content=[TextBlock(text="hi")], model="m", session_id=sid)


def test_an_early_session_is_announced_once_the_store_holds_it():
    async def main() -> list[str]:
        store, said = Store(), []
        st = state(store, said)
        st.see(init("s1"))
        await asyncio.sleep(0.1)
        assert said == [], "announced before sessions.db held it"
        store.stored.add("s1")
        for _ in range(100):
            if said:
                break
            await asyncio.sleep(0.01)
        st.see(reply("s1"))  # already announced: not again
        return said

    assert asyncio.run(main()) == ["s1"]


def test_a_later_message_waits_for_the_store_too_and_another_session_replaces_it():
    async def main() -> tuple[list[str], list[str], list[str]]:
        store_a, said_a = Store(), []
        a = state(store_a, said_a)
        a.see(init("s1"))
        a.see(reply("s1"))  # the model answered, but the prompt is not stored yet
        await asyncio.sleep(0.1)
        early = list(said_a)
        store_a.stored.add("s1")
        await asyncio.sleep(0.1)
        store_b, said_b = Store(), []
        b = state(store_b, said_b)
        b.see(init("s1"))
        b.see(reply("s2"))  # the CLI went on in another session
        store_b.stored.update({"s1", "s2"})
        await asyncio.sleep(0.1)
        return early, said_a, said_b

    assert asyncio.run(main()) == ([], ["s1"], ["s2"])


def test_a_session_stored_by_the_result_is_announced_when_the_attempt_ends():
    async def main() -> tuple[list[str], str | None]:
        store, said = Store(), []
        st = state(store, said)
        st.see(init("s1"))
        store.stored.add("s1")  # the SDK flushes before the result; no poll came between
        result = st.finish()
        return said, result.session_id

    assert asyncio.run(main()) == (["s1"], "s1")


def test_an_attempt_ending_before_its_session_was_stored_has_no_session():
    async def main() -> tuple[list[str], str | None]:
        said: list[str] = []
        st = state(Store(), said)
        st.see(init("s1"))
        result = st.finish()
        await asyncio.sleep(0.05)
        return said, result.session_id

    assert asyncio.run(main()) == ([], None)
