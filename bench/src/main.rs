// Entry point of `causeway-bench`: load generators for causeway's services
// that also work against other implementations, so numbers are comparable.
// Each protocol is a subcommand; `dns` and `proxy` will join `dhcp`.

mod dhcp;
mod stats;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "causeway-bench",
    version,
    about = "Load generators for DHCP (and later DNS and the proxy), against causeway or any peer"
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Dhcp(args) => {
            // One thread is plenty for the bench's single event loop and
            // leaves the other cores to the server under test.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(dhcp::run(args))
        }
    }
}
