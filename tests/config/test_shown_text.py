"""shown_text: ASCII is judged without unicodedata, and judged as unicodedata would."""

from __future__ import annotations

import re
import unicodedata

import pytest

from sidecar.config.fields import _UNSHOWN_CATEGORIES, shown_text
from sidecar.core.errors import ConfigError


def test_every_character_is_judged_as_its_unicode_category_says() -> None:
    # shown_text reads unicodedata only for characters beyond ASCII (its tables
    # stay unloaded at start: tests/cli/test_start_imports.py); the rule is the same.
    refused = []
    for code in range(0x110000):
        try:
            shown_text(chr(code), "reason", 1)
        except ConfigError:
            refused.append(code)
    wanted = [
        code for code in range(0x110000) if unicodedata.category(chr(code)) in _UNSHOWN_CATEGORIES
    ]
    assert refused == wanted


@pytest.mark.parametrize("text", ["nightly run", "é café ünïcode", "日本語", "tab-free ~!"])
def test_plain_text_is_kept(text: str) -> None:
    assert shown_text(text, "reason", 200) == text


@pytest.mark.parametrize(
    ("text", "code"), [("a\tb", "U+0009"), ("x\x7f", "U+007F"), ("\u202eevil", "U+202E")]
)
def test_controls_and_bidi_are_refused_with_their_code_point(text: str, code: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(code)):
        shown_text(text, "reason", 200)
