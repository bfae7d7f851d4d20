"""Text checks shared by every place a user- or operator-supplied value can reach a script."""

import re

#: C0 and C1 control characters and DEL. A newline in a value that lands in a job script starts a
#: new ``#SBATCH`` line or a new shell command (R-BACK-6), so such values are refused, not escaped.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def has_control_characters(value: str) -> bool:
    return bool(CONTROL_CHARACTERS.search(value))


#: what a shown name must not carry as is: the control characters above and the Unicode line and
#: paragraph separators (a newline, carriage return or U+2028 splits a name across lines, or onto
#: another's line) and the bidirectional controls, which reorder what follows them
#: ("report\u202ecod.exe" shows as "reportexe.doc").
HIDDEN_IN_NAMES = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(name: str) -> str:
    """``name`` with every character of :data:`HIDDEN_IN_NAMES` written as its escape (``\\n``,
    ``\\x1b``, ``\\u202e``), for showing a name a command chose. A backslash stays as is, so a
    shown name is not always the name: links carry the real one."""

    def escape(match: re.Match) -> str:
        char = match.group()
        if char in _NAMED_ESCAPES:
            return _NAMED_ESCAPES[char]
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    return HIDDEN_IN_NAMES.sub(escape, name)
