// `causeway-bench proxy`: load for a TCP path, through an L4 proxy
// (causeway, HAProxy, nginx stream) or straight to the upstream, so the
// proxy's cost is the difference between two runs of the same command. It
// brings its own upstream (`upstream`: echo, sink or source) and four
// clients: connection rate (`conn`), bulk throughput (`throughput`), round
// trips at a fixed rate (`latency`) and held idle connections (`idle`).
// This file owns the command; what the clients share, and call back into,
// is in `harness`.

mod conn;
mod harness;
mod idle;
mod latency;
mod throughput;
mod upstream;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Every client subcommand stops by itself (--duration, --hold), prints a
progress line every second on stderr and a final table (or --json) on stdout.

Examples:
  # the far end: echo for conn, latency and idle; sink and source for throughput
  causeway-bench proxy upstream --listen 127.0.0.1:9000 --mode echo

  # short connections through a proxy listening on 8443 (forwarding to :9000)
  causeway-bench proxy conn --target 127.0.0.1:8443 --concurrency 64 --duration 10s

  # the same straight to the upstream, for the no-proxy baseline
  causeway-bench proxy conn --target 127.0.0.1:9000

  # bulk upload over 4 streams (upstream in --mode sink)
  causeway-bench proxy throughput --target 127.0.0.1:8443 --streams 4 --direction up

  # round trips at 1000/s on persistent connections
  causeway-bench proxy latency --target 127.0.0.1:8443 --rate 1000

  # hold 10000 idle connections while something measures the proxy's memory
  causeway-bench proxy idle --target 127.0.0.1:8443 --connections 10000 --hold 10s")]
pub struct ProxyArgs {
    #[command(subcommand)]
    pub command: ProxyCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum ProxyCommand {
    /// Built-in upstream server: echo, sink (counts what it reads and
    /// replies with the count at EOF) or source (streams bytes until the
    /// client closes); runs until Ctrl-C, SIGTERM or --duration
    Upstream(upstream::UpstreamArgs),
    /// Connection rate: connect, send a payload, read it echoed, close;
    /// conn/s, failures and latency of the whole exchange (echo upstream)
    Conn(conn::ConnArgs),
    /// Bulk throughput over N parallel streams, up to a sink or down from
    /// a source upstream; Gbit/s in total and per stream
    Throughput(throughput::ThroughputArgs),
    /// Request/response round trips at a fixed rate on persistent
    /// connections; p50/p99/p99.9 (echo upstream)
    Latency(latency::LatencyArgs),
    /// Opens and holds N idle connections (for memory per connection);
    /// how many succeeded and survived the hold (echo upstream)
    Idle(idle::IdleArgs),
}

pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    // Every task shares the one thread of the bench's runtime, so the
    // shared counters can be plain Cells and RefCells instead of atomics
    // and locks; spawn_local needs a LocalSet for that.
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            match args.command {
                ProxyCommand::Upstream(a) => upstream::run(a).await,
                ProxyCommand::Conn(a) => conn::run(a).await,
                ProxyCommand::Throughput(a) => throughput::run(a).await,
                ProxyCommand::Latency(a) => latency::run(a).await,
                ProxyCommand::Idle(a) => idle::run(a).await,
            }
        })
        .await
}
