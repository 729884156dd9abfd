"""``fairq demo flash-sale`` as a subprocess, scaled down: every seat is sold, every fan
ends admitted or told "sold out", and the plain ``fairq demo`` still takes its options."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def fairq(*args: str, cwd: Path, timeout: float = 120) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, COLUMNS="200", FAIRQ_URL=f"sqlite:///{cwd / 'sale.db'}"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def row(table: str, label: str) -> str:
    found = re.search(rf"│ {re.escape(label)}\s+│\s+(.+?)\s+│", table)
    assert found, f"no row {label!r} in:\n{table}"
    return found.group(1)


def number(text: str) -> int:
    return int(text.split()[0].replace(",", ""))


def test_flash_sale_sells_every_seat_and_tells_everyone_else(tmp_path: Path) -> None:
    out = fairq(
        "demo",
        "flash-sale",
        "--fans", "400",
        "--seats", "60",
        "--rate", "100",
        "--hold", "1",
        "--pre-open", "1",
        "--seed", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert row(out, "seats sold") == "60 of 60"
    joined = number(row(out, "fans joined"))
    admitted = number(row(out, "fans admitted"))
    told = number(row(out, "fans told sold out"))
    assert joined == 400
    assert admitted + told == joined, out  # every fan is admitted or told sold out
    assert told > 0 and number(row(out, "  of whom in the pre-queue (drawn at opening)")) > 0
    assert number(row(out, "holds made (token checked and burnt)")) > 0
    after = row(out, "  last one told, after the sell-out")
    assert float(after.split()[0]) <= 5.0 + 1.0, after  # one refresh interval (5 s) + slack


def test_demo_help_lists_both_scenarios(tmp_path: Path) -> None:
    out = fairq("demo", "--help", cwd=tmp_path)
    assert "--jobs" in out and "flash-sale" in out
    assert "--inventory-rate" in fairq("demo", "flash-sale", "--help", cwd=tmp_path)
