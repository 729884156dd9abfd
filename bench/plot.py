"""Draw ``bench/results/queues.json`` as a PNG bar chart (``docs/bench-queues.png``).

    python -m bench.plot [--json bench/results/queues.json] [--out docs/bench-queues.png]

Left: msgs/s of every system in the send and receive+ack phases at batch 1 and 100 (log
scale, one group per phase and batch). Right: fairq on its own — 16 concurrent single
sends next to its batch-100 send, producer+consumers for each system, the Worker draining
a backlog beside receive(100)+ack_batch, and receive+ack on a shallow and a deep queue.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "bench" / "results" / "queues.json"
DEFAULT_OUT = ROOT / "docs" / "bench-queues.png"
COLORS = {
    "raw sqlite3": "#9e9e9e",
    "minimal raw loop": "#5f5f5f",
    "fairq": "#1f77b4",
    "persist-queue": "#ff7f0e",
    "persist-queue default": "#ffbb78",
    "huey": "#2ca02c",
}


def _rate(rows: list[dict[str, Any]], system: str, phase: str, batch: int) -> float | None:
    for r in rows:
        if r["system"] == system and r["phase"] == phase and r["batch"] == batch:
            return float(r["msgs_per_s"])
    return None


def plot(doc: dict[str, Any], out: Path) -> Path:
    """Write the chart of results document ``doc`` to ``out``; return ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["results"]
    systems = [s for s in COLORS if any(r["system"] == s for r in rows)]
    groups = [(p, b) for p in ("send", "receive+ack") for b in (1, 100)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6.2), gridspec_kw={"width_ratios": [3, 2]})

    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, ys = [], []
        for g, (phase, batch) in enumerate(groups):
            v = _rate(rows, system, phase, batch)
            if v is not None:
                xs.append(g + (i - (len(systems) - 1) / 2) * width)
                ys.append(v)
        bars = left.bar(xs, ys, width, label=system, color=COLORS[system])
        left.bar_label(bars, labels=[_short(v) for v in ys], fontsize=7, rotation=90, padding=2)
    left.set_xticks(range(len(groups)), [f"{p}\nbatch {b}" for p, b in groups])
    left.set_yscale("log")
    left.set_ylabel("messages per second (log scale, median)")
    left.set_title("send and receive+ack, one task")
    left.legend(loc="upper left", fontsize=8)
    left.grid(axis="y", which="both", alpha=0.3)
    left.set_ylim(top=left.get_ylim()[1] * 3)

    labels, values, colors = [], [], []

    def add(label: str, value: float | None, system: str) -> None:
        if value is not None:
            labels.append(label)
            values.append(value)
            colors.append(COLORS[system])

    add("fairq send, batch 100", _rate(rows, "fairq", "send", 100), "fairq")
    add("fairq, 16 tasks sending one each", _rate(rows, "fairq", "concurrent send", 1), "fairq")
    for system in ("fairq", "persist-queue", "huey"):
        pc = _rate(rows, system, "producer+consumers", 10)
        add(f"{system} producer+consumers", pc, system)
    add("fairq Worker drain, concurrency 100", _rate(rows, "fairq", "Worker drain", 100), "fairq")
    add("fairq Worker drain, concurrency 16", _rate(rows, "fairq", "Worker drain", 16), "fairq")
    add(
        "fairq receive(100)+ack_batch drain",
        _rate(rows, "fairq", "receive(100)+ack_batch drain", 100),
        "fairq",
    )
    scale = doc.get("scale") or {}
    for key in ("shallow", "deep"):
        phase = f"receive+ack, {key} queue"
        if scale.get(key):
            label = f"fairq receive+ack(100), depth {_short(scale[key][0]['depth'])}"
            add(label, _rate(rows, "fairq", phase, 100), "fairq")
    ys = range(len(values))[::-1]  # the first on top, labels beside their bars
    bars = right.barh(list(ys), values, color=colors)
    right.bar_label(bars, labels=[_short(v) for v in values], fontsize=8, padding=2)
    right.set_yticks(list(ys), labels, fontsize=8)
    right.set_xlabel("messages per second (median)")
    right.set_title("concurrency, producer+consumers, Worker, queue depth")
    right.grid(axis="x", alpha=0.3)
    right.set_xlim(right=right.get_xlim()[1] * 1.12)

    m = doc["machine"]
    cfg = doc["config"]
    fig.suptitle(
        f"fairq queue benchmark — N={cfg['n']:,}, median of {cfg['runs']} runs, "
        f"WAL + synchronous=NORMAL; {m['nproc']} CPU {m['cpu']}, Python {m['python']}, "
        f"SQLite {m['sqlite']}",
        fontsize=10,
    )
    return save(fig, out)


def save(fig: Any, out: Path) -> Path:
    """Lay ``fig`` out, write it to ``out`` as a PNG (the benches' one resolution) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _short(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.3g}M"
    if v >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def main(argv: Sequence[str] | None = None) -> int:
    """Draw the chart; ``argv`` as on the command line."""
    p = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    out = plot(json.loads(a.json.read_text()), a.out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
