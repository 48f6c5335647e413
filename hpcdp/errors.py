"""The one error type users see: a one-line message, exit code 2, no traceback."""

import argparse
import difflib
import os
from collections.abc import Iterable
from pathlib import Path

CLI_NAME = "hpcdp"
# Set by `hpcdp export|sample|eval`, which exec `python -m train`: that process then names itself
# as the user called it ("hpcdp: error: sample: ..."), not "python -m train".
VIA_CLI = "HPCDP_VIA_CLI"


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message on one line and exits with code 2."""

    exit_code = 2


class ConfigErrors(UsageError):
    """Every problem found in a configuration at once (a profile, an experiment and their
    --set), so that one run of the command names them all: one line still, numbered."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(problems[0] if len(problems) == 1 else
                         f"{len(problems)} problems: "
                         + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))

    @staticmethod
    def of(error: UsageError) -> list[str]:
        """The problems `error` reports: its own list, or its one message."""
        return error.problems if isinstance(error, ConfigErrors) else [str(error)]


class AlreadySaid(UsageError):
    """This rank fails for a reason another rank (rank 0) has already put in one line: the job
    log says it once, not once per rank; the exit code is the one rank 0 exits with."""

    def __init__(self, exit_code: int = 1) -> None:
        super().__init__("")
        self.exit_code = exit_code


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def positive_number(text: str, error: str) -> float:
    """`text` as a positive finite number, else UsageError(error): one rule for every number a
    user types into an option or an environment variable."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UsageError(error)
    return value


def check_out_folder(out, option: str = "--out") -> None:
    """An output folder is refused before the command reads or prints anything, not after: a
    file, or a folder that cannot be made (nothing is created until the outputs are written)."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"{option} {str(out)!r} is a file; give a folder (made if missing)")
        return
    existing = next(p for p in out.absolute().parents if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {str(out)!r} cannot be created: {str(existing)!r} is not a "
                         "folder you can write to")


def one_line(text: str) -> str:
    """Collapse line breaks so that a message stays one line even when it quotes bad input
    (every separator str.splitlines knows: \r, \v, \x1c-\x1e, \u2028, ...)."""
    return " ".join(str(text).splitlines())


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are UsageErrors: one line and exit 2, like every other bad input
    (plain argparse prints the usage block first). No abbreviated options: sbatch's `--time
    2:00:00` must not be taken for --timeout, nor an option added later change what an old
    abbreviation meant."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        # hpcdp's main prints "hpcdp: error: " itself: name only the sub-command here.
        where = self.prog.removeprefix(CLI_NAME).strip()
        raise UsageError(f"{where}: {message}" if where else message)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value
