"""The one error type users see: a one-line message, exit code 2, no traceback."""

import difflib
from collections.abc import Iterable


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message on one line and exits with code 2."""

    exit_code = 2


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_line(text: str) -> str:
    """Collapse newlines so that a message stays one line even when it quotes bad input."""
    return " ".join(str(text).split("\n"))
