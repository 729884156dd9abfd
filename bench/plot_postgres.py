"""Draw ``bench/results/queues-postgres.json`` as ``docs/bench-postgres.png``: messages per
second per system and phase (log scale), and the steady-rate latencies.

    python -m bench.plot_postgres
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "queues-postgres.json"
PNG = ROOT / "docs" / "bench-postgres.png"


def plot(doc: dict[str, Any], path: Path = PNG) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["results"]
    phases = [
        p
        for p in ("send", "receive+ack", "end to end", "worker")
        if any(r["phase"] == p for r in rows)
    ]
    systems = list(dict.fromkeys(r["system"] for r in rows if r["phase"] in phases))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1.3]})
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, ys = [], []
        for j, phase in enumerate(phases):
            hit = [r for r in rows if r["system"] == system and r["phase"] == phase]
            if hit:
                xs.append(j + i * width)
                ys.append(hit[0]["msgs_per_s"])
        a.bar(xs, ys, width, label=system)
    a.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(phases))], phases)
    a.set_yscale("log")
    a.set_ylabel("messages / s (log)")
    a.set_title(f"PostgreSQL, N={doc['n']:,}, batches of {doc['batch']}, median of {doc['runs']}")
    a.legend(fontsize=8)
    lat = [r for r in rows if r["phase"] == "latency" and r.get("p50_ms") is not None]
    names = [r["system"] for r in lat]
    b.bar([k - 0.2 for k in range(len(lat))], [r["p50_ms"] for r in lat], 0.4, label="p50")
    b.bar([k + 0.2 for k in range(len(lat))], [r["p99_ms"] for r in lat], 0.4, label="p99")
    b.set_xticks(range(len(lat)), names, rotation=15, fontsize=8)
    b.set_yscale("log")
    b.set_ylabel("ms (log)")
    b.set_title(f"latency at {doc['rate']:g} msgs/s")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    print(plot(json.loads(RESULTS.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
