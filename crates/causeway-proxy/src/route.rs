//! Choosing where a connection goes from the name its ClientHello carries.

use std::collections::HashMap;

use causeway_config::{valid_name, NameRules};

use crate::hello::Peek;

/// Routes of one SNI listener: exact names, wildcards (`*.apps.<zone>`,
/// matching names of any depth below), and a default for a hello without a
/// name or bytes that are not TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniRoutes<T> {
    exact: HashMap<String, T>,
    /// Suffixes with their leading dot (`.apps.hc1.example.com`), longest
    /// first, so the most specific wildcard wins.
    wildcards: Vec<(String, T)>,
    default: Option<T>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("{0} is listed twice")]
    Duplicate(String),
    #[error("{0} is not a host name or a *.wildcard")]
    BadPattern(String),
}

impl<T> SniRoutes<T> {
    /// Builds the table from `(pattern, target)` pairs; patterns are host
    /// names or `*.` followed by one.
    pub fn new(
        routes: impl IntoIterator<Item = (String, T)>,
        default: Option<T>,
    ) -> Result<Self, RouteError> {
        let mut exact = HashMap::new();
        let mut wildcards: Vec<(String, T)> = Vec::new();
        for (pattern, target) in routes {
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
            let valid = valid_name(&name, rules);
            if !valid {
                return Err(RouteError::BadPattern(pattern));
            }
            if is_wild {
                let suffix = format!(".{name}");
                if wildcards.iter().any(|(s, _)| *s == suffix) {
                    return Err(RouteError::Duplicate(pattern));
                }
                wildcards.push((suffix, target));
            } else if exact.insert(name, target).is_some() {
                return Err(RouteError::Duplicate(pattern));
            }
        }
        wildcards.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        Ok(SniRoutes {
            exact,
            wildcards,
            default,
        })
    }

    /// Every route's target, the default's last.
    pub fn targets(&self) -> impl Iterator<Item = &T> {
        self.exact
            .values()
            .chain(self.wildcards.iter().map(|(_, t)| t))
            .chain(self.default.as_ref())
    }

    /// The target for what the peek found, if any route takes it.
    pub fn choose(&self, peek: &Peek) -> Option<&T> {
        match peek {
            Peek::Sni(name) => self
                .exact
                .get(name)
                .or_else(|| {
                    self.wildcards
                        .iter()
                        .find(|(s, _)| name.ends_with(s.as_str()))
                        .map(|(_, t)| t)
                })
                .or(self.default.as_ref()),
            Peek::NoSni | Peek::NotTls(_) => self.default.as_ref(),
            Peek::NeedMore => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hello::NotTls;

    fn table() -> SniRoutes<&'static str> {
        SniRoutes::new(
            [
                ("oauth.hc1.example.com".to_string(), "oauth"),
                ("*.apps.hc1.example.com".to_string(), "ingress"),
                ("*.special.apps.hc1.example.com".to_string(), "special"),
                ("console.apps.hc1.example.com".to_string(), "console"),
            ],
            Some("default"),
        )
        .unwrap()
    }

    fn sni(n: &str) -> Peek {
        Peek::Sni(n.into())
    }

    #[test]
    fn exact_beats_wildcard_and_the_longest_wildcard_wins() {
        let t = table();
        assert_eq!(t.choose(&sni("oauth.hc1.example.com")), Some(&"oauth"));
        assert_eq!(
            t.choose(&sni("console.apps.hc1.example.com")),
            Some(&"console")
        );
        assert_eq!(t.choose(&sni("a.b.apps.hc1.example.com")), Some(&"ingress"));
        assert_eq!(
            t.choose(&sni("x.special.apps.hc1.example.com")),
            Some(&"special")
        );
    }

    #[test]
    fn the_default_takes_no_sni_non_tls_and_unknown_names() {
        let t = table();
        assert_eq!(t.choose(&Peek::NoSni), Some(&"default"));
        assert_eq!(
            t.choose(&Peek::NotTls(NotTls::NotHandshake)),
            Some(&"default")
        );
        assert_eq!(t.choose(&sni("apps.hc1.example.com")), Some(&"default"));
        assert_eq!(
            t.choose(&sni("evil-apps.hc1.example.com")),
            Some(&"default")
        );
        assert_eq!(t.choose(&Peek::NeedMore), None);
        let no_default = SniRoutes::new([("a.b".to_string(), 1)], None).unwrap();
        assert_eq!(no_default.choose(&sni("c.d")), None);
    }

    #[test]
    fn bad_and_duplicate_patterns_are_refused() {
        assert_eq!(
            SniRoutes::new([("a.b".to_string(), 1), ("A.B.".to_string(), 2)], None),
            Err(RouteError::Duplicate("A.B.".into()))
        );
        assert_eq!(
            SniRoutes::new([("*.".to_string(), 1)], None),
            Err(RouteError::BadPattern("*.".into()))
        );
        assert_eq!(
            SniRoutes::new([("a..b".to_string(), 1)], None),
            Err(RouteError::BadPattern("a..b".into()))
        );
    }
}
