//! What policy routing should be installed, and the changes that get the
//! kernel there from what it has. Pure: the netlink side only reads and
//! writes what this module decides.

use std::fmt;
use std::net::IpAddr;

use causeway_config::RoutedInterface;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The route protocol number (`proto` in `ip route`/`ip rule`) that marks
/// what causeway installed. Anything else is never touched.
pub const PROTOCOL: u8 = 240;

/// What a rule does with a packet it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleAction {
    /// Look the packet up in the rule's table.
    ToTable,
    /// Any other action (or none: a rule the kernel took without one,
    /// through which every lookup fails).
    Other(u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub priority: u32,
    pub table: u32,
    /// The source selector: `from <address>/32` (or `/128`); its family
    /// is the rule's.
    pub from: IpNet,
    pub action: RuleAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Universe,
    Link,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub table: u32,
    /// Its family is the route's.
    pub destination: IpNet,
    pub gateway: Option<IpAddr>,
    /// The preferred source (`src`).
    pub source: Option<IpAddr>,
    /// The output interface's index.
    pub interface: u32,
    pub scope: Scope,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: from {} lookup {}",
            self.priority, self.from, self.table
        )?;
        if let RuleAction::Other(a) = self.action {
            write!(f, " (action {a}, not lookup)")?;
        }
        Ok(())
    }
}

impl Route {
    /// `ip route` syntax, with the interface given by name.
    pub fn display<'a>(&'a self, name: &'a str) -> impl fmt::Display + 'a {
        DisplayRoute { route: self, name }
    }
}

struct DisplayRoute<'a> {
    route: &'a Route,
    name: &'a str,
}

impl fmt::Display for DisplayRoute<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.route;
        if r.destination.prefix_len() == 0 {
            write!(f, "default")?;
        } else {
            write!(f, "{}", r.destination)?;
        }
        if let Some(g) = r.gateway {
            write!(f, " via {g}")?;
        }
        write!(f, " dev {}", self.name)?;
        if r.scope == Scope::Link {
            write!(f, " scope link")?;
        }
        if let Some(s) = r.source {
            write!(f, " src {s}")?;
        }
        write!(f, " table {}", r.table)
    }
}

/// The rule and routes one interface needs, given its kernel index.
pub fn wanted(iface: &RoutedInterface, index: u32) -> (Rule, Vec<Route>) {
    let rule = Rule {
        priority: iface.priority,
        table: iface.table,
        from: IpNet::V4(Ipv4Net::from(iface.address)),
        action: RuleAction::ToTable,
    };
    let gateway = Some(IpAddr::V4(iface.gateway));
    let mut routes = vec![
        Route {
            table: iface.table,
            destination: IpNet::V4(iface.cidr.trunc()),
            gateway: None,
            source: Some(IpAddr::V4(iface.address)),
            interface: index,
            scope: Scope::Link,
        },
        Route {
            table: iface.table,
            destination: IpNet::V4(Ipv4Net::default()),
            gateway,
            source: None,
            interface: index,
            scope: Scope::Universe,
        },
    ];
    for extra in &iface.extra_routes {
        routes.push(Route {
            table: iface.table,
            destination: IpNet::V4(extra.trunc()),
            gateway,
            source: None,
            interface: index,
            scope: Scope::Universe,
        });
    }
    (rule, routes)
}

/// The v6 rule and routes of an interface with a v6 side: the v6 table of
/// the same number, at the same priority. Every v6 route is scope
/// universe, as the kernel keeps v6 routes whatever scope is asked for.
pub fn wanted_v6(iface: &RoutedInterface, index: u32) -> Option<(Rule, Vec<Route>)> {
    let v6 = iface.ipv6.as_ref()?;
    let rule = Rule {
        priority: iface.priority,
        table: iface.table,
        from: IpNet::V6(Ipv6Net::from(v6.address)),
        action: RuleAction::ToTable,
    };
    let gateway = Some(IpAddr::V6(v6.gateway));
    let route = |destination: Ipv6Net, gateway: Option<IpAddr>, source: Option<IpAddr>| Route {
        table: iface.table,
        destination: IpNet::V6(destination),
        gateway,
        source,
        interface: index,
        scope: Scope::Universe,
    };
    let mut routes = vec![
        route(v6.cidr.trunc(), None, Some(IpAddr::V6(v6.address))),
        route(Ipv6Net::default(), gateway, None),
    ];
    for extra in &v6.extra_routes {
        routes.push(route(extra.trunc(), gateway, None));
    }
    Some((rule, routes))
}

/// The steps from what is installed (only what carries [`PROTOCOL`]) to
/// what is wanted. Removals come first: a changed route keeps its table
/// and destination, and the kernel refuses a second one alongside.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub remove_routes: Vec<Route>,
    pub remove_rules: Vec<Rule>,
    pub add_rules: Vec<Rule>,
    pub add_routes: Vec<Route>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.remove_routes.is_empty()
            && self.remove_rules.is_empty()
            && self.add_rules.is_empty()
            && self.add_routes.is_empty()
    }
}

pub fn diff(
    want_rules: &[Rule],
    want_routes: &[Route],
    have_rules: &[Rule],
    have_routes: &[Route],
) -> Changes {
    let mut changes = Changes::default();
    for (i, r) in have_rules.iter().enumerate() {
        // A duplicate of one kept already is surplus too.
        if !want_rules.contains(r) || have_rules[..i].contains(r) {
            changes.remove_rules.push(r.clone());
        }
    }
    for (i, r) in have_routes.iter().enumerate() {
        if !want_routes.contains(r) || have_routes[..i].contains(r) {
            changes.remove_routes.push(r.clone());
        }
    }
    for r in want_rules {
        if !have_rules.contains(r) && !changes.add_rules.contains(r) {
            changes.add_rules.push(r.clone());
        }
    }
    for r in want_routes {
        if !have_routes.contains(r) && !changes.add_routes.contains(r) {
            changes.add_routes.push(r.clone());
        }
    }
    changes
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::cloned_ref_to_slice_refs)]
mod tests {
    use super::*;

    fn net1() -> RoutedInterface {
        RoutedInterface {
            interface: "net1".into(),
            cidr: "192.168.100.7/24".parse().unwrap(),
            address: std::net::Ipv4Addr::new(192, 168, 100, 2),
            gateway: std::net::Ipv4Addr::new(192, 168, 100, 1),
            table: 100,
            priority: 1000,
            extra_routes: vec!["10.20.0.0/16".parse().unwrap()],
            ipv6: None,
        }
    }

    #[test]
    fn one_interface_wants_a_lookup_rule_and_three_routes() {
        let (rule, routes) = wanted(&net1(), 7);
        assert_eq!(rule.to_string(), "1000: from 192.168.100.2/32 lookup 100");
        assert_eq!(rule.action, RuleAction::ToTable);
        let shown: Vec<String> = routes
            .iter()
            .map(|r| r.display("net1").to_string())
            .collect();
        assert_eq!(
            shown,
            vec![
                "192.168.100.0/24 dev net1 scope link src 192.168.100.2 table 100",
                "default via 192.168.100.1 dev net1 table 100",
                "10.20.0.0/16 via 192.168.100.1 dev net1 table 100",
            ]
        );
    }

    #[test]
    fn applying_what_is_installed_changes_nothing() {
        let (rule, routes) = wanted(&net1(), 7);
        assert!(diff(&[rule.clone()], &routes, &[rule], &routes).is_empty());
    }

    #[test]
    fn from_nothing_everything_is_added() {
        let (rule, routes) = wanted(&net1(), 7);
        let c = diff(&[rule.clone()], &routes, &[], &[]);
        assert_eq!(c.add_rules, vec![rule]);
        assert_eq!(c.add_routes, routes);
        assert!(c.remove_rules.is_empty() && c.remove_routes.is_empty());
    }

    #[test]
    fn a_rule_without_the_lookup_action_is_replaced() {
        let (rule, routes) = wanted(&net1(), 7);
        let broken = Rule {
            action: RuleAction::Other(0),
            ..rule.clone()
        };
        let c = diff(&[rule.clone()], &routes, &[broken.clone()], &routes);
        assert_eq!(c.remove_rules, vec![broken]);
        assert_eq!(c.add_rules, vec![rule]);
    }

    #[test]
    fn unwanted_and_changed_routes_go_duplicates_too() {
        let (rule, routes) = wanted(&net1(), 7);
        let mut moved = net1();
        moved.gateway = std::net::Ipv4Addr::new(192, 168, 100, 254);
        moved.extra_routes.clear();
        let (_, now) = wanted(&moved, 7);
        let c = diff(
            &[rule.clone()],
            &now,
            &[rule.clone(), rule.clone()],
            &routes,
        );
        assert_eq!(c.remove_rules, vec![rule]);
        assert_eq!(c.remove_routes, routes[1..].to_vec());
        assert_eq!(c.add_routes, vec![now[1].clone()]);
        assert!(c.add_rules.is_empty());
    }

    #[test]
    fn a_new_index_after_the_link_is_recreated_moves_every_route() {
        let (rule, before) = wanted(&net1(), 7);
        let (_, after) = wanted(&net1(), 9);
        let c = diff(&[rule.clone()], &after, &[rule], &before);
        assert_eq!(c.remove_routes, before);
        assert_eq!(c.add_routes, after);
    }

    #[test]
    fn a_v6_side_wants_its_own_rule_and_routes_in_the_same_numbered_table() {
        let mut iface = net1();
        iface.ipv6 = Some(causeway_config::RoutedV6 {
            cidr: "fd42:10::/64".parse().unwrap(),
            address: "fd42:10::2".parse().unwrap(),
            gateway: "fe80::1".parse().unwrap(),
            extra_routes: vec!["fd43::/48".parse().unwrap()],
        });
        assert!(wanted_v6(&net1(), 7).is_none());
        let (rule, routes) = wanted_v6(&iface, 7).unwrap();
        assert_eq!(rule.to_string(), "1000: from fd42:10::2/128 lookup 100");
        let shown: Vec<String> = routes
            .iter()
            .map(|r| r.display("net1").to_string())
            .collect();
        assert_eq!(
            shown,
            vec![
                "fd42:10::/64 dev net1 src fd42:10::2 table 100",
                "default via fe80::1 dev net1 table 100",
                "fd43::/48 via fe80::1 dev net1 table 100",
            ]
        );
    }
}
