"""Tables that fit the terminal: the CLI's stats, topics and attention tables name the
columns that matter most, and a narrow terminal hides the others (the caption says which)
instead of cutting every header and number down to ``vi…``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

# what a column costs beside its text: one space each side and one rule
_EDGES = 3


@dataclass(frozen=True)
class Col:
    """A column: its header, whether it holds numbers (right-justified), and ``hide``: 0
    for a column always shown, otherwise its rank among the columns a narrow terminal hides
    (the highest goes first)."""

    header: str
    numbers: bool = False
    hide: int = 0


def _cell_width(cell: str) -> int:
    return max((Text.from_markup(line).cell_len for line in cell.split("\n")), default=0)


def _widths(cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> list[int]:
    widths = [len(c.header) for c in cols]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], _cell_width(cell))
    return widths


def _table(title: str | None, cols: Sequence[Col], caption: str | None = None) -> Table:
    table = Table(title=title, caption=caption)
    for c in cols:
        # folded, never elided: a long name takes two lines rather than reading "orde…"
        table.add_column(c.header, justify="right" if c.numbers else "left", overflow="fold")
    return table


def fitted(
    title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int
) -> Table:
    """A table of ``rows`` at most ``width`` cells wide where it can be: hidable columns
    go (empty ones, then the highest ``hide``) until the rest fit; the caption names them.
    A column always shown folds its long cells onto more lines."""
    widths = _widths(cols, rows)
    shown = list(range(len(cols)))
    total = sum(w + _EDGES for w in widths) + 1
    # an empty column goes before any other, then the highest rank, the rightmost first
    by_rank = sorted(
        (i for i, c in enumerate(cols) if c.hide),
        key=lambda i: (not any(row[i] for row in rows), cols[i].hide, i),
        reverse=True,
    )
    hidden: list[int] = []
    for i in by_rank:
        if total <= width:
            break
        shown.remove(i)
        hidden.append(i)
        total -= widths[i] + _EDGES
    caption = None
    if hidden:
        names = ", ".join(cols[i].header for i in sorted(hidden))
        caption = f"not shown at {width} columns wide: {names}"
    table = _table(title, [cols[i] for i in shown], caption)
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def folded(title: str | None, cols: Sequence[Col], row: Sequence[str], width: int) -> Group:
    """One row of many counters as tables of consecutive columns, each at most ``width``
    cells wide, stacked: every counter shown, none cut."""
    widths = _widths(cols, [row])
    parts: list[Table] = []
    start, total = 0, 1
    for i, w in enumerate(widths):
        if i > start and total + w + _EDGES > width:
            parts.append(_part(title if not parts else None, cols, row, start, i))
            start, total = i, 1
        total += w + _EDGES
    parts.append(_part(title if not parts else None, cols, row, start, len(cols)))
    return Group(*parts)


def _part(title: str | None, cols: Sequence[Col], row: Sequence[str], a: int, b: int) -> Table:
    table = _table(title, cols[a:b])
    table.add_row(*row[a:b])
    return table
