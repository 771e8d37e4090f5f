"""The one progress bar: quiet shows nothing and ignores every call; a shown bar counts."""

from infersim.simulator.progress import ProgressBar


def test_quiet_bar_ignores_every_call(capsys):
    with ProgressBar("work", quiet=True, total=3, fields="{task.fields[note]}", note="") as bar:
        bar.update(advance=1, note="x")
        bar.start(5)
        bar.print("hidden")
    assert capsys.readouterr().out == ""


def test_shown_bar_counts_and_takes_any_field_name():
    with ProgressBar("work", total=3, fields="{task.fields[label]} {task.fields[title]}", label="", title="") as bar:
        bar.update(advance=2, label="a", title="b")
        task = bar._p.tasks[0]
        assert (task.completed, task.total, task.fields["label"], task.fields["title"]) == (2, 3, "a", "b")
