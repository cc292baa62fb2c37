"""The driver's Prometheus metrics (served at GET /metrics), in a registry of their own."""

from __future__ import annotations

import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from elasticrun.system.outsiders import refusal_counter

# Rendezvous and recovery take milliseconds to seconds; a stuck host can take minutes.
_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
HOST_STATES = ("active", "starting", "leaving", "idle", "draining", "drained", "blacklisted")
CONTENT_TYPE = CONTENT_TYPE_LATEST


class DriverMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series: they double the output for nothing
        self.registry = CollectorRegistry()
        r = self.registry
        self.rounds = Counter("elasticrun_rounds", "Rounds opened.", registry=r)
        self.resets = Counter("elasticrun_resets", "Rounds opened after the first.", registry=r)
        self.restarts = Counter(
            "elasticrun_restarts", "Restarts counted against --max-restarts: rounds of "
            "scripts that never call er.init() restarted whole after a failure, and jobs "
            "restarted from a kept commit after losing every worker.", registry=r)
        self.worker_failures = Counter(
            "elasticrun_worker_failures", "Workers that failed, by cause.", ["cause"], registry=r)
        self.hosts_blacklisted = Counter(
            "elasticrun_hosts_blacklisted", "Times a host was blacklisted.", registry=r)
        self.slots_blacklisted = Counter(
            "elasticrun_slots_blacklisted", "Times a slot (one local rank of a host) was "
            "blacklisted alone.", registry=r)
        self.discovery_errors = Counter(
            "elasticrun_discovery_errors", "Discovery calls that failed or timed out.",
            registry=r)
        self.world_size = Gauge("elasticrun_world_size", "Ranks in the current round.",
                                registry=r)
        self.round = Gauge("elasticrun_round", "Number of the current round.", registry=r)
        self.hosts = Gauge("elasticrun_hosts", "Known hosts, by state.", ["state"], registry=r)
        self.rendezvous_seconds = Histogram(
            "elasticrun_rendezvous_seconds",
            "From opening a round until every member has checked in.",
            buckets=_SECONDS_BUCKETS, registry=r)
        self.recovery_seconds = Histogram(
            "elasticrun_recovery_seconds",
            "From detecting a failure until the next round is complete.",
            buckets=_SECONDS_BUCKETS, registry=r)
        self.discovery_seconds = Histogram(
            "elasticrun_discovery_seconds", "Duration of one discovery call.",
            buckets=_SECONDS_BUCKETS, registry=r)
        self.worker_slowdown = Gauge(
            "elasticrun_worker_slowdown", "Each member's time outside collectives over its "
            "peers' median, at the latest pace tick (1: keeps pace; 5: holds the others up "
            "five times over).", ["rank", "host"], registry=r)
        self.stragglers = Counter(
            "elasticrun_stragglers", "Members named stragglers, by what was done: reported, "
            "evicted, kept (evict asked, but --min-np or no gain kept it).", ["action"],
            registry=r)
        self.events_dropped = Gauge(
            "elasticrun_events_dropped", "Events that could not be delivered to a webhook.",
            registry=r)
        self.refused_requests = refusal_counter(r)  # elasticrun_refused_requests_total{kind}
        started = time.time()
        Gauge("elasticrun_start_time_seconds", "Unix time the driver started.",
              registry=r).set(started)
        for state in HOST_STATES:
            self.hosts.labels(state).set(0)

    def set_host_states(self, counts: dict[str, int]) -> None:
        for state in HOST_STATES:
            self.hosts.labels(state).set(counts.get(state, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)

