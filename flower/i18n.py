"""One message catalogue: every text flower prints to a person, in Chinese and English.

Each module that prints defines its texts next to the code that uses them::

    from flower.i18n import define, t

    define({"cli.cancelled": ("已取消", "cancelled")})
    print(t("cli.cancelled"))

``define`` adds to the one catalogue (a key defined twice with different texts is a bug and
raises); ``t`` picks the person's language (:func:`lang`) and fills ``{placeholders}``. The
Chinese texts are the seeds' and the reference's, exactly. Texts sent to the model (rules,
resume and handoff prompts) are not translated and do not live here.

A count's noun agrees with it: ``{n|check|checks}`` in a text is ``check`` when the field
``n`` is 1 and ``checks`` otherwise (Chinese texts have no use for it)::

    define({"starter.checks": ("目标 {n} 条", "goal: {n} {n|check|checks}")})

The language: ``FLOWER_LANG=zh|en`` wins; else the first locale variable that is set of
``LC_ALL``, ``LC_MESSAGES``, ``LANG`` (POSIX's order) means Chinese when it starts with
``zh``; else English.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

LANGS = ("zh", "en")

_CATALOGUE: dict[str, tuple[str, str]] = {}
# ``{field|one|many}``: the word for a count of 1, and for any other count (compiled at its
# first use, by re's own cache: most commands never need it).
_PLURAL = r"\{(\w+)\|([^{}|]*)\|([^{}|]*)\}"


def define(entries: dict[str, tuple[str, str]]) -> None:
    """Add ``key -> (zh, en)`` texts to the catalogue."""
    for key, texts in entries.items():
        if len(texts) != 2 or not all(isinstance(x, str) for x in texts):
            raise TypeError(f"message {key!r}: expected (zh, en) strings, got {texts!r}")
        old = _CATALOGUE.get(key)
        if old is not None and old != texts:
            raise ValueError(f"message {key!r} is defined twice with different texts")
        _CATALOGUE[key] = texts


def lang() -> str:
    """``"zh"`` or ``"en"``: the language flower speaks to this person in."""
    forced = os.environ.get("FLOWER_LANG", "").strip().lower()
    if forced in LANGS:
        return forced
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = os.environ.get(name, "").strip()
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


def t(key: str, /, **fields: Any) -> str:
    """The text ``key`` in the person's language, with ``{fields}`` filled in."""
    try:
        zh, en = _CATALOGUE[key]
    except KeyError:
        raise KeyError(f"no message {key!r} in the catalogue") from None
    text = zh if lang() == "zh" else en
    if not fields:
        return text
    if "|" in text:
        text = re.sub(_PLURAL, lambda m: _agree(fields[m[1]], m[2], m[3]), text)
    return text.format(**fields)


def _agree(count: Any, one: str, many: str) -> str:
    """``one`` for a count of 1, else ``many`` (literal braces doubled for format)."""
    word = one if count == 1 else many
    return word.replace("{", "{{").replace("}", "}}")


def gettext_for(prefix: str) -> tuple[Callable[[str], str], Callable[[str, str, int], str]]:
    """``gettext`` and ``ngettext`` for a library that words its messages in English through
    :mod:`gettext` (click does): a message the catalogue holds as ``prefix + message`` comes
    back in the person's language, unformatted (the library fills its own placeholders);
    any other comes back as it is."""

    def gettext(message: str) -> str:
        texts = _CATALOGUE.get(prefix + message)
        return message if texts is None else texts[0 if lang() == "zh" else 1]

    def ngettext(singular: str, plural: str, n: int) -> str:
        return gettext(singular if n == 1 else plural)

    return gettext, ngettext


def keys() -> list[str]:
    """Every key defined so far (for tests that check the catalogue is whole)."""
    return sorted(_CATALOGUE)


def texts(key: str) -> tuple[str, str]:
    """``(zh, en)`` of ``key``."""
    return _CATALOGUE[key]
