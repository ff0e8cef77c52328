//! The kernel side: reads links, addresses, rules and routes over rtnetlink
//! and writes the changes [`crate::plan`] decides. Only rules and routes
//! that carry [`PROTOCOL`] are ever read back as ours or removed.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::stream::{Stream, StreamExt, TryStreamExt};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::link::{LinkAttribute, LinkFlags};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction as NlRuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::{Handle, IpVersion, MulticastGroup, RouteMessageBuilder};

use crate::plan::{Route, Rule, RuleAction, Scope, PROTOCOL};

const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const ENODEV: i32 = 19;
const EEXIST: i32 = 17;
const EADDRNOTAVAIL: i32 = 99;

/// A refused or failed netlink request, worded for an operator.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct NetlinkError {
    pub what: String,
    pub reason: String,
    pub errno: Option<i32>,
}

impl NetlinkError {
    fn new(what: impl Into<String>, e: &rtnetlink::Error) -> Self {
        let errno = match e {
            rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
            _ => None,
        };
        let reason = match errno {
            Some(EPERM) => {
                "operation not permitted: causeway needs CAP_NET_ADMIN to change routing"
                    .to_string()
            }
            Some(n) => io::Error::from_raw_os_error(n).to_string(),
            None => e.to_string(),
        };
        NetlinkError {
            what: what.into(),
            reason,
            errno,
        }
    }

    pub fn is_permission(&self) -> bool {
        self.errno == Some(EPERM)
    }

    /// Already there (add) or already gone (remove): the goal is met.
    fn is_settled(&self) -> bool {
        matches!(self.errno, Some(EEXIST | ENOENT | ESRCH))
    }
}

/// An interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    /// Administratively up (`ip link set up`).
    pub up: bool,
    /// Carrier present.
    pub lower_up: bool,
    /// The hardware address, where the link has an Ethernet one.
    pub mac: Option<[u8; 6]>,
}

pub struct Kernel {
    handle: Handle,
}

fn protocol() -> RouteProtocol {
    RouteProtocol::from(PROTOCOL)
}

impl Kernel {
    /// Opens a netlink connection; must run inside a tokio runtime.
    pub fn connect() -> io::Result<Self> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        Ok(Kernel { handle })
    }

    pub async fn link(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match links.try_next().await {
            Ok(Some(msg)) => {
                let flags = msg.header.flags;
                // The name filter is a request; check what came back.
                let named = msg
                    .attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::IfName(n) if n == name));
                let mac = msg.attributes.iter().find_map(|a| match a {
                    LinkAttribute::Address(bytes) => <[u8; 6]>::try_from(bytes.as_slice()).ok(),
                    _ => None,
                });
                Ok(named.then_some(Link {
                    index: msg.header.index,
                    up: flags.contains(LinkFlags::Up),
                    lower_up: flags.contains(LinkFlags::LowerUp),
                    mac,
                }))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                let err = NetlinkError::new(format!("look up interface {name}"), &e);
                if err.errno == Some(ENODEV) {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// The IPv4 addresses on an interface, with their prefix lengths.
    pub async fn addresses(&self, index: u32) -> Result<Vec<Ipv4Net>, NetlinkError> {
        let mut request = self.handle.address().get().set_link_index_filter(index);
        request.message_mut().header.family = AddressFamily::Inet;
        let mut stream = request.execute();
        let mut out = Vec::new();
        loop {
            let msg = match stream.try_next().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return Err(NetlinkError::new("list addresses", &e)),
            };
            if msg.header.index != index {
                continue;
            }
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = local.or(address) {
                if let Ok(net) = Ipv4Net::new(ip, msg.header.prefix_len) {
                    out.push(net);
                }
            }
        }
        Ok(out)
    }

    /// Adds an IPv4 address to an interface; one already there is left as
    /// it is.
    pub async fn add_address(&self, index: u32, net: Ipv4Net) -> Result<(), NetlinkError> {
        let request = self
            .handle
            .address()
            .add(index, IpAddr::V4(net.addr()), net.prefix_len());
        settled(request.execute().await, format!("add address {net}"))
    }

    /// Adds a v6 address usable at once: without duplicate address
    /// detection, since the address moves from a replica that may answer
    /// for it a moment longer, and a takeover cannot wait out DAD (or fail
    /// it).
    pub async fn add_address_v6(&self, index: u32, net: Ipv6Net) -> Result<(), NetlinkError> {
        let mut request =
            self.handle
                .address()
                .add(index, IpAddr::V6(net.addr()), net.prefix_len());
        request
            .message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        settled(request.execute().await, format!("add address {net}"))
    }

    /// Removes a v6 address; one not there is gone already.
    pub async fn remove_address_v6(&self, index: u32, net: Ipv6Net) -> Result<(), NetlinkError> {
        let message = rtnetlink::AddressMessageBuilder::<std::net::Ipv6Addr>::new()
            .index(index)
            .address(net.addr(), net.prefix_len())
            .build();
        let result = self.handle.address().del(message).execute().await;
        match settled(result, format!("remove address {net}")) {
            Err(e) if e.errno == Some(EADDRNOTAVAIL) => Ok(()),
            other => other,
        }
    }

    /// The v6 addresses on an interface.
    pub async fn addresses_v6(&self, index: u32) -> Result<Vec<Ipv6Net>, NetlinkError> {
        let mut request = self.handle.address().get().set_link_index_filter(index);
        request.message_mut().header.family = AddressFamily::Inet6;
        let mut stream = request.execute();
        let mut out = Vec::new();
        loop {
            let msg = match stream.try_next().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return Err(NetlinkError::new("list addresses", &e)),
            };
            if msg.header.index != index {
                continue;
            }
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V6(ip)) => Some(*ip),
                _ => None,
            });
            if let Some(net) = address.and_then(|ip| Ipv6Net::new(ip, msg.header.prefix_len).ok()) {
                out.push(net);
            }
        }
        Ok(out)
    }

    /// The v6 addresses on an interface that the kernel routes from:
    /// neither tentative (DAD running) nor failed DAD.
    pub async fn usable_addresses_v6(&self, index: u32) -> Result<Vec<Ipv6Addr>, NetlinkError> {
        let mut request = self.handle.address().get().set_link_index_filter(index);
        request.message_mut().header.family = AddressFamily::Inet6;
        let mut stream = request.execute();
        let mut out = Vec::new();
        let unusable = AddressFlags::Tentative | AddressFlags::Dadfailed;
        loop {
            let msg = match stream.try_next().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return Err(NetlinkError::new("list addresses", &e)),
            };
            if msg.header.index != index {
                continue;
            }
            // The full flags come as an attribute; the header holds the
            // first eight of them.
            let flags = msg
                .attributes
                .iter()
                .find_map(|a| match a {
                    AddressAttribute::Flags(f) => Some(*f),
                    _ => None,
                })
                .unwrap_or_else(|| {
                    AddressFlags::from_bits_retain(u32::from(msg.header.flags.bits()))
                });
            if flags.intersects(unusable) {
                continue;
            }
            if let Some(ip) = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V6(ip)) => Some(*ip),
                _ => None,
            }) {
                out.push(ip);
            }
        }
        Ok(out)
    }

    /// Removes an IPv4 address from an interface; one not there is gone
    /// already.
    pub async fn remove_address(&self, index: u32, net: Ipv4Net) -> Result<(), NetlinkError> {
        let message = rtnetlink::AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(net.addr(), net.prefix_len())
            .build();
        let result = self.handle.address().del(message).execute().await;
        match settled(result, format!("remove address {net}")) {
            // Removing an address not there answers EADDRNOTAVAIL.
            Err(e) if e.errno == Some(EADDRNOTAVAIL) => Ok(()),
            other => other,
        }
    }

    /// The rules of both families that carry our protocol, with the
    /// kernel's messages (needed to remove them).
    pub async fn owned_rules(&self) -> Result<Vec<(Rule, RuleMessage)>, NetlinkError> {
        let mut out = Vec::new();
        for version in [IpVersion::V4, IpVersion::V6] {
            let v6 = version == IpVersion::V6;
            let mut stream = self.handle.rule().get(version).execute();
            loop {
                let msg = match stream.try_next().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => return Err(NetlinkError::new("list rules", &e)),
                };
                let mut rule = Rule {
                    // The kernel leaves the priority out when it is 0.
                    priority: 0,
                    table: u32::from(msg.header.table),
                    from: if v6 {
                        IpNet::V6(Ipv6Net::default())
                    } else {
                        IpNet::V4(Ipv4Net::default())
                    },
                    action: match msg.header.action {
                        NlRuleAction::ToTable => RuleAction::ToTable,
                        other => RuleAction::Other(u8::from(other)),
                    },
                };
                let mut ours = false;
                for attr in &msg.attributes {
                    match attr {
                        RuleAttribute::Priority(p) => rule.priority = *p,
                        // Tables past 255 only fit in the attribute.
                        RuleAttribute::Table(t) => rule.table = *t,
                        RuleAttribute::Source(ip) => {
                            if let Ok(net) = IpNet::new(*ip, msg.header.src_len) {
                                rule.from = net;
                            }
                        }
                        RuleAttribute::Protocol(p) => ours = *p == protocol(),
                        _ => {}
                    }
                }
                if ours {
                    out.push((rule, msg));
                }
            }
        }
        Ok(out)
    }

    /// The routes of both families, in any table, that carry our
    /// protocol.
    pub async fn owned_routes(&self) -> Result<Vec<(Route, RouteMessage)>, NetlinkError> {
        // Without strict checking the kernel dumps every table and ignores
        // the filter, so ownership is decided here.
        let filters = [
            RouteMessageBuilder::<Ipv4Addr>::new()
                .protocol(RouteProtocol::Unspec)
                .kind(RouteType::Unspec)
                .build(),
            RouteMessageBuilder::<Ipv6Addr>::new()
                .protocol(RouteProtocol::Unspec)
                .kind(RouteType::Unspec)
                .build(),
        ];
        let mut out = Vec::new();
        for filter in filters {
            let v6 = filter.header.address_family == AddressFamily::Inet6;
            let mut stream = self.handle.route().get(filter).execute();
            loop {
                let msg = match stream.try_next().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => return Err(NetlinkError::new("list routes", &e)),
                };
                if msg.header.protocol != protocol() {
                    continue;
                }
                let mut route = Route {
                    table: u32::from(msg.header.table),
                    destination: if v6 {
                        IpNet::V6(Ipv6Net::default())
                    } else {
                        IpNet::V4(Ipv4Net::default())
                    },
                    gateway: None,
                    source: None,
                    interface: 0,
                    scope: if msg.header.scope == RouteScope::Link {
                        Scope::Link
                    } else {
                        Scope::Universe
                    },
                };
                let prefix = msg.header.destination_prefix_length;
                let ip = |a: &RouteAddress| match a {
                    RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
                    RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
                    _ => None,
                };
                for attr in &msg.attributes {
                    match attr {
                        RouteAttribute::Table(t) => route.table = *t,
                        RouteAttribute::Destination(a) => {
                            if let Some(net) = ip(a).and_then(|ip| IpNet::new(ip, prefix).ok()) {
                                route.destination = net;
                            }
                        }
                        RouteAttribute::Gateway(a) => route.gateway = ip(a),
                        RouteAttribute::PrefSource(a) => route.source = ip(a),
                        RouteAttribute::Oif(i) => route.interface = *i,
                        _ => {}
                    }
                }
                out.push((route, msg));
            }
        }
        Ok(out)
    }

    pub async fn add_rule(&self, rule: &Rule) -> Result<(), NetlinkError> {
        // The action is set explicitly: a rule with no action is accepted,
        // and every lookup through it then fails.
        let add = self
            .handle
            .rule()
            .add()
            .table_id(rule.table)
            .priority(rule.priority)
            .action(NlRuleAction::ToTable);
        let result = match rule.from {
            IpNet::V4(from) => {
                let mut request = add.v4().source_prefix(from.addr(), from.prefix_len());
                request
                    .message_mut()
                    .attributes
                    .push(RuleAttribute::Protocol(protocol()));
                request.execute().await
            }
            IpNet::V6(from) => {
                let mut request = add.v6().source_prefix(from.addr(), from.prefix_len());
                request
                    .message_mut()
                    .attributes
                    .push(RuleAttribute::Protocol(protocol()));
                request.execute().await
            }
        };
        settled(result, format!("add rule \"{rule}\""))
    }

    pub async fn remove_rule(&self, rule: &Rule, msg: RuleMessage) -> Result<(), NetlinkError> {
        settled(
            self.handle.rule().del(msg).execute().await,
            format!("remove rule \"{rule}\""),
        )
    }

    pub async fn add_route(&self, route: &Route, name: &str) -> Result<(), NetlinkError> {
        let scope = match route.scope {
            Scope::Link => RouteScope::Link,
            Scope::Universe => RouteScope::Universe,
        };
        // One builder per family: its address types are fixed by it. A
        // gateway or source of the other family is a plan error, dropped.
        let message = match route.destination {
            IpNet::V4(destination) => {
                let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
                    .table_id(route.table)
                    .output_interface(route.interface)
                    .protocol(protocol())
                    .scope(scope);
                if destination.prefix_len() > 0 {
                    builder =
                        builder.destination_prefix(destination.addr(), destination.prefix_len());
                }
                if let Some(IpAddr::V4(g)) = route.gateway {
                    builder = builder.gateway(g);
                }
                if let Some(IpAddr::V4(s)) = route.source {
                    builder = builder.pref_source(s);
                }
                builder.build()
            }
            IpNet::V6(destination) => {
                let mut builder = RouteMessageBuilder::<Ipv6Addr>::new()
                    .table_id(route.table)
                    .output_interface(route.interface)
                    .protocol(protocol())
                    .scope(scope);
                if destination.prefix_len() > 0 {
                    builder =
                        builder.destination_prefix(destination.addr(), destination.prefix_len());
                }
                if let Some(IpAddr::V6(g)) = route.gateway {
                    builder = builder.gateway(g);
                }
                if let Some(IpAddr::V6(s)) = route.source {
                    builder = builder.pref_source(s);
                }
                builder.build()
            }
        };
        settled(
            self.handle.route().add(message).execute().await,
            format!("add route \"{}\"", route.display(name)),
        )
    }

    pub async fn remove_route(
        &self,
        route: &Route,
        name: &str,
        msg: RouteMessage,
    ) -> Result<(), NetlinkError> {
        settled(
            self.handle.route().del(msg).execute().await,
            format!("remove route \"{}\"", route.display(name)),
        )
    }
}

fn settled(result: Result<(), rtnetlink::Error>, what: String) -> Result<(), NetlinkError> {
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            let err = NetlinkError::new(what, &e);
            if err.is_settled() {
                Ok(())
            } else {
                Err(err)
            }
        }
    }
}

/// A change that may have undone installed routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A link appeared, changed state or went away.
    Link { index: u32 },
    /// An address was added to or removed from a link (or finished DAD).
    Address { index: u32 },
    /// Events were lost (the socket's buffer overflowed): resync everything.
    Lost,
}

/// Link and address events of both families, on a connection of their
/// own.
pub fn events() -> io::Result<impl Stream<Item = Event> + Unpin + Send> {
    let (connection, _, messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ])?;
    tokio::spawn(connection);
    Ok(messages.filter_map(|(msg, _)| futures::future::ready(event_of(msg))))
}

fn event_of(msg: NetlinkMessage<RouteNetlinkMessage>) -> Option<Event> {
    match msg.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l))
        | NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => Some(Event::Link {
            index: l.header.index,
        }),
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(a))
        | NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(a)) => {
            Some(Event::Address {
                index: a.header.index,
            })
        }
        NetlinkPayload::Overrun(_) => Some(Event::Lost),
        _ => None,
    }
}
