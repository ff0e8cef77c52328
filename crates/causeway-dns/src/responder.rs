//! The responder every serving thread and task shares: the authority
//! (swapped whole by a reload), the forwarder, the DHCP names and the
//! metrics, and the steps of answering that do not wait on the network
//! (a packet to a reply, a forward or nothing; a forwarded answer made to
//! fit its client). The UDP threads' prepared answers (`prepared`), their
//! upstream sockets (`outbound`) and the TCP path (`server`) all use it; it
//! uses none of them.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::authority::{Authority, DynamicNames};
use crate::forward::{Answer, Forwarder, Waiter};
use crate::handler::{decide, Decision};
use crate::message::{self, ParsedQuery, Rejected};
use crate::metrics::{qtype_label, rcode_label, DnsMetrics};

pub(crate) struct Responder {
    pub(crate) authority: RwLock<Arc<Authority>>,
    /// Bumped on every reload, so per-socket prepared answers go stale.
    pub(crate) reloads: AtomicU64,
    pub(crate) forwarder: Option<Arc<Forwarder>>,
    pub(crate) dynamic: Arc<DynamicNames>,
    pub(crate) metrics: DnsMetrics,
    pub(crate) tcp_idle: Duration,
}

/// Cache and name expiry follow elapsed time, so a wall clock step
/// neither keeps answers past their TTL nor drops them early.
pub(crate) fn unix_now() -> u64 {
    causeway_runtime::clock::unix_now()
}

/// What to do with one packet.
pub(crate) enum Step {
    /// Send this; `reusable` when it may answer identical queries later.
    Reply {
        wire: Vec<u8>,
        reusable: bool,
    },
    Forward(ParsedQuery, usize),
    Drop,
}

impl Responder {
    /// Changes whenever records or DHCP names change.
    pub(crate) fn generation(&self) -> u64 {
        self.reloads
            .load(Ordering::Acquire)
            .wrapping_add(self.dynamic.generation())
    }

    pub(crate) fn authority(&self) -> Arc<Authority> {
        self.authority
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn count(&self, view: &str, qtype: RecordType, wire: &[u8]) {
        self.metrics
            .queries
            .with_label_values(&[
                view,
                qtype_label(qtype),
                rcode_label(message::rcode_of(wire)),
            ])
            .inc();
    }

    /// Everything that can be decided without waiting on the network.
    pub(crate) fn step(&self, request: &[u8], client: IpAddr, udp: bool) -> Step {
        let q = match message::parse(request) {
            Ok(q) => q,
            Err(Rejected::Drop(reason)) => {
                self.metrics.dropped.with_label_values(&[reason]).inc();
                return Step::Drop;
            }
            Err(Rejected::Reply { id, rcode, reason }) => {
                self.metrics.dropped.with_label_values(&[reason]).inc();
                return Step::Reply {
                    wire: message::bare_error(id, rcode),
                    reusable: false,
                };
            }
        };
        let auth = self.authority();
        let view = auth.view_for(client);
        let limit = if udp {
            q.udp_limit()
        } else {
            usize::from(u16::MAX)
        };
        match decide(
            &auth,
            view,
            &q,
            client,
            unix_now(),
            limit,
            self.forwarder.is_some(),
        ) {
            Decision::Reply { wire, reusable } => {
                self.count(auth.view_name(view), q.qtype(), &wire);
                Step::Reply { wire, reusable }
            }
            Decision::Forward => Step::Forward(q, view),
        }
    }

    /// The forwarded answer for a TCP client.
    pub(crate) async fn forward(&self, q: &ParsedQuery, view: usize, request: &[u8]) -> Vec<u8> {
        let Some(fwd) = &self.forwarder else {
            return message::error_response(q, ResponseCode::ServFail, true);
        };
        let (answer, waiters) = fwd.resolve(q, request, unix_now()).await;
        self.deliver(&answer, waiters);
        self.fit(answer, q, view, request, false)
    }

    /// Answers everyone waiting for a forwarded query.
    pub(crate) fn deliver(&self, answer: &Answer, waiters: Vec<Waiter>) {
        for waiter in waiters {
            match waiter {
                Waiter::Task(tx) => {
                    let _ = tx.send(answer.clone());
                }
                Waiter::Datagram(c) => {
                    let wire = self.fit(answer.clone(), &c.q, c.view, &c.request, true);
                    let _ = c.endpoint.send_now(&wire, c.to, c.local);
                }
            }
        }
    }

    /// A forwarded answer made to fit its client: the client's ID and
    /// question spelling, truncated if it is too big for the client's UDP.
    pub(crate) fn fit(
        &self,
        answer: Answer,
        q: &ParsedQuery,
        view: usize,
        request: &[u8],
        udp: bool,
    ) -> Vec<u8> {
        let wire = match answer {
            Answer::Response(mut wire) => {
                if !message::patch_for(&mut wire, q, request) {
                    message::error_response(q, ResponseCode::ServFail, true)
                } else if udp && wire.len() > q.udp_limit() {
                    message::truncated_response(q)
                } else {
                    message::mark_forwarded(&mut wire);
                    wire
                }
            }
            Answer::ServFail => message::error_response(q, ResponseCode::ServFail, true),
        };
        let auth = self.authority();
        self.count(auth.view_name(view), q.qtype(), &wire);
        wire
    }
}
