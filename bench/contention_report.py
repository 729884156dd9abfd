"""The report of ``bench/contention.py``: the acceptance checks of issue 16 and the PNG
(every labelled run of ``bench/results/attention-contention.json`` side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plot import save

WORKERS = 4  # worker slots of every scenario
BURSTS = {  # the burst's result names -> (cross-process publisher, one shared queue)
    "burst_in_process": (False, False),
    "burst_cross_process": (True, False),
    "burst_shared_queue": (True, True),
}


def checks(r: dict[str, Any]) -> list[tuple[str, bool]]:
    out = []
    if "shares" in r:
        x = r["shares"]
        ratio = x.get("worker_B_per_A", x.get("handler_B_per_A", 0.0))
        out.append(
            (
                f"shares: worker time B/A = {ratio:.2f} (target 0.8-1.25); messages B/A = "
                f"{x['messages_B_per_A']:.2f}",
                0.8 <= ratio <= 1.25,
            )
        )
    if "shares_messages" in r:
        x = r["shares_messages"]
        out.append(
            (
                f"shares, charge='messages': messages B/A = {x['messages_B_per_A']:.2f} "
                "(target 0.8-1.25)",
                0.8 <= x["messages_B_per_A"] <= 1.25,
            )
        )
    if "capped" in r:
        x = r["capped"]
        frac = x.get("A_at_cap_fraction")
        out.append(
            (
                f"capped: A's share {x['share_A']:.2f} (one worker of 4: 0.25), B the rest; "
                f"stats say A at cap in {0 if frac is None else frac:.0%} of samples",
                abs(x["share_A"] - 0.25) <= 0.05 and (frac or 0) >= 0.9,
            )
        )
    if "rate2" in r:
        x = r["rate2"]
        out.append(
            (
                f"rate=20, burst=1, 2 processes x 2: {x['takes_per_message']:.2f} take attempts "
                f"per message (target <= 1.5), {x['rate']:.2f}/s (target 20 ± 5 %)",
                x["takes_per_message"] <= 1.5 and abs(x["rate"] - 20) <= 1.0,
            )
        )
    if "chaos_attention" in r and "chaos_queue" in r:
        a, q = r["chaos_attention"], r["chaos_queue"]
        ratio = a["redelivered_per_kill"] / max(1e-9, q["redelivered_per_kill"])
        out.append(
            (
                f"chaos: {a['redelivered_per_kill']:.1f} delivered again per killed attention "
                f"worker vs {q['redelivered_per_kill']:.1f} per killed queue consumer = "
                f"{ratio:.2f}x (target <= 2); lease-lost warnings {a['lease_lost_warnings']} "
                f"and {q['lease_lost_warnings']} (target 0)",
                ratio <= 2 and a["lease_lost_warnings"] == 0 and q["lease_lost_warnings"] == 0,
            )
        )
    if "burst_in_process" in r and "burst_cross_process" in r:
        i, c = r["burst_in_process"], r["burst_cross_process"]
        x = c["p99_s"] / max(1e-9, i["p99_s"])
        out.append(
            (
                f"burst: small keys' p99 wait {c['p99_s']:.3f} s with the publisher in another "
                f"process = {x:.2f}x the {i['p99_s']:.3f} s with it in the workers' process "
                "(target <= 3x)",
                x <= 3,
            )
        )
    if "burst_shared_queue" in r and "burst_cross_process" in r:
        q, c = r["burst_shared_queue"], r["burst_cross_process"]
        x = q["p99_s"] / max(1e-9, c["p99_s"])
        out.append(
            (
                f"burst: one shared queue's small-key p99 {q['p99_s']:.3f} s = {x:.0f}x "
                f"attention's {c['p99_s']:.3f} s, both with the publisher in another process "
                "(target >= 20x)",
                x >= 20,
            )
        )
    return out


def plot(doc: dict[str, Any], out: Path) -> Path:
    """Panels: worker-time share of A and B (fan-out, capped), take attempts per message,
    messages delivered again per kill, the burst's p99 waits; each run of the document
    (before / after) side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(doc["runs"], key=lambda r: not r["label"].startswith("before"))
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.8))
    labels = [r["label"] for r in runs]
    palette = ["#9e9e9e", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    colors = [palette[i % len(palette)] for i in range(len(runs))]  # any number of runs

    def bars(
        ax: Any, title: str, groups: list[str], values: list[list[float] | None], fmt: str
    ) -> None:
        """One bar per group for each run that measured it (None: the run did not)."""
        drawn = [(i, v) for i, v in enumerate(values) if v is not None]
        width = 0.8 / max(1, len(drawn))
        for j, (i, vals) in enumerate(drawn):
            xs = [g + (j - (len(drawn) - 1) / 2) * width for g in range(len(groups))]
            b = ax.bar(xs, vals, width, label=labels[i], color=colors[i])
            ax.bar_label(b, labels=[fmt.format(v) for v in vals], fontsize=7, padding=2)
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)

    def share(r: dict[str, Any], key: str) -> list[float] | None:
        x = r["results"].get(key)
        if not x:
            return None
        return [x["share_A"], 1 - x["share_A"]]

    bars(
        axes[0],
        "fan-out plan: share of worker time",
        ["A (1 deep key)", "B (2,000 keys)"],
        [share(r, "shares") for r in runs],
        "{:.2f}",
    )
    axes[0].axhline(0.5, color="#444", lw=0.8, ls="--")
    bars(
        axes[1],
        "A capped at 1 slice: share of worker time",
        ["A", "B"],
        [share(r, "capped") for r in runs],
        "{:.2f}",
    )
    axes[1].axhline(0.25, color="#444", lw=0.8, ls="--")
    bars(
        axes[2],
        "rate=20, burst=1, 2 processes: take attempts per message",
        ["attempts"],
        [
            [r["results"]["rate2"]["takes_per_message"]] if "rate2" in r["results"] else None
            for r in runs
        ],
        "{:.2f}",
    )
    axes[2].axhline(1.5, color="#c00", lw=0.8, ls="--")

    def again(r: dict[str, Any]) -> list[float] | None:
        res = r["results"]
        keys = ("chaos_attention", "chaos_queue")
        if not all(k in res for k in keys):
            return None
        return [res[k]["redelivered_per_kill"] for k in keys]

    bars(
        axes[3],
        "kill -9: messages delivered again per kill",
        ["attention", "queue consumer"],
        [again(r) for r in runs],
        "{:.1f}",
    )

    def waits(r: dict[str, Any]) -> list[float] | None:
        if "burst_cross_process" not in r["results"]:
            return None
        return [max(1e-3, (r["results"].get(k) or {}).get("p99_s") or 0.0) for k in BURSTS]

    bars(
        axes[4],
        "burst: small keys' p99 wait (s, log; not measured: 0.001)",
        ["attention,\nin-process", "attention,\nother process", "shared queue,\nother process"],
        [waits(r) for r in runs],
        "{:.3g}",
    )
    axes[4].set_yscale("log")
    fig.suptitle(
        "attention under contention (SQLite; publisher in its own process; "
        f"{WORKERS} workers, 1 ms handlers)",
        fontsize=10,
    )
    return save(fig, out)
