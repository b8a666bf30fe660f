"""``flower.testing.model_server``: kept for flows tested with it; the module is
:mod:`flower.services.model_server` (what ``flower-super`` serves a person is product code, which
this test kit uses)."""

from __future__ import annotations

from flower.services.model_server import ModelServer, RecordedRequest, Script, main

__all__ = ["ModelServer", "RecordedRequest", "Script", "main"]
