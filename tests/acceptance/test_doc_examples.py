"""Every whole program in the docs and the README (a ```python block that runs itself with
``asyncio.run`` or ``__main__``) runs as printed, in a fresh directory: the pages' runnable
examples cannot rot without a red test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def programs() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
        for i, block in enumerate(blocks):
            if "asyncio.run(" in block or "__main__" in block:
                found.append((f"{page.relative_to(ROOT)}#{i}", block))
    return found


PROGRAMS = programs()


def test_the_pages_have_programs_to_run() -> None:
    # the tour and the capability pages each carry one; fewer means the finder broke
    assert len(PROGRAMS) >= 5, [name for name, _ in PROGRAMS]


@pytest.mark.parametrize("name,source", PROGRAMS, ids=[name for name, _ in PROGRAMS])
def test_a_documented_program_runs(name: str, source: str, tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
