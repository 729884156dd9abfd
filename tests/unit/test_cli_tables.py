"""The CLI's tables fit the terminal: columns that matter stay, the others give way, and
nothing is cut to an ellipsis."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from fairq.cli.tables import Col, fitted, folded

COLS = [
    Col("queue"),
    Col("visible", True),
    Col("sent", True, 1),
    Col("acked", True, 2),
    Col("expired", True, 3),
]
ROWS = [["orders.billing", "12", "340", "328", "0"], ["orders.billing.dlq", "0", "0", "0", "0"]]


def render(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def headers(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def test_a_wide_terminal_shows_every_column_without_a_caption() -> None:
    text = render(fitted("t", COLS, ROWS, 200), 200)
    assert headers(text) == ["queue", "visible", "sent", "acked", "expired"]
    assert "not shown" not in text


def test_a_narrow_terminal_hides_the_highest_ranks_first_and_says_which() -> None:
    # queue 18 + visible 7 + sent 4 + acked 5 + expired 7, each with 3 cells of edges, + 1
    assert render(fitted("t", COLS, ROWS, 57), 57).count("not shown") == 0
    text = render(fitted("t", COLS, ROWS, 56), 56)
    assert headers(text) == ["queue", "visible", "sent", "acked"]
    assert "not shown at 56 columns wide: expired" in text
    text = render(fitted("t", COLS, ROWS, 38), 38)
    assert headers(text) == ["queue", "visible"]
    assert "sent, acked, expired" in text
    assert "…" not in text


def test_columns_always_shown_fold_instead_of_eliding() -> None:
    text = render(fitted("t", COLS, ROWS, 20), 20)
    assert "…" not in text
    assert "orders" in text and "dlq" in text


def test_an_empty_column_gives_way_before_a_higher_rank() -> None:
    cols = [Col("topic"), Col("filter", hide=1), Col("push", hide=5), Col("visible", True)]
    rows = [["orders", "", "http://127.0.0.1:9/hook", "3"]]
    text = render(fitted(None, cols, rows, 46), 46)
    assert headers(text) == ["topic", "push", "visible"]


def test_folded_counters_keep_every_counter() -> None:
    cols = [Col(f"counter {i}", True) for i in range(12)]
    row = [str(i * 1000) for i in range(12)]
    text = render(folded("domain d", cols, row, 60), 60)
    for i in range(12):
        assert f"counter {i}" in text and str(i * 1000) in text
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 60


async def test_stats_show_freshness_only_where_a_queue_has_an_slo() -> None:
    import fairq
    from fairq.cli.queues import stats_table

    async with await fairq.connect("memory://") as broker:
        await broker.declare_queue("plain")
        assert "freshness" not in render(await stats_table(broker, width=200), 200)
        q = await broker.declare_queue("fresh", freshness_slo=60)
        await q.send(b"x")
        text = render(await stats_table(broker, width=200), 200)
        assert headers(text)[-1] == "freshness"
        row = next(line for line in text.splitlines() if line.startswith("│ fresh "))
        assert row.strip("│ ").endswith("ok")
        text = render(await stats_table(broker, width=80), 80)
        assert headers(text)[:6] == ["queue", "visible", "delayed", "in flight", "oldest", "dlq"]
        assert "freshness" in headers(text) and "…" not in text


async def test_stats_show_the_depth_of_a_dead_letter_queue_of_any_name() -> None:
    import fairq
    from fairq.cli.queues import stats_table

    async with await fairq.connect("memory://") as broker:
        q = await broker.declare_queue("cust", dead_letter="graveyard", max_attempts=1)
        await q.send(b"x")
        (m,) = await q.receive()
        await m.dead_letter("bad")
        for names in (None, ["cust"]):
            text = render(await stats_table(broker, names, width=200), 200)
            row = next(line for line in text.splitlines() if line.startswith("│ cust "))
            assert [c.strip() for c in row.strip("│").split("│")][5] == "1", text


def test_a_command_prints_fairqs_warnings_as_warning_lines() -> None:
    import logging

    from typer.testing import CliRunner

    from fairq.cli import app

    logger = logging.getLogger("fairq")
    before = list(logger.handlers)
    try:
        result = CliRunner().invoke(app, ["stats", "--url", "memory://"])
        assert result.exit_code == 0, result.output
        (added,) = [h for h in logger.handlers if h not in before]
        record = logger.makeRecord(
            "fairq.x", logging.WARNING, "f", 1, "autovacuum is off", (), None
        )
        assert added.format(record) == "warning: autovacuum is off"
        assert added.level == logging.WARNING
    finally:
        logger.handlers[:] = before


async def test_stats_of_no_queue_say_so() -> None:
    import fairq
    from fairq.cli.queues import stats_table

    async with await fairq.connect("memory://") as broker:
        assert "no queues yet" in render(await stats_table(broker, width=200), 200)


def test_an_error_echoes_at_most_a_little_of_a_long_bad_input() -> None:
    import pytest

    import fairq
    from fairq.message import check_key, check_name

    for check in (check_key, check_name):
        with pytest.raises(fairq.InvalidName) as info:
            check("x" * 5000)
        assert len(str(info.value)) < 200 and "(5002 characters)" in str(info.value)


async def test_breaching_queues_come_first() -> None:
    import fairq
    from fairq.cli.queues import stats_table

    clock = fairq.ManualClock()
    async with await fairq.connect("memory://", clock=clock) as broker:
        for name in ("a-fine", "b-late", "c-later"):
            await broker.declare_queue(name, freshness_slo=5)
        await broker.queue("c-later").send(b"x")
        clock.advance(3)
        await broker.queue("b-late").send(b"x")
        await broker.queue("a-fine").send(b"x")
        clock.advance(4)  # c-later 7 s old, b-late 4 s: only c-later breaches
        text = render(await stats_table(broker, width=200), 200)
        rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│ ")]
        assert rows == ["c-later", "a-fine", "a-fine.dlq", "b-late", "b-late.dlq", "c-later.dlq"]


def test_stats_watch_into_a_pipe_prints_each_refresh(tmp_path: Path) -> None:
    """A live display writes nothing into a pipe until it ends: piped, --watch prints the
    table anew each second, with its time."""
    import selectors
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path / 'w.db'}"
    subprocess.run([sys.executable, "-m", "fairq", "send", "jobs", "x", "--url", url], check=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "stats", "--watch", "--url", url],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        watching = selectors.DefaultSelector()
        watching.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 20
        while sum(line.startswith("# ") for line in lines) < 2:
            left = deadline - time.monotonic()
            assert left > 0 and watching.select(left), f"nothing printed in 20 s: {lines}"
            line = proc.stdout.readline()
            assert line, "stats --watch ended"
            lines.append(line)
    finally:
        proc.kill()
        proc.wait()
    assert sum("jobs" in line for line in lines) >= 1
