"""Slurm hostlists (`node[001-004,010]`, `a[1-2]b[3-4]`) expanded as `scontrol show hostnames`
does. Pure Python; hpcdp.distenv reads SLURM_*_NODELIST with it."""

from __future__ import annotations

import re

from hpcdp.errors import UsageError, one_line


class HostlistError(UsageError, ValueError):
    """A Slurm hostlist that cannot be expanded; the message quotes the input."""

# One element of a bracket: "7" or "001-004". Slurm's own parser takes the zero padding from
# the start of a range ("n[01-3]" -> n01 n02 n03; "n[1-03]" -> n1 n2 n3), so do we.
_RANGE_RE = re.compile(r"(\d+)(?:-(\d+))?")
_MAX_RANGE = 64 * 1024  # Slurm's own cap (MAX_RANGE in hostlist.c): a typo, not a cluster


def _hostlist_error(text: str, why: str) -> HostlistError:
    return HostlistError(f"hostlist {one_line(text)!r} is malformed: {why}")


def _split_top_level(text: str) -> list[str]:
    """Split at commas and whitespace that are outside brackets; checks bracket balance."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            if depth:
                raise _hostlist_error(text, "nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise _hostlist_error(text, "']' without '['")
            depth = 0
        elif depth == 0 and (char == "," or char.isspace()):
            if current:
                items.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise _hostlist_error(text, "'[' without ']'")
    if current:
        items.append("".join(current))
    return items


def _expand_bracket(body: str, text: str) -> list[str]:
    """'001-003,010' -> ['001', '002', '003', '010'], keeping the width of each range's start."""
    out: list[str] = []
    for part in body.split(","):
        if not part.strip():
            raise _hostlist_error(text, "an empty range inside '[...]'")
        match = _RANGE_RE.fullmatch(part.strip())
        if not match:
            raise _hostlist_error(text, f"range {part!r} is not N or N-M with digits")
        start_text, end_text = match.group(1), match.group(2)
        start = int(start_text)
        end = int(end_text) if end_text is not None else start
        if end < start:
            raise _hostlist_error(text, f"range {part!r} runs backwards")
        if end - start >= _MAX_RANGE:
            raise _hostlist_error(text, f"range {part!r} holds more than {_MAX_RANGE} hosts")
        width = len(start_text)
        out.extend(str(i).zfill(width) for i in range(start, end + 1))
    return out


def _expand_item(item: str, text: str) -> list[str]:
    """'rack[0-1]-n[01-02]' -> rack0-n01 rack0-n02 rack1-n01 rack1-n02: the last bracket
    varies fastest, the order of `scontrol show hostnames`."""
    # Brackets are balanced and flat here, so split gives literal, body, literal, body, ...
    pieces = re.split(r"\[([^\]]*)\]", item)
    names = [pieces[0]]
    for body, literal in zip(pieces[1::2], pieces[2::2]):
        values = _expand_bracket(body, text)
        names = [name + value + literal for name in names for value in values]
    return names


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist into host names, in order, duplicates kept (like scontrol).

    Comma or whitespace separated names; each may hold bracket groups of numbers and ranges,
    zero padding kept: `node[001-004,010]`, `a[1-2]b[3-4]`, `n[1-3]-ib`, `rack[0-1]-n[01-02]`.
    Malformed input raises HostlistError naming it; never returns an empty list.
    """
    if not isinstance(text, str):
        raise HostlistError(f"hostlist must be a string, not {type(text).__name__}")
    items = _split_top_level(text)
    if not items:
        raise _hostlist_error(text, "it names no host")
    hosts: list[str] = []
    for item in items:
        hosts.extend(_expand_item(item, text))
    return hosts


