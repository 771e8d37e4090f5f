"""The one progress bar every long command shows: a rich bar with a label, done/total, a line
of fields and the elapsed time; with `quiet`, nothing at all (so callers never branch on it)."""

from __future__ import annotations

import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressBar:
    """A context manager over one task. `fields` is a rich format string over the task's
    fields (`{task.fields[note]}`), shown between the count and the elapsed time; a transient
    bar vanishes when done."""

    def __init__(
        self,
        title: str,
        /,
        *,
        quiet: bool = False,
        total: int | None = None,
        fields: str = "",
        transient: bool = False,
        **initial,
    ):
        self.title, self.quiet, self.total, self.fields = title, quiet, total, fields
        self.transient, self.initial = transient, initial
        self._p: Progress | None = None
        self._task = None

    def __enter__(self) -> "ProgressBar":
        if not self.quiet:
            cols = [TextColumn(self.title), BarColumn(), MofNCompleteColumn()]
            if self.fields:
                cols.append(TextColumn(self.fields))
            self._p = Progress(*cols, TimeElapsedColumn(), transient=self.transient)
            self._p.__enter__()
            if self.total is not None:
                self.start(self.total, **self.initial)
        return self

    def start(self, total: int, completed: int = 0, **fields) -> None:
        """The task, when its size is known only after the bar is shown."""
        self.total = total
        if self._p is not None:
            self._task = self._p.add_task(self.title, total=total, completed=completed, **{**self.initial, **fields})

    def update(self, **changes) -> None:
        """rich's `Progress.update` of the task (completed=, advance=, total=, or its fields)."""
        if self._p is not None and self._task is not None:
            self._p.update(self._task, **changes)

    def print(self, message: str) -> None:
        """A line above the bar (or nothing, quiet)."""
        if self._p is not None:
            self._p.console.print(message)

    def __exit__(self, *exc) -> bool:
        if self._p is not None:
            self._p.__exit__(*exc)
            self._p = None
        return False


def log_line(message: str) -> None:
    """A progress line on stderr, shown at once (the `log` callbacks of long commands)."""
    print(message, file=sys.stderr, flush=True)


def quiet_log(message: str) -> None:
    """The `log` callback under --quiet: nothing."""
