"""Real CLI transcripts recorded under tests/fixtures/transcripts, and the store-test basics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flower.state.trim import EphemeralPolicy, TrimPolicy

FIXTURES = Path(__file__).parent / "fixtures" / "transcripts"
KEY = {"project_key": "-tmp-proj", "session_id": "s1"}
OFF_E = EphemeralPolicy(enabled=False)
OFF_T = TrimPolicy(enabled=False)


def fixture(name: str) -> list[dict[str, Any]]:
    """The entries of one recorded transcript, in order."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
