"""Running a reproduction's simulations: one after another in this process, or in worker
processes, under one progress bar."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

COLUMNS = (
    TextColumn("[bold]{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TimeElapsedColumn(),
    TextColumn("eta"),
    TimeRemainingColumn(),
    TextColumn("{task.fields[last]}"),
)


def run_tasks(
    fn: Callable, tasks: list, jobs: int, title: str, label: Callable | None = None
) -> list[tuple[int, object]]:
    """fn(task) for every task: in the order given in this process (`jobs` <= 1), or submitted
    in that order to `jobs` worker processes (`fn` and the tasks must pickle). Returns
    (index in `tasks`, result) in the order they finished; the bar titled `title` counts them
    and shows label(task) of the last one done."""
    name = label or (lambda task: "")
    done = []
    with Progress(*COLUMNS) as bar:
        pid = bar.add_task(title, total=len(tasks), last="")
        if jobs <= 1:
            for i, task in enumerate(tasks):
                done.append((i, fn(task)))
                bar.update(pid, advance=1, last=name(task))
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
                for fut in as_completed(futures):
                    done.append((futures[fut], fut.result()))
                    bar.update(pid, advance=1, last=name(tasks[futures[fut]]))
    return done
