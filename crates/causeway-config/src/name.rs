//! Host and DNS names, checked one way for the whole product: a name is
//! labels separated by dots, each label letters, digits and hyphens. How a
//! use differs (underscores, hyphens at a label's edge, a leading `*`, the
//! 63- and 253-byte limits) is stated in its [`NameRules`], not in a copy
//! of the loop. Callers strip a trailing dot where they allow one.

/// What a name may hold beyond letters, digits and inner hyphens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameRules {
    /// `_` may stand in a label, as in DNS owner names (`_sip._tcp`) and
    /// the server names clients send; RFC 1123 host names refuse it.
    pub underscore: bool,
    /// A label may begin or end with `-`, as DNS allows; host names do not.
    pub edge_hyphens: bool,
    /// The first label may be `*` alone, a wildcard.
    pub wildcard: bool,
    /// Labels are at most 63 bytes and the name at most 253.
    pub lengths: bool,
}

impl NameRules {
    /// RFC 1123 host names: letters, digits and inner hyphens, within the
    /// DNS lengths.
    pub const HOST: NameRules = NameRules {
        underscore: false,
        edge_hyphens: false,
        wildcard: false,
        lengths: true,
    };
    /// DNS names as clients send them: any label of letters, digits, `-`
    /// and `_`, within the DNS lengths.
    pub const DNS: NameRules = NameRules {
        underscore: true,
        edge_hyphens: true,
        wildcard: false,
        lengths: true,
    };
}

/// Whether `label` (one label, no dot) is a label under `rules`.
pub fn valid_label(label: &str, rules: NameRules) -> bool {
    !label.is_empty()
        && (!rules.lengths || label.len() <= 63)
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || (rules.underscore && b == b'_'))
        && (rules.edge_hyphens || !(label.starts_with('-') || label.ends_with('-')))
}

/// Whether `name` (its labels separated by dots, no trailing dot) is a
/// name under `rules`.
pub fn valid_name(name: &str, rules: NameRules) -> bool {
    !name.is_empty()
        && (!rules.lengths || name.len() <= 253)
        && name.split('.').enumerate().all(|(i, label)| {
            (rules.wildcard && i == 0 && label == "*") || valid_label(label, rules)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_letters_digits_and_inner_hyphens() {
        assert!(valid_name("api.hc1.example.com", NameRules::HOST));
        assert!(valid_name("node-1", NameRules::HOST));
        assert!(!valid_name("-node", NameRules::HOST));
        assert!(!valid_name("node-.lab", NameRules::HOST));
        assert!(!valid_name("_sip.lab", NameRules::HOST));
        assert!(!valid_name("a..b", NameRules::HOST));
        assert!(!valid_name("", NameRules::HOST));
        assert!(!valid_name("*.apps", NameRules::HOST));
        assert!(!valid_label("a.b", NameRules::HOST));
        assert!(valid_label(&"a".repeat(63), NameRules::HOST));
        assert!(!valid_label(&"a".repeat(64), NameRules::HOST));
        let long = vec!["a".repeat(63); 4].join(".");
        assert_eq!(long.len(), 255);
        assert!(!valid_name(&long, NameRules::HOST));
        assert!(valid_name(&long[..253], NameRules::HOST));
    }

    #[test]
    fn each_rule_widens_one_thing() {
        assert!(valid_name("_sip._tcp.lab", NameRules::DNS));
        assert!(valid_name("-odd-.lab", NameRules::DNS));
        assert!(!valid_name("*.apps.lab", NameRules::DNS));
        let wild = NameRules {
            wildcard: true,
            ..NameRules::DNS
        };
        assert!(valid_name("*.apps.lab", wild));
        assert!(valid_name("*", wild));
        assert!(!valid_name("apps.*.lab", wild));
        let unbounded = NameRules {
            lengths: false,
            ..NameRules::DNS
        };
        assert!(valid_name(&"a".repeat(300), unbounded));
        assert!(!valid_name(&"a".repeat(300), NameRules::DNS));
    }
}
