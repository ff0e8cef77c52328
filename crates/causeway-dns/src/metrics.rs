//! The DNS server's Prometheus metrics.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

#[derive(Clone)]
pub struct DnsMetrics {
    pub queries: IntCounterVec,
    pub dropped: IntCounterVec,
    pub cache: IntCounterVec,
    pub coalesced: IntCounter,
    pub coalesce_refused: IntCounterVec,
    pub coalesced_bytes: IntGauge,
    pub cache_bytes: IntGauge,
    pub cache_entries: IntGauge,
    pub upstream_seconds: HistogramVec,
    pub upstream_errors: IntCounterVec,
    pub upstream_in_flight: IntGauge,
    pub forward_failures: IntCounterVec,
    pub tcp_connections: IntGauge,
    pub tcp_refused: IntCounter,
}

impl DnsMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = DnsMetrics {
            queries: IntCounterVec::new(
                Opts::new(
                    "causeway_dns_queries_total",
                    "DNS queries answered, by view, query type and response code",
                ),
                &["view", "qtype", "rcode"],
            )?,
            dropped: IntCounterVec::new(
                Opts::new(
                    "causeway_dns_dropped_total",
                    "DNS packets dropped without an answer, by reason",
                ),
                &["reason"],
            )?,
            cache: IntCounterVec::new(
                Opts::new(
                    "causeway_dns_cache_total",
                    "Forwarding cache lookups: hit, miss, stale",
                ),
                &["result"],
            )?,
            cache_bytes: IntGauge::new(
                "causeway_dns_cache_bytes",
                "Bytes the forwarding cache holds, as counted against dns.cache.maxBytes",
            )?,
            cache_entries: IntGauge::new(
                "causeway_dns_cache_entries",
                "Responses the forwarding cache holds",
            )?,
            coalesced: IntCounter::new(
                "causeway_dns_coalesced_total",
                "Queries that waited on an identical upstream query already in flight",
            )?,
            coalesce_refused: IntCounterVec::new(
                Opts::new(
                    "causeway_dns_coalesce_refused_total",
                    "Queries answered SERVFAIL at once rather than wait on an identical \
                     upstream query: its name had 256 waiting (name_full), or all waiting \
                     held the byte budget (byte_budget)",
                ),
                &["reason"],
            )?,
            coalesced_bytes: IntGauge::new(
                "causeway_dns_coalesced_bytes",
                "Bytes held by queries waiting on an identical upstream query, counted \
                 against their 4 MiB budget",
            )?,
            upstream_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "causeway_dns_upstream_seconds",
                    "Upstream round-trip time, per upstream",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
                &["upstream"],
            )?,
            upstream_errors: IntCounterVec::new(
                Opts::new(
                    "causeway_dns_upstream_errors_total",
                    "Upstream queries that failed, per upstream and reason",
                ),
                &["upstream", "reason"],
            )?,
            upstream_in_flight: IntGauge::new(
                "causeway_dns_upstream_in_flight",
                "Upstream queries in flight",
            )?,
            forward_failures: IntCounterVec::new(
                Opts::new(
                    "causeway_dns_forward_failures_total",
                    "Forwarded queries no upstream answered, by why the last try ended \
                     (timeout, io, local, malformed, servfail, overloaded) and what the \
                     client got (stale, servfail)",
                ),
                &["reason", "answer"],
            )?,
            tcp_connections: IntGauge::new(
                "causeway_dns_tcp_connections",
                "Open client TCP connections",
            )?,
            tcp_refused: IntCounter::new(
                "causeway_dns_tcp_refused_total",
                "Client TCP connections closed at once because the limit was reached",
            )?,
        };
        registry.register(Box::new(m.queries.clone()))?;
        registry.register(Box::new(m.dropped.clone()))?;
        registry.register(Box::new(m.cache.clone()))?;
        registry.register(Box::new(m.coalesced.clone()))?;
        registry.register(Box::new(m.coalesce_refused.clone()))?;
        registry.register(Box::new(m.coalesced_bytes.clone()))?;
        registry.register(Box::new(m.cache_bytes.clone()))?;
        registry.register(Box::new(m.cache_entries.clone()))?;
        registry.register(Box::new(m.upstream_seconds.clone()))?;
        registry.register(Box::new(m.upstream_errors.clone()))?;
        registry.register(Box::new(m.upstream_in_flight.clone()))?;
        registry.register(Box::new(m.forward_failures.clone()))?;
        registry.register(Box::new(m.tcp_connections.clone()))?;
        registry.register(Box::new(m.tcp_refused.clone()))?;
        // At zero from the start, so the first refusal shows as an increase.
        for reason in ["name_full", "byte_budget"] {
            m.coalesce_refused.with_label_values(&[reason]);
        }
        Ok(m)
    }
}

/// A bounded label for query types.
pub fn qtype_label(t: RecordType) -> &'static str {
    match t {
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::PTR => "PTR",
        RecordType::SRV => "SRV",
        RecordType::TXT => "TXT",
        RecordType::CNAME => "CNAME",
        RecordType::SOA => "SOA",
        RecordType::NS => "NS",
        RecordType::MX => "MX",
        RecordType::ANY => "ANY",
        _ => "other",
    }
}

pub fn rcode_label(r: Option<ResponseCode>) -> &'static str {
    match r {
        Some(ResponseCode::NoError) => "NOERROR",
        Some(ResponseCode::NXDomain) => "NXDOMAIN",
        Some(ResponseCode::ServFail) => "SERVFAIL",
        Some(ResponseCode::Refused) => "REFUSED",
        Some(ResponseCode::FormErr) => "FORMERR",
        Some(ResponseCode::NotImp) => "NOTIMP",
        _ => "other",
    }
}
