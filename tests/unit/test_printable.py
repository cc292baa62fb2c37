"""printable(): text from outside is shown, never obeyed, by the operator's terminal."""

from __future__ import annotations

from elasticrun.system.printable import printable


def test_control_characters_become_escapes() -> None:
    text = "a\x1b[2Jb\x07c\x00d\x7fe\x9bf\x1b]0;title\x07\r\n"
    shown = printable(text)
    assert shown == "a\\x1b[2Jb\\x07c\\x00d\\x7fe\\x9bf\\x1b]0;title\\x07\\x0d\\x0a"
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in shown)


def test_ordinary_text_and_unicode_stay() -> None:
    for text in ("node-1.example.com:4", "Grüße, 東京, ε=0.1", "tab-free ascii ~!@#$%^&*()"):
        assert printable(text) == text


def test_bidi_overrides_and_line_separators_are_escaped() -> None:
    assert printable("a\u202eb\u2028c") == "a\\u202eb\\u2028c"
