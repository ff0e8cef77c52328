//! `causeway-bench`: load generators for causeway's services that also
//! work against other implementations, so numbers are comparable. Each
//! protocol is a subcommand: `dhcp`, `dhcp6`, `dns` and `proxy`; `dns-floor` is the
//! reference responder the DNS comparison measures servers against;
//! `operator` measures the Kubernetes operator at scale.
//!
//! It is not a test suite: it checks no answer for correctness beyond what
//! a measurement needs (an ID, an echo, a lease), and passes or fails
//! nothing; the comparisons' scripts and the tests do that.

mod dhcp;
mod dhcp6;
mod dns;
mod load;
mod operator;
mod proxy;
mod stats;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "causeway-bench",
    version,
    about = "Load generators for DHCP, DNS and TCP proxies, against causeway or any peer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// DHCPv4 DORA load against any DHCPv4 server (causeway, Kea, ISC
    /// dhcpd, dnsmasq), in relay mode by default
    Dhcp(dhcp::DhcpArgs),
    /// DHCPv6 Solicit/Advertise/Request/Reply load (or Rapid Commit) as a
    /// relay, against any DHCPv6 server (causeway, Kea)
    Dhcp6(dhcp6::Dhcp6Args),
    /// DNS query load (dnsperf-like) against any resolver (causeway,
    /// unbound, knot-resolver, dnsmasq): throughput, losses, latency and
    /// the rcode mix
    Dns(dns::DnsArgs),
    /// A DNS responder that does the least work a UDP server can per
    /// query, served like causeway's UDP sockets: measures what the
    /// kernel's UDP path costs on this host, as a floor for the servers
    /// compared; runs until Ctrl-C or SIGTERM
    DnsFloor(dns::floor::FloorArgs),
    /// TCP load through an L4 proxy (causeway, HAProxy, nginx stream) or
    /// straight to its upstream: connection rate, throughput, latency at a
    /// fixed rate, idle connections; with a built-in upstream server
    Proxy(proxy::ProxyArgs),
    /// The Kubernetes operator at scale against a real API server: installs
    /// the chart's objects, runs `causeway operator`, creates N Infras, and
    /// reports the time to converge, writes and reconciles in steady state,
    /// and RSS (bench/operator-scale.sh starts the cluster)
    Operator(operator::OperatorArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // One thread is plenty for each bench's single event loop and leaves
    // the other cores to the server under test.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Dhcp(args) => rt.block_on(dhcp::run(args)),
        Command::Dhcp6(args) => rt.block_on(dhcp6::run(args)),
        Command::Dns(args) => rt.block_on(dns::run(args)),
        Command::DnsFloor(args) => rt.block_on(dns::floor::run(args)),
        Command::Proxy(args) => rt.block_on(proxy::run(args)),
        Command::Operator(args) => rt.block_on(operator::run(args)),
    }
}

/// How a run stopped by a signal says so in its output and JSON, as it
/// always has ("terminated", "interrupted"): scripts and tests read it.
pub fn stop_word(signal: &str) -> &'static str {
    match signal {
        "SIGTERM" => "terminated",
        _ => "interrupted",
    }
}
