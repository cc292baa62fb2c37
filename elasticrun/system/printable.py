"""Text from outside (discovery output, a script's or worker's stderr, host names, webhook
input) made safe to print: a terminal shows it, it does not obey it.

Control characters (C0, DEL, C1: ESC, BEL, NUL, CR, the OSC/CSI introducers...) become
escapes (`\\x1b`, `\\x9b`); other Unicode, accents and CJK included, stays as it is. Line
breaks are escaped too: one line printed stays one line.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character (and bidi override) written as an escape."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
