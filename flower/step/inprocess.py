"""The placement of library use: each attempt is an SDK session in this very process.

The contract every placement keeps is in :mod:`flower.step.placement`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..state.result import StepResult
from .attempt import SdkAttempt
from .call import StepCall
from .placement import Seat, Watch


class InProcess:
    """The placement of library use: each attempt is an SDK session in this very process."""

    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        att = SdkAttempt(call, seat, watch)
        try:
            await att.connect()
            return await att.run()
        finally:
            await att.close()

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        """Nothing to prepare: starting a CLI here ahead of time would only hold memory."""

    async def close(self) -> None:
        return None
