"""How the commands show rows: rich's tables on a terminal, one plain line a row everywhere else.

A table wraps long cells at 80 columns off a terminal, and a wrapped layer path is found by no ``grep``: so
piped or redirected, each row is one line with its values whole; lines beside the tables (`say`) never wrap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Column = str | tuple[str, dict[str, Any]]  # a name, or a name and rich's add_column options


def make_console(**kwargs: Any) -> Any:
    """A rich ``Console`` for command output (its keyword arguments as rich's); where the reader closed the pipe
    early (``| head``), the command ends as Unix tools end, exit 141 (128 + SIGPIPE), not rich's 1 (which is
    ``check``'s exit for an error finding)."""
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            try:
                super().on_broken_pipe()  # (stdout to /dev/null, then SystemExit(1))
            except SystemExit:
                raise SystemExit(141) from None

    return PipedConsole(**kwargs)


def as_text(render: Callable[[Any], None], width: int) -> str:
    """What ``render(console)`` (a result's ``render_text``) prints on a console ``width`` characters wide that is not
    a terminal (plain lines, no colours), as text."""
    import io

    buffer = io.StringIO()
    render(make_console(file=buffer, width=width, color_system=None, force_terminal=False))
    return buffer.getvalue()


def is_terminal(console: Any) -> bool:
    """Whether ``console`` writes to a terminal: the one test of whether to draw tables."""
    return bool(console.is_terminal)


def say(console: Any, text: str, style: str | None = None) -> None:
    """One line of text as it is: no markup read in it; not wrapped off a terminal (a pipe gets it whole)."""
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=not is_terminal(console))


def plain_row(columns: Sequence[str], row: Sequence[Any]) -> str:
    """``"kernels: convolution; ms per step: 1.20; ..."``: a row's non-empty cells, each after its column's name."""
    return "; ".join(f"{name}: {cell}" for name, cell in zip(columns, map(str, row), strict=False) if cell)


def show_rows(console: Any, columns: Sequence[Column], rows: Sequence[Sequence[Any]], *, title: str | None = None,
              plain: Callable[[Sequence[str]], str] | None = None, styles: Sequence[str | None] | None = None,
              **table: Any) -> None:
    """``rows`` under ``columns``: a rich table on a terminal, else one line a row (``plain(cells)``, by default
    `plain_row`) after the title. Cells are plain text (rich ``Text`` keeps its style on a terminal);
    ``styles`` gives a row's style, ``table`` rich's ``Table`` options."""
    names = [c if isinstance(c, str) else c[0] for c in columns]
    if not is_terminal(console):
        if title:
            say(console, title)
        for row in rows:
            cells = [str(c) for c in row]
            say(console, plain(cells) if plain else plain_row(names, cells))
        return
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, **table)
    for column in columns:
        name, options = (column, {}) if isinstance(column, str) else column
        t.add_column(name, **options)
    for i, row in enumerate(rows):
        t.add_row(*(escape(c) if isinstance(c, str) else c for c in row), style=styles[i] if styles else None)
    console.print(t)
