//! Choosing where a connection goes from the name its ClientHello carries
//! and the address it comes from.

use std::collections::HashMap;
use std::net::IpAddr;

use causeway_config::{valid_name, NameRules};
use ipnet::IpNet;

use crate::hello::Peek;

/// Targets for one name (or for no name), each perhaps for some client
/// addresses only: those for the client's address come before those for
/// any client.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scoped<T> {
    /// (sources, target); empty sources means any client. Scoped entries
    /// first.
    entries: Vec<(Vec<IpNet>, T)>,
}

impl<T> Default for Scoped<T> {
    fn default() -> Self {
        Scoped {
            entries: Vec::new(),
        }
    }
}

impl<T> Scoped<T> {
    fn add(&mut self, sources: Vec<IpNet>, target: T) -> bool {
        if sources.is_empty() && self.entries.iter().any(|(s, _)| s.is_empty()) {
            return false;
        }
        if sources.is_empty() {
            self.entries.push((sources, target));
        } else {
            let first_unscoped = self
                .entries
                .iter()
                .position(|(s, _)| s.is_empty())
                .unwrap_or(self.entries.len());
            self.entries.insert(first_unscoped, (sources, target));
        }
        true
    }

    fn choose(&self, client: IpAddr) -> Option<&T> {
        self.entries
            .iter()
            .find(|(sources, _)| sources.is_empty() || sources.iter().any(|n| n.contains(&client)))
            .map(|(_, t)| t)
    }

    fn targets(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().map(|(_, t)| t)
    }
}

/// Routes of one SNI listener: exact names, wildcards (`*.apps.<zone>`,
/// matching names of any depth below), routes by the client's address
/// alone, and a default. A name a route has decides first; a connection
/// no named route takes (no name, an unknown name, bytes that are not
/// TLS) goes by its address, then to the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniRoutes<T> {
    exact: HashMap<String, Scoped<T>>,
    /// Suffixes with their leading dot (`.apps.hc1.example.com`), longest
    /// first, so the most specific wildcard wins.
    wildcards: Vec<(String, Scoped<T>)>,
    by_source: Scoped<T>,
    default: Option<T>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("{0} is listed twice")]
    Duplicate(String),
    #[error("{0} is not a host name or a *.wildcard")]
    BadPattern(String),
    #[error("a route needs a name, client addresses or both")]
    Empty,
}

/// One route as the table takes it: a pattern, the client addresses it is
/// for (empty: any), and its target.
pub type RouteEntry<T> = (Option<String>, Vec<IpNet>, T);

impl<T> SniRoutes<T> {
    /// Builds the table; patterns are host names or `*.` followed by one.
    /// A name (or the nameless route) may appear once for any client and
    /// any number of times for given clients.
    pub fn new(
        routes: impl IntoIterator<Item = RouteEntry<T>>,
        default: Option<T>,
    ) -> Result<Self, RouteError> {
        let mut exact: HashMap<String, Scoped<T>> = HashMap::new();
        let mut wildcards: Vec<(String, Scoped<T>)> = Vec::new();
        let mut by_source = Scoped::default();
        for (pattern, sources, target) in routes {
            let Some(pattern) = pattern else {
                if sources.is_empty() {
                    return Err(RouteError::Empty);
                }
                by_source.add(sources, target);
                continue;
            };
            let p = pattern.trim().trim_end_matches('.').to_ascii_lowercase();
            let (is_wild, name) = match p.strip_prefix("*.") {
                Some(rest) => (true, rest.to_string()),
                None => (false, p.clone()),
            };
            // DNS labels of any length; the hello's names are bounded.
            let rules = NameRules {
                lengths: false,
                ..NameRules::DNS
            };
            if !valid_name(&name, rules) {
                return Err(RouteError::BadPattern(pattern));
            }
            let added = if is_wild {
                let suffix = format!(".{name}");
                match wildcards.iter_mut().find(|(s, _)| *s == suffix) {
                    Some((_, scoped)) => scoped.add(sources, target),
                    None => {
                        let mut scoped = Scoped::default();
                        scoped.add(sources, target);
                        wildcards.push((suffix, scoped));
                        true
                    }
                }
            } else {
                exact.entry(name).or_default().add(sources, target)
            };
            if !added {
                return Err(RouteError::Duplicate(pattern));
            }
        }
        wildcards.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        Ok(SniRoutes {
            exact,
            wildcards,
            by_source,
            default,
        })
    }

    /// Every route's target, the default's last.
    pub fn targets(&self) -> impl Iterator<Item = &T> {
        self.exact
            .values()
            .flat_map(Scoped::targets)
            .chain(self.wildcards.iter().flat_map(|(_, t)| t.targets()))
            .chain(self.by_source.targets())
            .chain(self.default.as_ref())
    }

    /// The target for what the peek found from `client`, if any route
    /// takes it. A name whose routes are all for other clients falls
    /// through to the routes by address, as a name no route has does.
    pub fn choose(&self, peek: &Peek, client: IpAddr) -> Option<&T> {
        let client = match client {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
            v4 => v4,
        };
        let named = match peek {
            Peek::Sni(name) => self
                .exact
                .get(name)
                .and_then(|s| s.choose(client))
                .or_else(|| {
                    self.wildcards
                        .iter()
                        .filter(|(s, _)| name.ends_with(s.as_str()))
                        .find_map(|(_, t)| t.choose(client))
                }),
            Peek::NoSni | Peek::NotTls(_) => None,
            Peek::NeedMore => return None,
        };
        named
            .or_else(|| self.by_source.choose(client))
            .or(self.default.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hello::NotTls;

    const ANY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    fn named<T>(n: &str, t: T) -> RouteEntry<T> {
        (Some(n.to_string()), Vec::new(), t)
    }

    fn table() -> SniRoutes<&'static str> {
        SniRoutes::new(
            [
                named("oauth.hc1.example.com", "oauth"),
                named("*.apps.hc1.example.com", "ingress"),
                named("*.special.apps.hc1.example.com", "special"),
                named("console.apps.hc1.example.com", "console"),
            ],
            Some("default"),
        )
        .unwrap()
    }

    fn sni(n: &str) -> Peek {
        Peek::Sni(n.into())
    }

    impl<T> SniRoutes<T> {
        fn choose_any(&self, p: &Peek) -> Option<&T> {
            self.choose(p, ANY)
        }
    }

    fn net(text: &str) -> Vec<IpNet> {
        text.split(',').map(|n| n.parse().unwrap()).collect()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Two clusters behind one port: names first, then the worker's
    /// address for what names no cluster.
    fn shared() -> SniRoutes<&'static str> {
        SniRoutes::new(
            [
                named("api.hc1.example.com", "hc1"),
                named("api.hc2.example.com", "hc2"),
                (Some("kubernetes".into()), net("192.168.50.20/32"), "hc1"),
                (Some("kubernetes".into()), net("192.168.50.30/31"), "hc2"),
                (None, net("192.168.50.20/32"), "hc1"),
                (None, net("192.168.50.30/31,192.168.50.40/32"), "hc2"),
            ],
            None,
        )
        .unwrap()
    }

    #[test]
    fn a_name_decides_before_the_address_and_no_name_goes_by_address() {
        let t = shared();
        let hc1_worker = ip("192.168.50.20");
        let hc2_worker = ip("192.168.50.31");
        // hc1's worker asking for hc2's API by name gets hc2's.
        assert_eq!(
            t.choose(&sni("api.hc2.example.com"), hc1_worker),
            Some(&"hc2")
        );
        assert_eq!(t.choose(&Peek::NoSni, hc1_worker), Some(&"hc1"));
        assert_eq!(t.choose(&Peek::NoSni, hc2_worker), Some(&"hc2"));
        assert_eq!(t.choose(&Peek::NoSni, ip("192.168.50.40")), Some(&"hc2"));
        assert_eq!(t.choose(&sni("kubernetes"), hc1_worker), Some(&"hc1"));
        assert_eq!(t.choose(&sni("kubernetes"), hc2_worker), Some(&"hc2"));
        // An unknown name from a worker is its cluster's, as a name-less
        // hello is; from anyone else nothing takes it.
        assert_eq!(t.choose(&sni("10.0.0.1.nip.io"), hc2_worker), Some(&"hc2"));
        assert_eq!(t.choose(&Peek::NoSni, ip("192.168.50.99")), None);
        assert_eq!(t.choose(&sni("kubernetes"), ip("192.168.50.99")), None);
        assert_eq!(
            t.choose(&Peek::NotTls(NotTls::NotHandshake), hc1_worker),
            Some(&"hc1")
        );
        // IPv4-mapped clients match IPv4 sources.
        assert_eq!(
            t.choose(&Peek::NoSni, ip("::ffff:192.168.50.20")),
            Some(&"hc1")
        );
    }

    #[test]
    fn a_name_for_any_client_backs_its_scoped_routes() {
        let t = SniRoutes::new(
            [
                (Some("kubernetes".into()), net("10.1.0.0/16"), "scoped"),
                named("kubernetes", "any"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            t.choose(&sni("kubernetes"), ip("10.1.2.3")),
            Some(&"scoped")
        );
        assert_eq!(t.choose(&sni("kubernetes"), ip("10.2.2.3")), Some(&"any"));
        assert_eq!(
            SniRoutes::<u8>::new([(None, Vec::new(), 1)], None),
            Err(RouteError::Empty)
        );
    }
    #[test]
    fn exact_beats_wildcard_and_the_longest_wildcard_wins() {
        let t = table();
        assert_eq!(t.choose_any(&sni("oauth.hc1.example.com")), Some(&"oauth"));
        assert_eq!(
            t.choose_any(&sni("console.apps.hc1.example.com")),
            Some(&"console")
        );
        assert_eq!(
            t.choose_any(&sni("a.b.apps.hc1.example.com")),
            Some(&"ingress")
        );
        assert_eq!(
            t.choose_any(&sni("x.special.apps.hc1.example.com")),
            Some(&"special")
        );
    }

    #[test]
    fn the_default_takes_no_sni_non_tls_and_unknown_names() {
        let t = table();
        assert_eq!(t.choose_any(&Peek::NoSni), Some(&"default"));
        assert_eq!(
            t.choose_any(&Peek::NotTls(NotTls::NotHandshake)),
            Some(&"default")
        );
        assert_eq!(t.choose_any(&sni("apps.hc1.example.com")), Some(&"default"));
        assert_eq!(
            t.choose_any(&sni("evil-apps.hc1.example.com")),
            Some(&"default")
        );
        assert_eq!(t.choose_any(&Peek::NeedMore), None);
        let no_default = SniRoutes::new([named("a.b", 1)], None).unwrap();
        assert_eq!(no_default.choose_any(&sni("c.d")), None);
    }

    #[test]
    fn bad_and_duplicate_patterns_are_refused() {
        assert_eq!(
            SniRoutes::new([named("a.b", 1), named("A.B.", 2)], None),
            Err(RouteError::Duplicate("A.B.".into()))
        );
        assert_eq!(
            SniRoutes::new([named("*.", 1)], None),
            Err(RouteError::BadPattern("*.".into()))
        );
        assert_eq!(
            SniRoutes::new([named("a..b", 1)], None),
            Err(RouteError::BadPattern("a..b".into()))
        );
    }
}
