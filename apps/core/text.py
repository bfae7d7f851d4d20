"""Text checks shared by every place a user- or operator-supplied value can reach a script."""

import re

#: C0 and C1 control characters and DEL. A newline in a value that lands in a job script starts a
#: new ``#SBATCH`` line or a new shell command (R-BACK-6), so such values are refused, not escaped.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def has_control_characters(value: str) -> bool:
    return bool(CONTROL_CHARACTERS.search(value))
