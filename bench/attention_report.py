"""The report of ``bench/attention.py``: medians over repeated runs, the table, the
acceptance checks of issue 4 (the same on every engine) and the PNG."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .plot import save

STRATEGIES = {
    "a": "one shared queue",
    "b": "10 grouped queues",
    "c": "polling every store queue",
    "d": "a consumer per store queue",
    "e": "attention queues",
    "e0": "attention, noisy store absent",
    "e4": "attention, noisy store on a 4-slice plan",
    "single": "one backlogged key: attention vs a plain queue consumer",
    "tenants": "tenant A (many keys) vs tenant B (one key)",
    "rate": "a key with rate=50 under 8 workers",
}
SCENARIO = ("a", "b", "c", "d", "e", "e0", "e4")
ENGINE_NAMES = {
    "sqlite": "SQLite",
    "redis": "Redis",
    "postgres": "PostgreSQL",
    "amqp": "RabbitMQ (store: Redis)",
}


def _median(values: list[Any]) -> Any:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums:
        return None
    return statistics.median(nums)


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One strategy's runs as one row: the median of every number (of every figure in
    ``extra`` and ``idle_engine`` too; a ratio measured within each run is the median of
    the runs' ratios), the runs' notes, and the runs' count. A noisy
    store that did not finish in some run counts as not finished (None) when most did not.
    """
    out: dict[str, Any] = {"strategy": runs[0]["strategy"], "runs": len(runs)}
    for r in runs:  # "single" runs its two consumers back to back: a ratio per run
        x = r.get("extra", {})
        if x.get("plain"):
            x["attention/plain"] = x["attention"] / x["plain"]
    for key, value in runs[0].items():
        if key in ("strategy", "notes"):
            continue
        if isinstance(value, list):
            out[key] = value  # the first run's (a sample)
        elif isinstance(value, dict):
            names = {k for r in runs for k in r.get(key, {})}
            out[key] = {k: _median([r.get(key, {}).get(k) for r in runs]) for k in sorted(names)}
        elif key == "noisy_completion":
            done = [r[key] for r in runs if r[key] is not None]
            out[key] = statistics.median(done) if len(done) * 2 > len(runs) else None
        else:
            out[key] = _median([r.get(key) for r in runs])
    out["notes"] = sorted({n for r in runs for n in r.get("notes", [])})
    return out


def checks(by: dict[str, dict[str, Any]], keys: int) -> list[tuple[str, bool]]:
    """Issue 4's acceptance, from the (median) rows by strategy (``keys``: how many keys
    the attention domain holds when it idles)."""
    out: list[tuple[str, bool]] = []
    if "e0" in by and by["e0"]["small_p99"]:
        base = by["e0"]["small_p99"]
        if "e" in by:
            x = by["e"]["small_p99"] / base
            out.append(
                (
                    f"small-store p99 under attention = {x:.2f}x the no-noisy baseline "
                    f"({by['e']['small_p99']:.4f} s vs {base:.4f} s; target <= 3x)",
                    x <= 3,
                )
            )
        if "a" in by:
            x = by["a"]["small_p99"] / base
            out.append(
                (
                    f"small-store p99 under one shared queue = {x:.0f}x the baseline "
                    f"({by['a']['small_p99']:.3f} s; target >= 20x)",
                    x >= 20,
                )
            )
    if "e" in by:
        e = by["e"]
        engine = e.get("idle_engine", {})
        seen = [e["idle_per_store_calls_per_s"]] + [
            v for k, v in engine.items() if "per_store" in k and v is not None
        ]
        extra = "".join(
            f"; {k} {v:.1f}" for k, v in engine.items() if k != "seconds" and v is not None
        )
        reconciles = e.get("idle_methods", {}).get("attention_reconcile", 0.0) * engine.get(
            "seconds", 0.0
        )
        extra += f"; reconciler runs in the {engine.get('seconds', 0):.0f} s: {reconciles:.0f}"
        if engine.get("redis_per_store_commands_per_s") is not None:
            per_key = engine["redis_per_store_commands_per_s"] / keys
            extra += f" ({per_key:.3f} commands per idle key per s)"
        out.append(
            (
                f"idle attention: {e['idle_per_store_calls_per_s']:.0f} backend calls/s touch "
                f"per-store queues (target 0){extra}",
                all(v == 0 for v in seen),
            )
        )
    if "c" in by:
        out.append(
            (
                f"idle polling: {by['c']['idle_per_store_calls_per_s']:.0f} calls/s touch "
                "per-store queues (thousands expected)",
                by["c"]["idle_per_store_calls_per_s"] > 1000,
            )
        )
    if "single" in by:
        x = by["single"]["extra"]
        ratio = x.get("attention/plain", x["attention"] / x["plain"])
        out.append(
            (
                f"one backlogged key: attention {x['attention']:,.0f} msgs/s vs plain queue "
                f"consumer {x['plain']:,.0f} msgs/s: {ratio:.0%} (target >= 80%)",
                ratio >= 0.8,
            )
        )
    if "tenants" in by:
        x = by["tenants"]["extra"]
        out.append(
            (
                f"tenants: B (1 key) {x['B']:.0f} vs A (many keys) {x['A']:.0f} messages, "
                f"B/A = {x['B/A']:.2f} (target 0.8-1.2)",
                0.8 <= x["B/A"] <= 1.2,
            )
        )
    if "rate" in by:
        x = by["rate"]["extra"]
        out.append(
            (
                f"rate=50: {x['handled']:.0f} handled (expected {x['expected']:.0f}), "
                f"{x['per_s']:.1f}/s beyond the burst (target 50 ± 5%); "
                f"{x['takes_per_s']:.1f} takes/s, {x['calls_per_s']:.0f} backend calls/s",
                abs(x["per_s"] - 50) <= 2.5,
            )
        )
    return out


def _in_order(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scenario's strategies among ``results``, in the order a, b, c, d, e, e0, e4."""
    rows = [r for r in results if r["strategy"] in SCENARIO]
    return sorted(rows, key=lambda r: SCENARIO.index(r["strategy"]))


def table(doc: dict[str, Any]) -> Any:
    """A rich table of the scenario's strategies (medians)."""
    from rich.table import Table

    sc = doc["scenario"]
    engine = ENGINE_NAMES.get(doc.get("backend", "sqlite"), doc.get("backend"))
    t = Table(
        title=f"attention strategies on {engine} — {sc['stores']:,} stores, "
        f"{sc['noisy_jobs']:,} noisy jobs, {sc['small_stores']:,}×{sc['jobs_per_small']} small "
        f"jobs over {sc['window']:g} s, {sc['workers']} workers, "
        f"{sc['job_seconds'] * 1000:g} ms per job; medians of each strategy's runs"
    )
    cols = (
        "strategy",
        "runs",
        "small p50 s",
        "small p99 s",
        "noisy done at s",
        "fairness",
        "idle calls/s",
        "idle per-store/s",
        "idle checks/s",
        "engine, idle",
        "peak RSS MB",
        "notes",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("strategy", "notes") else "right")
    for r in _in_order(doc["results"]):
        eng = r.get("idle_engine") or {}
        t.add_row(
            f"{r['strategy']} {STRATEGIES[r['strategy']]}",
            str(r.get("runs", 1)),
            f"{r['small_p50']:.4f}",
            f"{r['small_p99']:.4f}",
            "-" if r["noisy_completion"] is None else f"{r['noisy_completion']:.1f}",
            "-" if r["fairness"] is None else f"{r['fairness']:.2f}",
            f"{r['idle_calls_per_s']:.0f}",
            f"{r['idle_per_store_calls_per_s']:.0f}",
            f"{r['idle_checks_per_s']:.0f}",
            " ".join(
                f"{k.split('_', 1)[1].removesuffix('_per_s')}/s={v:.0f}"
                for k, v in eng.items()
                if k != "seconds" and v is not None
            ),
            f"{r['peak_rss_mb']:.0f}",
            "; ".join(r["notes"]),
        )
    return t


_ENGINE_SEEN = {
    "redis": "Redis commands/s naming a per-store key (MONITOR)",
    "postgres": "statements/s naming a per-store queue",
    "amqp": "AMQP methods + RabbitMQ queue ops + store commands/s on per-store queues",
}


def _engine_per_store(r: dict[str, Any]) -> float | None:
    """What the engine saw touching per-store queues while idle (RabbitMQ: its per-store
    queues' operations, the AMQP methods naming one and the store's commands, summed)."""
    eng = r.get("idle_engine") or {}
    seen = [float(v) for k, v in eng.items() if "per_store" in k and v is not None]
    return sum(seen) if seen else None


def png_path(docs: Path, backend: str, scale_as: str | None = None) -> Path:
    name = "bench-attention" if backend == "sqlite" else f"bench-attention-{backend}"
    if scale_as and scale_as != backend:
        name = f"bench-attention-{backend}-as-{scale_as}"
    return docs / f"{name}.png"


def plot(doc: dict[str, Any], out: Path) -> Path:
    """Three panels per strategy: small stores' p99 wait, the noisy store's completion time,
    and the calls per second touching per-store queues when everything is idle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _in_order(doc["results"])
    labels = [f"{r['strategy']}\n{STRATEGIES[r['strategy']]}" for r in rows]
    colors = ["#1f77b4" if r["strategy"].startswith("e") else "#9e9e9e" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.6))

    def done(r: dict[str, Any]) -> str:
        if r["noisy_completion"] is not None:
            return f"{r['noisy_completion']:.3g}"
        return "-" if r["strategy"] == "e0" else "did not finish"

    panels = [
        (
            "small stores' p99 wait (s, log)",
            [max(r["small_p99"], 1e-4) for r in rows],
            True,
            [f"{r['small_p99']:.3g}" for r in rows],
        ),
        (
            "noisy store done after (s)",
            [r["noisy_completion"] or 0 for r in rows],
            False,
            [done(r) for r in rows],
        ),
        (
            "idle: calls/s touching per-store queues (backend calls; log, 0 drawn at 0.1)",
            [max(r["idle_per_store_calls_per_s"], 0.1) for r in rows],
            True,
            [f"{r['idle_per_store_calls_per_s']:.3g}" for r in rows],
        ),
    ]
    for ax, (title, values, log, texts) in zip(axes, panels, strict=True):
        bars = ax.bar(range(len(rows)), values, color=colors)
        ax.bar_label(bars, labels=texts, fontsize=7, padding=2)
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=35, ha="right")
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
    seen = [_engine_per_store(r) for r in rows]
    if any(v is not None for v in seen):  # the engine's own count beside the calls
        ax = axes[2]
        xs = [i + 0.3 for i, v in enumerate(seen) if v is not None]
        vs = [max(v, 0.1) for v in seen if v is not None]
        b = ax.bar(xs, vs, 0.3, color="#ff7f0e", label=_ENGINE_SEEN.get(doc.get("backend"), ""))
        ax.bar_label(b, labels=[f"{v:.3g}" for v in seen if v is not None], fontsize=6)
        ax.legend(fontsize=7)
    sc = doc["scenario"]
    engine = ENGINE_NAMES.get(doc.get("backend", "sqlite"), "SQLite")
    fig.suptitle(
        f"{sc['stores']:,} stores; store 0 dumps {sc['noisy_jobs']:,} jobs; "
        f"{sc['small_stores']:,} stores x {sc['jobs_per_small']} jobs over {sc['window']:g} s; "
        f"{sc['workers']} workers, {sc['job_seconds'] * 1000:g} ms/job ({engine}; medians "
        f"of {'/'.join(sorted({str(r.get('runs', 1)) for r in rows}))} runs)",
        fontsize=10,
    )
    return save(fig, out)


def markdown(doc: dict[str, Any]) -> str:
    """Issue 4's acceptance as a Markdown table (figure, measured, target, holds) for
    docs/benchmarks.md, from a results document's median rows."""
    by = {r["strategy"]: r for r in doc["results"]}
    rows: list[tuple[str, str, str, str]] = []

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    def ms(x: float) -> str:
        return f"{x * 1000:,.1f} ms" if x < 1 else f"{x:,.2f} s"

    def runs(*names: str) -> str:
        n = sorted({int(by[k].get("runs", 1)) for k in names if k in by})
        return " (1 run)" if n == [1] else f" (median of {'/'.join(map(str, n))} runs)"

    e, e0, a = by.get("e"), by.get("e0"), by.get("a")
    if e and e0:
        x = e["small_p99"] / e0["small_p99"]
        rows.append(
            (
                "small stores' p99 wait: attention / noisy store absent" + runs("e", "e0"),
                f"{ms(e['small_p99'])} / {ms(e0['small_p99'])} = **{x:.2f}x**",
                "≤ 3x",
                yes(x <= 3),
            )
        )
    if a and e0:
        x = a["small_p99"] / e0["small_p99"]
        rows.append(
            (
                "small stores' p99 wait: one shared queue / noisy store absent" + runs("a"),
                f"{ms(a['small_p99'])} / {ms(e0['small_p99'])} = **{x:,.0f}x**",
                "≥ 20x",
                yes(x >= 20),
            )
        )
    if e:
        eng = e.get("idle_engine", {})
        rows.append(
            (
                "idle attention: backend calls/s touching per-store queues",
                f"**{e['idle_per_store_calls_per_s']:.0f}** (all calls: "
                f"{e['idle_calls_per_s']:.1f}/s)",
                "0",
                yes(e["idle_per_store_calls_per_s"] == 0),
            )
        )
        keys = doc["scenario"]["small_stores"] + 1
        if eng.get("amqp_methods_per_s") is not None:
            per = eng["amqp_per_store_methods_per_s"]
            rows.append(
                (
                    f"idle attention, AMQP methods sent over {eng['seconds']:.1f} s "
                    "(aiormq's channel methods)",
                    f"{eng['amqp_methods_per_s']:.1f}/s, of them **{per:.1f}/s** naming a "
                    "per-store queue",
                    "0 per-store",
                    yes(per == 0),
                )
            )
            per = eng["rabbitmq_per_store_ops_per_s"]
            rows.append(
                (
                    "idle attention, RabbitMQ's counters (management API, vhost): "
                    "`basic.get`s, publishes, per-store queues' gets + deliveries + publishes",
                    f"{eng['rabbitmq_gets_per_s']:.1f}/s, {eng['rabbitmq_publishes_per_s']:.1f}/s, "
                    f"**{per:.1f}/s**",
                    "0 per-store",
                    yes(per == 0),
                )
            )
        if eng.get("redis_commands_per_s") is not None:
            per = eng["redis_per_store_commands_per_s"]
            whose = "the store's Redis, " if doc.get("backend") == "amqp" else ""
            rows.append(
                (
                    f"idle attention, {whose}`INFO commandstats` / `MONITOR` over "
                    f"{eng['seconds']:.1f} s",
                    f"{eng['redis_commands_per_s']:.1f} commands/s, of them {per:.1f}/s on "
                    f"per-store keys = **{per / keys:.3f} per idle key per s**",
                    "0 per idle key",
                    yes(per == 0),
                )
            )
        if eng.get("pg_statements_per_s") is not None:
            per = eng["pg_per_store_statements_per_s"]
            rows.append(
                (
                    f"idle attention, statements sent over {eng['seconds']:.1f} s",
                    f"{eng['pg_statements_per_s']:.1f}/s, of them **{per:.1f}/s** naming a "
                    "per-store queue",
                    "0 per-store",
                    yes(per == 0),
                )
            )
    for k, what in (("c", "polling every store queue"), ("d", "a consumer per store queue")):
        if k in by:
            rows.append(
                (
                    f"idle {what}: calls/s touching per-store queues" + runs(k),
                    f"{by[k]['idle_per_store_calls_per_s']:,.0f}",
                    "thousands (c)" if k == "c" else "reported",
                    yes(by[k]["idle_per_store_calls_per_s"] > 1000) if k == "c" else "",
                )
            )
    if "tenants" in by:
        x = by["tenants"]["extra"]
        busy = (
            f" (worker time, the domain's tenant stats: {x['busy B']:.1f} / {x['busy A']:.1f} s "
            f"= {x['busy B/A']:.2f})"
            if x.get("busy B/A") is not None
            else ""
        )
        rows.append(
            (
                "tenant B (1 key) / tenant A (many keys), messages" + runs("tenants"),
                f"{x['B']:,.0f} / {x['A']:,.0f}; ratio **{x['B/A']:.2f}**{busy}",
                "0.8-1.2",
                yes(0.8 <= x["B/A"] <= 1.2),
            )
        )
    if "rate" in by:
        x = by["rate"]["extra"]
        rows.append(
            (
                "rate=50 key, 8 workers: msgs/s beyond the burst" + runs("rate"),
                f"**{x['per_s']:.1f}/s**, {x['takes_per_s']:.1f} takes/s, "
                f"{x['calls_per_s']:.0f} backend calls/s",
                "50 ± 5 %, no spinning",
                yes(abs(x["per_s"] - 50) <= 2.5),
            )
        )
    if "single" in by:
        x = by["single"]["extra"]
        r = x.get("attention/plain", x["attention"] / x["plain"])
        rows.append(
            (
                "one backlogged key: attention / plain queue consumer" + runs("single"),
                f"{x['attention']:,.0f} / {x['plain']:,.0f} msgs/s; ratio **{r:.0%}**",
                "≥ 80 %",
                yes(r >= 0.8),
            )
        )
    out = ["| figure | measured | target | holds |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(out)
