"""``/metrics``: Prometheus text format (prometheus-client).

A custom collector turns stats read fresh at each scrape into metric families:

* per queue: gauges ``fairq_queue_visible``, ``_in_flight``, ``_delayed``,
  ``_oldest_age_seconds``, ``_freshness_slo_seconds`` and ``_freshness_breach`` (1 while
  the oldest message is older than the SLO), counters ``fairq_queue_sent_total``,
  ``_acked_total``, ``_nacked_total``, ``_redelivered_total``, ``_dead_lettered_total``,
  ``_expired_total``, ``_discarded_total``;
* per topic: ``fairq_topic_published_total``, ``_copies_total``, ``_unmatched_total``,
  gauge ``fairq_topic_subscriptions``;
* per attention domain: gauges ``fairq_attention_keys``, ``_signals_pending``,
  ``_slices``, counters ``fairq_attention_processed_total``, ``_republished_total``,
  ``_blocked_total``, ``_rate_limited_total``, ``_empty_total``, ``_parked_total``,
  ``_reconciled_total``, ``_discarded_total{state}``; per tenant over the last minute, for
  the ``TOP_TENANTS`` tenants of each domain with the largest worker-time share (label
  values stay few however many tenants there are): gauges
  ``fairq_attention_tenant_share{domain,tenant}``, ``_tenant_slices``,
  ``_tenant_messages``, ``_tenant_backlog``, ``_tenant_at_cap``; and per domain
  ``fairq_attention_tenants_at_cap`` (over the tenants read);
* per waiting room: gauges ``fairq_room_waiting``, ``_pre_queue``, ``_active``,
  ``_admit_rate``, ``_measured_rate``, ``_sold_out``, counters ``fairq_room_joined_total``,
  ``_admitted_total``, ``_used_total``, ``_expired_total``;
* the server: histogram ``fairq_http_request_duration_seconds{method,route,status}``
  (``route`` is the route template, so label values stay few).

The registry is the app's own, never prometheus-client's global one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..broker import Broker
from ..errors import Unsupported
from ..model.attention import ATTENTION_COUNTERS, AttentionStats, TenantStats
from ..model.queues import QUEUE_COUNTERS, QueueStats
from ..pubsub import TopicStats
from ..waitingroom import RoomStats
from .middleware import Receive, Scope, Send
from .sampler import room_stats

__all__ = ["CONTENT_TYPE", "Metrics", "RequestTimer"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: tenants per domain with gauges of their own (by worker-time share): label cardinality
TOP_TENANTS = 10
#: tenants read per domain to count those at their cap
_TENANTS_READ = 1000


@dataclass(slots=True)
class Readings:
    """Stats read for one scrape."""

    queues: dict[str, QueueStats] = field(default_factory=dict)
    queues_total: int = 0  # every queue; ``queues`` holds those sampled (Sampler.order)
    topics: dict[str, TopicStats] = field(default_factory=dict)
    attention: dict[str, AttentionStats] = field(default_factory=dict)
    tenants: dict[str, list[TenantStats]] = field(default_factory=dict)
    rooms: list[RoomStats] = field(default_factory=list)


class StatsCollector(Collector):
    """Yields the metric families of the readings taken just before the scrape."""

    def __init__(self) -> None:
        self.readings = Readings()

    def collect(self) -> Iterable[Metric]:
        r = self.readings
        gauges = {
            name: GaugeMetricFamily(f"fairq_queue_{name}", text, labels=["queue"])
            for name, text in (
                ("visible", "Messages a receiver could take now"),
                ("in_flight", "Messages leased and not yet acked"),
                ("delayed", "Messages waiting for their delay or nack delay"),
                ("oldest_age_seconds", "Age of the oldest message not yet acked"),
                ("freshness_slo_seconds", "The queue's freshness SLO (queues that set one)"),
                ("freshness_breach", "1 while oldest_age exceeds the freshness SLO"),
            )
        }
        counters = {
            name: CounterMetricFamily(
                f"fairq_queue_{name}", f"Messages {name.replace('_', ' ')}", labels=["queue"]
            )
            for name in QUEUE_COUNTERS
        }
        for queue, s in r.queues.items():
            gauges["visible"].add_metric([queue], s.visible)
            gauges["in_flight"].add_metric([queue], s.in_flight)
            gauges["delayed"].add_metric([queue], s.delayed)
            gauges["oldest_age_seconds"].add_metric([queue], s.oldest_age)
            gauges["freshness_breach"].add_metric([queue], 1.0 if s.breaching else 0.0)
            if s.freshness_slo is not None:
                gauges["freshness_slo_seconds"].add_metric([queue], s.freshness_slo)
            for name in QUEUE_COUNTERS:
                counters[name].add_metric([queue], getattr(s, name))
        yield from gauges.values()
        yield from counters.values()
        total = GaugeMetricFamily("fairq_queues", "Queues that exist")
        total.add_metric([], r.queues_total)
        read = GaugeMetricFamily(
            "fairq_queues_read",
            "Queues with series here (up to the server's max_queues: applications' queues "
            "with their dead-letter queues, then attention work queues)",
        )
        read.add_metric([], len(r.queues))
        yield total
        yield read

        topic = {
            n: CounterMetricFamily(f"fairq_topic_{n}", text, labels=["topic"])
            for n, text in (
                ("published", "Messages published"),
                ("copies", "Copies stored in subscriptions"),
                ("unmatched", "Publishes no subscription matched"),
            )
        }
        subs = GaugeMetricFamily("fairq_topic_subscriptions", "Subscriptions", labels=["topic"])
        for name, t in r.topics.items():
            for n, family in topic.items():
                family.add_metric([name], getattr(t, n))
            subs.add_metric([name], t.subscriptions)
        yield from topic.values()
        yield subs

        a_gauges = {
            n: GaugeMetricFamily(f"fairq_attention_{n}", text, labels=["domain"])
            for n, text in (
                ("keys", "Keys of the domain"),
                ("signals_pending", "Signals waiting in the attention queue"),
                ("slices", "Slices running now"),
            )
        }
        a_counters = {
            n: CounterMetricFamily(
                f"fairq_attention_{n}", f"Attention {n.replace('_', ' ')}", labels=["domain"]
            )
            for n in ATTENTION_COUNTERS
        }
        discarded = CounterMetricFamily(
            "fairq_attention_discarded",
            "Signals dropped for a key's state",
            labels=["domain", "state"],
        )
        for domain, a in r.attention.items():
            a_gauges["keys"].add_metric([domain], a.keys)
            a_gauges["signals_pending"].add_metric([domain], a.signals_pending)
            a_gauges["slices"].add_metric([domain], a.slices)
            for n in ATTENTION_COUNTERS:
                a_counters[n].add_metric([domain], getattr(a, n))
            for state, count in sorted(a.discarded.items()):
                discarded.add_metric([domain, state], count)
        yield from a_gauges.values()
        yield from a_counters.values()
        yield discarded
        yield from self._tenants(r)

        room_gauges = {
            n: GaugeMetricFamily(f"fairq_room_{n}", text, labels=["room"])
            for n, text in (
                ("waiting", "Fans in line (after the draw)"),
                ("pre_queue", "Fans waiting for the opening draw"),
                ("active", "Admitted fans holding a live, unused token"),
                ("admit_rate", "Admissions per second the room is set to"),
                ("measured_rate", "Admissions per second measured over ~10 s"),
                ("sold_out", "1 once the room sold out"),
            )
        }
        room_counters = {
            n: CounterMetricFamily(f"fairq_room_{n}", f"Fans {n}", labels=["room"])
            for n in ("joined", "admitted", "used", "expired")
        }
        for room in r.rooms:
            for n, gauge in room_gauges.items():
                value = room.sold_out if n == "sold_out" else getattr(room, n)
                gauge.add_metric([room.name], float(value))
            for n, counter in room_counters.items():
                counter.add_metric([room.name], getattr(room, n))
        yield from room_gauges.values()
        yield from room_counters.values()

    def _tenants(self, r: Readings) -> Iterable[Metric]:
        labels = ["domain", "tenant"]
        gauges = {
            n: GaugeMetricFamily(f"fairq_attention_tenant_{n}", text, labels=labels)
            for n, text in (
                ("share", "Fraction of the domain's worker time used by the tenant, last minute"),
                ("slices", "Slices of the tenant that ended in the last minute"),
                ("messages", "Messages its slices handled in the last minute"),
                ("backlog", "Visible messages in the tenant's active keys"),
                ("at_cap", "1 while every backlogged key of the tenant runs max_concurrency"),
            )
        }
        at_cap = GaugeMetricFamily(
            "fairq_attention_tenants_at_cap",
            "Tenants whose backlogged keys all run max_concurrency slices",
            labels=["domain"],
        )
        for domain, tenants in r.tenants.items():
            at_cap.add_metric([domain], sum(t.at_cap for t in tenants))
            for t in tenants[:TOP_TENANTS]:
                for n, gauge in gauges.items():
                    gauge.add_metric([domain, t.tenant], float(getattr(t, n)))
        yield from gauges.values()
        yield at_cap


class Metrics:
    """The app's registry: the request histogram and the stats collector."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Histogram(
            "fairq_http_request_duration_seconds",
            "Time to answer an HTTP request (streams excluded)",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.stats = StatsCollector()
        self.registry.register(self.stats)

    async def read(
        self, broker: Broker, queues: dict[str, QueueStats], queues_total: int
    ) -> Readings:
        """Fresh readings of topics and attention domains beside ``queues`` (of
        ``queues_total``)."""
        r = Readings(queues=queues, queues_total=queues_total)
        for name in await broker.list_topics():
            try:
                r.topics[name] = await broker.topic(name).stats()
            except LookupError:
                continue
        for name in await broker.list_attention():
            a = broker.attention(name)
            try:
                r.attention[name] = await a.stats()
                r.tenants[name] = await a.tenant_stats(top=_TENANTS_READ)
            except LookupError:
                continue
            except Unsupported:  # an engine without per-tenant usage yet
                pass
        r.rooms = await room_stats(broker)
        return r

    def render(self, readings: Readings) -> bytes:
        """The text exposition with ``readings`` (no await in between: scrapes never mix)."""
        self.stats.readings = readings
        try:
            return generate_latest(self.registry)
        finally:
            self.stats.readings = Readings()


class RequestTimer:
    """ASGI middleware timing every request into the histogram, labelled with the route
    template a handler put in ``scope["fairq.route"]`` (streams set ``fairq.stream``)."""

    def __init__(self, app: object, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # type: ignore[operator]
            return
        start = time.perf_counter()
        status = 500

        async def timed_send(message: dict[str, object]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])  # type: ignore[call-overload]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)  # type: ignore[operator]
        finally:
            if not scope.get("fairq.stream"):
                route = scope.get("fairq.route") or _other(scope["path"])
                method = scope["method"]
                if method not in _METHODS:  # a client's made-up method: no series of its own
                    method = "other"
                self.metrics.requests.labels(method, route, str(status)).observe(
                    time.perf_counter() - start
                )


#: the methods that get a label value of their own; any other is "other" (a label value a
#: client chooses would let it add series without end)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _other(path: str) -> str:
    if path in ("/metrics", "/healthz", "/openapi.json", "/", "/login", "/logout"):
        return path
    if path.startswith("/static/"):
        return "/static"
    return "other"
