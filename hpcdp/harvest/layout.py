"""Plain text that fits a terminal: a table keeps the columns that fit, in order of importance,
and wraps its notes; prose wraps at words. The full-width table stays in `--wide`, table.md and
table.csv: a line wider than the terminal wraps into something no one can read."""

from __future__ import annotations

import os
import sys
import textwrap

GAP = "  "
MIN_WRAPPED = 24
"""The narrowest a wrapped notes column gets before more columns are left out."""


def terminal_width() -> int | None:
    """COLUMNS where set, else the terminal's width; None (no limit) when stdout is a file or
    a pipe: a file has no width, and scripts reading it get every column."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def fit(rows: list[list[str]], width: int | None, *, left: set[int],
        priority: list[int] | None = None, wrap: int | None = None) -> list[str]:
    """Aligned lines, and under them the line that says how many columns were left out, if
    any. rows[0] holds the titles; `left`: columns aligned left (the others right); `priority`:
    column indices, most important first (default: their order); `wrap`: a free-text column
    kept last and wrapped into the width that remains."""
    n, asked = len(rows[0]), wrap is not None
    wrap = wrap if wrap is not None and any(row[wrap] for row in rows[1:]) else None
    widths = [max(len(row[i]) for row in rows) for i in range(n)]
    order = [i for i in (priority or range(n)) if i != wrap]
    if width is None:
        kept = [i for i in range(n) if i != wrap]
    else:
        budget = width - (MIN_WRAPPED + len(GAP) if wrap is not None else 0)
        kept = []
        for i in order:  # the first always, however wide: a table needs its first column
            if not kept or sum(widths[k] for k in kept + [i]) + len(GAP) * len(kept) <= budget:
                kept.append(i)
    shown = sorted(kept)
    used = sum(widths[i] for i in shown) + len(GAP) * len(shown)
    notes_width = widths[wrap] if wrap is not None else 0
    if wrap is not None and width is not None:
        notes_width = max(MIN_WRAPPED, min(notes_width, width - used))
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) if i in left else row[i].rjust(widths[i]) for i in shown]
        if wrap is None:
            lines.append(GAP.join(cells).rstrip())
            continue
        parts = textwrap.wrap(row[wrap], notes_width) or [""]
        lines.append((GAP.join(cells) + GAP + parts[0]).rstrip())
        lines += [" " * used + part for part in parts[1:]]
    dropped = n - len(shown) - asked
    if dropped and width:
        lines.append(f"({dropped} more column(s) left out to fit {width} characters: --wide "
                     "prints them, --out writes them to table.md and table.csv)")
    return lines


def wrap_text(text: str, width: int | None) -> str:
    """Every line longer than `width` wrapped at words; a '- ' item continues indented."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False)
    return "\n".join(out)
