"""Answers from outside the run's own terminal (the web view): one mailbox per run.

A question an attempt asks through a :class:`~flower.people.human.HumanChannel` is shown on
the terminal of the flower that runs it; another process (``flower-super ui``) may answer it
too, by posting ``{"id", "text"}`` to the run's answers mailbox: the run state's event rows
under the key ``<run>/answers`` (with local state, ``logs/<run>/answers/events.jsonl``; in
PostgreSQL, event rows that NOTIFY). The flower that runs the question watches its mailbox
(:class:`AnswerWatch`) and answers the channel with it. Whichever answer comes first wins:
the channel takes one answer per question and says ``answered`` in its ask event, which the
terminal and the page both show; a late one changes nothing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..state.seam import EventRows


def mailbox(run: str) -> str:
    """The event-rows key of run ``run``'s answers."""
    return f"{run}/answers"


def post(rows: EventRows, run: str, ask_id: str, text: str) -> None:
    """Answer question ``ask_id`` of run ``run`` (raises what the rows raise)."""
    import time

    rows.append(mailbox(run), {"t": round(time.time(), 3), "id": str(ask_id), "text": str(text)})


class AnswerWatch:
    """A thread that hands the answers posted for ``run`` to ``channel.answer`` (safe from
    any thread) until :meth:`stop`. Answers posted before it started count: a question
    asked and answered while the flower was starting is still answered. A mailbox that
    cannot be read is looked at again a moment later, never raising into the run."""

    WAIT_S = 1.0

    def __init__(self, rows: EventRows, run: str, channel: Any) -> None:
        self.rows, self.run, self.channel = rows, run, channel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flower-answers", daemon=True)

    def start(self) -> AnswerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        key, after = mailbox(self.run), 0
        while not self._stop.is_set():
            try:
                for pos, answer in self.rows.read(key, after):
                    after = pos
                    ask_id, text = answer.get("id"), answer.get("text")
                    if isinstance(ask_id, str) and isinstance(text, str) and text.strip():
                        self.channel.answer(ask_id, text)
            except Exception:  # noqa: BLE001 - the terminal still answers; look again soon
                pass
            # a look a second (not rows.wait: a database's listener is the cluster's relay's,
            # and a person's answer a second late is on time)
            self._stop.wait(self.WAIT_S)
