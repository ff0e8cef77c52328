//! The DHCP server's Prometheus metrics.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::engine::{Ignored, PoolStats};

#[derive(Clone)]
pub struct DhcpMetrics {
    pub received: IntCounterVec,
    pub sent: IntCounterVec,
    pub dropped: IntCounterVec,
    pub reply_seconds: HistogramVec,
    pub pool_addresses: IntGaugeVec,
    pub leases: IntGauge,
    /// DHCPv6 addresses by state: total (pools and reservations), leased,
    /// declined.
    pub addresses6: IntGaugeVec,
    pub in_flight: IntGauge,
    pub commit_seconds: Histogram,
    pub batch_size: Histogram,
    pub store_errors: IntCounter,
    pub store_failures: IntCounterVec,
    pub store_healthy: IntGauge,
    pub compactions: IntCounter,
    pub compaction_failures: IntCounter,
    pub corrupt_lines: IntCounter,
    pub clock_behind: IntGauge,
    pub clock_wall_offset: IntGauge,
    pub changes_undone: IntCounter,
}

/// The `error` label of `causeway_dhcp_store_failures_total`: every cause
/// the store names (its tests hold it to this list).
pub(crate) const STORE_FAILURE_CAUSES: [&str; 5] =
    ["no_space", "io", "too_many_files", "quota", "other"];

/// Drops an operator is alerted to (docs/operations.md).
const ALERTED_DROPS: [Ignored; 6] = [
    Ignored::RateLimited,
    Ignored::RateLimitedRelay,
    Ignored::RateLimitedSubnet,
    Ignored::RateLimitedGlobal,
    Ignored::UnknownRelay,
    Ignored::PoolExhausted,
];

impl DhcpMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = DhcpMetrics {
            received: IntCounterVec::new(
                Opts::new("causeway_dhcp_received_total", "DHCP messages received, by message type"),
                &["type"],
            )?,
            sent: IntCounterVec::new(
                Opts::new("causeway_dhcp_sent_total", "DHCP messages sent, by message type"),
                &["type"],
            )?,
            dropped: IntCounterVec::new(
                Opts::new("causeway_dhcp_dropped_total", "DHCP messages dropped or left unanswered, by reason"),
                &["reason"],
            )?,
            reply_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "causeway_dhcp_reply_seconds",
                    "From a request's arrival to its reply's send, by reply type; an ACK or OFFER that leases waits for its lease to be on disk",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
                &["type"],
            )?,
            pool_addresses: IntGaugeVec::new(
                Opts::new(
                    "causeway_dhcp_pool_addresses",
                    "Addresses per pool by state: total, leased, offered, declined, unavailable, free",
                ),
                &["subnet", "pool", "state"],
            )?,
            leases: IntGauge::new("causeway_dhcp_lease_records", "Lease records held in memory")?,
            addresses6: IntGaugeVec::new(
                Opts::new(
                    "causeway_dhcp6_addresses",
                    "DHCPv6 addresses by state: total (pools and reservations), leased, declined",
                ),
                &["state"],
            )?,
            in_flight: IntGauge::new("causeway_dhcp_in_flight", "Replies waiting for their lease to be durable")?,
            commit_seconds: Histogram::with_opts(
                HistogramOpts::new("causeway_dhcp_store_commit_seconds", "Time to write and fsync one batch of lease records")
                    .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
            )?,
            batch_size: Histogram::with_opts(
                HistogramOpts::new("causeway_dhcp_store_batch_size", "Lease records made durable by one fsync")
                    .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]),
            )?,
            store_errors: IntCounter::new("causeway_dhcp_store_errors_total", "Lease store writes that failed; their replies were not sent")?,
            store_failures: IntCounterVec::new(
                Opts::new("causeway_dhcp_store_failures_total", "Lease store writes, syncs and repairs that failed, by cause: no_space, io, too_many_files, quota, other"),
                &["error"],
            )?,
            store_healthy: IntGauge::new("causeway_dhcp_store_healthy", "1 while the lease store can make leases durable; 0 while it cannot, and no lease is acknowledged")?,
            compactions: IntCounter::new("causeway_dhcp_store_compactions_total", "Lease log compactions")?,
            corrupt_lines: IntCounter::new("causeway_dhcp_store_corrupt_lines_total", "Lease log lines skipped at start: not JSON, or a record whose client id is not hex")?,
            compaction_failures: IntCounter::new("causeway_dhcp_store_compaction_failures_total", "Lease log compactions that failed; the log is kept as it was, and the output removed")?,
            clock_behind: IntGauge::new("causeway_dhcp_clock_behind_seconds", "How far the wall clock is behind the lease file's last write while the server waits to serve; 0 once serving")?,
            clock_wall_offset: IntGauge::new("causeway_dhcp_clock_wall_offset_seconds", "The wall clock minus the server's lease clock (the wall clock at start, advanced monotonically): how far the wall clock has stepped since start")?,
            changes_undone: IntCounter::new("causeway_dhcp_lease_changes_undone_total", "Lease changes the store could not make durable, undone in memory so their addresses are not used up")?,
        };
        registry.register(Box::new(m.received.clone()))?;
        registry.register(Box::new(m.sent.clone()))?;
        registry.register(Box::new(m.dropped.clone()))?;
        registry.register(Box::new(m.reply_seconds.clone()))?;
        registry.register(Box::new(m.pool_addresses.clone()))?;
        registry.register(Box::new(m.leases.clone()))?;
        registry.register(Box::new(m.addresses6.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.commit_seconds.clone()))?;
        registry.register(Box::new(m.batch_size.clone()))?;
        registry.register(Box::new(m.store_errors.clone()))?;
        registry.register(Box::new(m.store_failures.clone()))?;
        registry.register(Box::new(m.store_healthy.clone()))?;
        registry.register(Box::new(m.compactions.clone()))?;
        registry.register(Box::new(m.compaction_failures.clone()))?;
        registry.register(Box::new(m.corrupt_lines.clone()))?;
        registry.register(Box::new(m.clock_behind.clone()))?;
        registry.register(Box::new(m.clock_wall_offset.clone()))?;
        registry.register(Box::new(m.changes_undone.clone()))?;
        // The series alerts and dashboards read exist from the start, at
        // zero: a rate over a series that appears only with its first
        // event misses that event, and an absent series looks like health.
        for reason in ALERTED_DROPS {
            m.dropped.with_label_values(&[reason.label()]);
        }
        for kind in ["offer", "ack", "nak"] {
            m.reply_seconds.with_label_values(&[kind]);
        }
        for cause in STORE_FAILURE_CAUSES {
            m.store_failures.with_label_values(&[cause]);
        }
        Ok(m)
    }

    pub fn record_pools(&self, stats: &[PoolStats]) {
        self.pool_addresses.reset();
        for s in stats {
            for (state, value) in [
                ("total", s.total),
                ("leased", s.leased),
                ("offered", s.offered),
                ("declined", s.declined),
                ("unavailable", s.unavailable),
                ("free", s.free),
            ] {
                self.pool_addresses
                    .with_label_values(&[s.subnet.as_str(), s.pool.as_str(), state])
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
    }
}

pub fn message_type_label(t: Option<dhcproto::v4::MessageType>) -> &'static str {
    use dhcproto::v4::MessageType as T;
    match t {
        Some(T::Discover) => "discover",
        Some(T::Offer) => "offer",
        Some(T::Request) => "request",
        Some(T::Decline) => "decline",
        Some(T::Ack) => "ack",
        Some(T::Nak) => "nak",
        Some(T::Release) => "release",
        Some(T::Inform) => "inform",
        Some(_) => "other",
        None => "bootp",
    }
}
