//! `causeway route apply|show|flush`: the appliance's policy routing, run
//! once from the command line.

use crate::out::outln;
use std::path::Path;

use anyhow::Context;
use causeway_config::Config;
use causeway_route::Reconciler;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Action {
    /// Install the wanted rules and routes and remove unwanted ones we own.
    Apply,
    /// Print what is installed against what is wanted.
    Show,
    /// Remove every rule and route causeway owns.
    Flush,
}

pub fn run(action: Action, path: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    let routing = cfg
        .routing
        .with_context(|| format!("{} has no routing section", path.display()))?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(async move {
            let reconciler = Reconciler::new(routing, None)?;
            match action {
                Action::Apply => {
                    let report = reconciler.reconcile(true).await?;
                    for (interface, status) in &report.interfaces {
                        outln!("{interface}: {}", status.label())?;
                    }
                    outln!("{} change(s)", report.changed)?;
                }
                Action::Show => crate::out::text(&reconciler.show().await?)?,
                Action::Flush => {
                    let removed = reconciler.flush().await?;
                    outln!("removed {removed} rule(s) and route(s)")?;
                }
            }
            Ok(())
        })
}
