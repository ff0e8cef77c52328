//! Reload triggers: SIGHUP, or the config file's content changing.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::shutdown::Shutdown;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadCause {
    Signal,
    FileChanged,
}

/// Emits a [`ReloadCause`] on SIGHUP and whenever the file at `path` reads
/// differently than before (checked every `poll`). Content, not mtime, is
/// compared, so editors that rewrite a file in place and ConfigMap symlink
/// swaps are both seen, and a touch without change is not.
pub fn watch(
    path: Option<PathBuf>,
    poll: Duration,
    shutdown: Shutdown,
) -> std::io::Result<mpsc::Receiver<ReloadCause>> {
    let (tx, rx) = mpsc::channel(4);
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        let mut last = match &path {
            Some(p) => tokio::fs::read(p).await.ok(),
            None => None,
        };
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let cause = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = hup.recv() => ReloadCause::Signal,
                _ = tick.tick() => {
                    let Some(p) = &path else { continue };
                    let now = tokio::fs::read(p).await.ok();
                    if now.is_none() || now == last {
                        continue;
                    }
                    last = now;
                    ReloadCause::FileChanged
                }
            };
            if tx.send(cause).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
