"""The command line and the README's commands, run as subprocesses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fairq(
    *args: str, cwd: Path, timeout: float = 60, check: bool = True, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, COLUMNS=str(columns), FAIRQ_URL=f"sqlite:///{cwd / 'cli.db'}"),
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_send_receive_stats_redrive(tmp_path: Path) -> None:
    out = fairq("send", "jobs", '{"order": "o-1"}', "--attr", "channel=sms", cwd=tmp_path).stdout
    assert re.fullmatch(r"[0-9a-f]{16}\n", out)
    fairq("send", "jobs", "copy", "--count", "250", cwd=tmp_path)
    stats = fairq("stats", cwd=tmp_path).stdout
    assert re.search(r"jobs\s+│\s+251\s", stats), stats
    got = fairq("receive", "jobs", "--max", "1", cwd=tmp_path).stdout
    assert "o-1" in got and "channel=sms" in got
    peek = fairq("receive", "jobs", "--peek", "--max", "3", cwd=tmp_path).stdout
    assert "(peek)" in peek and "copy" in peek
    assert "no messages in jobs.dlq" in fairq("receive", "jobs.dlq", cwd=tmp_path).stdout
    redrive = fairq("redrive", "jobs.dlq", cwd=tmp_path).stdout
    assert "moved 0 message(s)" in redrive
    wrong = fairq("redrive", "jobs", cwd=tmp_path, check=False)  # not a dead-letter queue
    assert wrong.returncode == 1 and "is it a dead-letter queue?" in wrong.stderr, wrong.stderr


def test_a_dead_letters_reason_and_detail_have_a_column(tmp_path: Path) -> None:
    import asyncio

    import fairq as lib

    async def fail_one() -> None:
        async with await lib.connect(f"sqlite:///{tmp_path / 'cli.db'}") as broker:
            q = await broker.declare_queue("jobs", max_attempts=1)
            await q.send(b"order-9")
            (m,) = await q.receive()
            await m.nack(error="ValueError: total missing")

    asyncio.run(fail_one())
    peek = fairq("receive", "jobs.dlq", "--peek", cwd=tmp_path, columns=200).stdout
    assert "why" in peek and "max_attempts: ValueError: total missing" in peek, peek
    assert "fairq.detail" not in peek  # shown once, in its column


def test_ctrl_c_during_a_long_send_says_how_many_were_sent(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "send", "big", "x", "--count", "5000000"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="200", FAIRQ_URL=f"sqlite:///{tmp_path / 'cli.db'}"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    wal = tmp_path / "cli.db-wal"
    deadline = time.monotonic() + 30
    while not (wal.exists() and wal.stat().st_size > 1_000_000):  # sending for a while
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    said = re.search(r"interrupted: ([\d,]+) of 5,000,000 sent", err)
    assert said, err
    row = next(x for x in fairq("stats", "big", cwd=tmp_path).stdout.splitlines() if "│ big" in x)
    stored = int(row.split("│")[2].replace(",", "").strip())
    told = int(said.group(1).replace(",", ""))
    assert told <= stored <= told + 100  # at most the batch under way besides


def test_stats_fit_an_80_column_terminal(tmp_path: Path) -> None:
    fairq("send", "orders.billing", "x", "--count", "3", cwd=tmp_path)
    text = fairq("stats", cwd=tmp_path, columns=80).stdout
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")][:6] == [
        "queue",
        "visible",
        "delayed",
        "in flight",
        "oldest",
        "dlq",
    ], text
    assert re.search(r"orders\.billing\s+│\s+3\s", text), text
    assert "not shown at 80 columns wide:" in text and "expired" in text
    named = fairq("stats", "orders.billing", cwd=tmp_path, columns=80).stdout
    row = next(line for line in named.splitlines() if line.startswith("│ orders.billing "))
    assert [c.strip() for c in row.strip("│").split("│")][5] == "0", named  # its DLQ's depth
    assert "orders.billing.dlq" not in named


def test_send_with_a_priority_declares_a_queue_that_takes_it(tmp_path: Path) -> None:
    fairq("send", "urgent", "low", cwd=tmp_path, check=False)  # max_priority 0: refused below
    fairq("send", "ranked", "low", "--max-priority", "9", cwd=tmp_path)
    fairq("send", "ranked", "high", "--priority", "9", cwd=tmp_path)
    fairq("send", "first", "p5", "--priority", "5", cwd=tmp_path)  # declared with max 5
    refused = fairq("send", "urgent", "x", "--priority", "3", cwd=tmp_path, check=False)
    assert refused.returncode == 1 and "max_priority 0" in refused.stderr
    got = fairq("receive", "ranked", "--max", "2", cwd=tmp_path).stdout
    assert got.index("high") < got.index("low")
    assert "p5" in fairq("receive", "first", cwd=tmp_path).stdout


def test_subscribe_updates_only_what_it_is_given(tmp_path: Path) -> None:
    def row() -> list[str]:
        text = fairq("topics", cwd=tmp_path).stdout
        line = next(x for x in text.splitlines() if "│ sms " in x)
        return [c.strip() for c in line.strip("│").split("│")]

    fairq("subscribe", "events", "sms", "--filter", '{"channel": ["sms"]}', cwd=tmp_path)
    fairq("subscribe", "events", "sms", "--routing", "sms.#", cwd=tmp_path)
    assert row()[4:6] == ["sms.#", '{"channel":["sms"]}']  # the filter stayed
    fairq("subscribe", "events", "sms", "--filter", "", cwd=tmp_path)  # "" removes it
    assert row()[4:6] == ["sms.#", ""]
    out = fairq("publish", "events", "x", "--key", "sms.eu", cwd=tmp_path).stdout
    assert "→ sms" in out


def test_subscribe_keeps_the_queue_options_of_the_subscription_it_updates(
    tmp_path: Path,
) -> None:
    import asyncio

    import fairq as fq

    url = f"sqlite:///{tmp_path / 'cli.db'}"

    async def make() -> None:
        async with await fq.connect(url) as broker:
            t = await broker.declare_topic("events")
            await t.subscribe("sms", max_attempts=9, visibility_timeout=77, dead_letter="held")

    async def config() -> fq.QueueConfig:
        async with await fq.connect(url) as broker:
            return await broker.queue("events.sms").config()

    asyncio.run(make())
    fairq("subscribe", "events", "sms", "--routing", "", cwd=tmp_path)  # only the empty key
    got = asyncio.run(config())
    assert (got.max_attempts, got.visibility_timeout, got.dead_letter) == (9, 77.0, "held")
    text = fairq("topics", cwd=tmp_path, columns=200).stdout
    line = next(x for x in text.splitlines() if "│ sms " in x)
    assert [c.strip() for c in line.strip("│").split("│")][4] == '""', "not # (everything)"


@pytest.mark.parametrize(
    "args", [["topics"], ["subscribe", "events", "sms"], ["attention", "market"]]
)
def test_commands_without_a_server_path_refuse_fairq_server(
    tmp_path: Path, args: list[str]
) -> None:
    """With FAIRQ_SERVER set they would have opened ./fairq.db instead, quietly."""
    env = {k: v for k, v in os.environ.items() if k != "FAIRQ_URL"}
    env["FAIRQ_SERVER"] = "http://127.0.0.1:9"
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "FAIRQ_SERVER is set" in " ".join(proc.stderr.split())
    assert not (tmp_path / "fairq.db").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["send", "jobs", "x", "--count", "0"],
        ["send", "jobs", "x", "--count", "-5"],
        ["send", "jobs", "x", "--delay", "-1"],
        ["send", "jobs", "x", "--priority", "-1"],
        ["send", "jobs", "x", "--dedup-id", "k1", "--count", "3"],
        ["receive", "jobs", "--max", "0"],
        ["receive", "jobs", "--wait", "-1"],
    ],
    ids=lambda args: " ".join(args[2:]) if args[0] == "send" else " ".join(args[::2]),
)
def test_bad_options_are_usage_errors_that_send_nothing(tmp_path: Path, args: list[str]) -> None:
    proc = fairq(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not (tmp_path / "cli.db").exists() or "jobs" not in fairq("stats", cwd=tmp_path).stdout


def test_errors_are_one_line_and_exit_1(tmp_path: Path) -> None:
    proc = fairq("receive", "never-declared", cwd=tmp_path, check=False, columns=40)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr  # not wrapped at the terminal's width
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = fairq("send", "bad name", "x", cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "invalid queue name" in proc.stderr


APP = """
import fairq
worker = fairq.Worker(concurrency=4, grace=10)

@worker.queue("jobs")
async def handle(msg):
    import asyncio
    print("start", msg.body.decode(), flush=True)
    await asyncio.sleep(1.0)
    print("done", msg.body.decode(), flush=True)
"""


def test_worker_command_shuts_down_gracefully_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    fairq("send", "jobs", "one", cwd=tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "worker", "app:worker"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, FAIRQ_URL=f"sqlite:///{tmp_path / 'cli.db'}"),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "start one"
    proc.send_signal(signal.SIGTERM)  # mid-handler: it must finish and ack
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "done one" in out
    stats = fairq("stats", "jobs", cwd=tmp_path).stdout
    row = next(line for line in stats.splitlines() if line.startswith("│ jobs"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[1:4] == ["0", "0", "0"] and cells[7] == "1", (
        row
    )  # visible, delayed, in flight; acked


def test_worker_command_takes_url(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    fairq("send", "jobs", "two", "--url", other, cwd=tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "worker", "app:worker", "--url", other],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, FAIRQ_URL=f"sqlite:///{tmp_path / 'cli.db'}"),  # --url wins
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "start two"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "done two" in out, err
    assert f"worker running on {other}: queue jobs" in err  # it says it runs, and where


def test_worker_url_cannot_replace_the_apps_own(tmp_path: Path) -> None:
    (tmp_path / "own.py").write_text(
        "import fairq\nworker = fairq.Worker('sqlite:///mine.db')\n"
        "@worker.queue('jobs')\nasync def handle(msg): pass\n"
    )
    proc = fairq("worker", "own:worker", "--url", "sqlite:///x.db", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "cannot replace" in proc.stderr, proc.stderr


def test_worker_command_rejects_a_bad_target(tmp_path: Path) -> None:
    proc = fairq("worker", "no_such_module:worker", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "cannot import" in proc.stderr


def test_demo_makes_every_ticket(tmp_path: Path) -> None:
    fairq("send", "ticket-pdf", "mine", cwd=tmp_path)  # the tour's queue: not the demo's
    start = time.monotonic()
    proc = fairq(
        "demo", "--jobs", "24", "--workers", "2", "--concurrency", "2", cwd=tmp_path, timeout=180
    )
    assert "PDFs on disk" in proc.stdout
    pdfs = sorted((tmp_path / "tickets").glob("*.pdf"))
    assert len(pdfs) == 24
    assert all(p.read_bytes().startswith(b"%PDF") for p in pdfs)
    assert "mine" in fairq("receive", "ticket-pdf", "--peek", cwd=tmp_path).stdout
    assert time.monotonic() - start < 170


def test_quickstart_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "acked=2 nacked=1 dead_lettered=1" in proc.stdout


def test_readme_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    blocks = [lines[i + 1] for i, line in enumerate(lines[:12]) if line.startswith("```sh")]
    assert [b.split("#")[0].strip() for b in blocks[:2]] == ["make run", "make test"]
    dry = subprocess.run(["make", "-n", "run", "test"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr


@pytest.mark.parametrize("target", ["run", "test", "lint", "bench"])
def test_makefile_targets_exist(target: str) -> None:
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.M)
