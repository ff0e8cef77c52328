//! The contract every long-running causeway service keeps (DHCP, DNS, the
//! proxy, policy routing), so the binary starts, reloads and stops them all
//! the same way.
//!
//! Starting is each service's own constructor, since each needs different
//! parts (a lease store, the shared names, a netlink handle); after that a
//! service is only reloaded and stopped, through this trait.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

pub trait Service: Send + Sync + Sized + 'static {
    /// The service's part of the config file.
    type Config: Sync;
    type Error: Display;
    /// For log lines: "DHCP", "DNS", "the proxy", "policy routing".
    const NAME: &'static str;

    /// Applies a new config to the running service. On an error the
    /// service keeps running as it was, and the error says why.
    fn reload(&self, cfg: &Self::Config) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// After the shutdown signal: finish the work in flight, taking no
    /// longer than `deadline` where the work is a client's (connections
    /// being relayed), and all of it where it is durable state (leases
    /// queued for the disk).
    fn stop(self, deadline: Duration) -> impl Future<Output = ()> + Send;
}

/// Hands a reloaded config to its service, or says why it cannot: a
/// service is turned on or off only by a restart.
pub async fn reload<S: Service>(running: Option<&S>, next: Option<&S::Config>) {
    match (running, next) {
        (Some(service), Some(cfg)) => match service.reload(cfg).await {
            Ok(()) => tracing::info!(service = S::NAME, "reloaded"),
            Err(e) => tracing::error!(
                service = S::NAME,
                "reload failed; the running config stays: {e}"
            ),
        },
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) => {
            tracing::warn!(
                service = S::NAME,
                "turning a service on or off needs a restart"
            )
        }
    }
}

/// Stops a service that may not be running.
pub async fn stop<S: Service>(service: Option<S>, deadline: Duration) {
    if let Some(s) = service {
        s.stop(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting {
        reloads: AtomicUsize,
    }

    impl Service for Counting {
        type Config = u32;
        type Error = String;
        const NAME: &'static str = "counting";

        async fn reload(&self, cfg: &u32) -> Result<(), String> {
            if *cfg == 0 {
                return Err("zero".into());
            }
            self.reloads.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        async fn stop(self, _deadline: Duration) {}
    }

    #[tokio::test]
    async fn reload_reaches_a_running_service_only_with_a_config() {
        let s = Counting {
            reloads: AtomicUsize::new(0),
        };
        reload(Some(&s), Some(&1)).await;
        reload(Some(&s), Some(&0)).await;
        reload(Some(&s), None).await;
        reload::<Counting>(None, Some(&1)).await;
        assert_eq!(s.reloads.load(Ordering::Relaxed), 1);
        stop(Some(s), Duration::ZERO).await;
    }
}
