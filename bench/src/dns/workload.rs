// What the DNS bench asks: either a dnsperf-format query file replayed in a
// loop, or a generated mix of local, cached and missed names. Every query
// is prepared once as a complete packet; the few names that must be unique
// per query get random hex digits patched into a fixed-width label, so the
// send loop only copies bytes.

use std::fmt;
use std::str::FromStr;

use super::wire::{self, QueryFlags, WireError, HEADER_LEN, MAX_QUERY_LEN};

/// The hosted cluster's fixed names (causeway-config's PROXIED_NAMES).
pub const LOCAL_NAMES: &[&str] = &["api", "api-int", "oauth", "ignition", "konnectivity"];
/// Hex digits in a generated label: `x<8>.apps.<zone>`, `m<16>.<domain>`.
const WILDCARD_DIGITS: usize = 8;
const MISS_DIGITS: usize = 16;

/// xorshift64*: IDs and random labels only need to differ between runs and
/// queries, not to be unguessable.
pub struct Rng(u64);

impl Rng {
    pub fn seeded() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self::new(t ^ (u64::from(std::process::id()) << 32))
    }

    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn next_u16(&mut self) -> u16 {
        (self.next_u64() >> 48) as u16
    }

    /// Uniform enough in `0..n` for n far below 2^32.
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// One prepared query (ID zero).
#[derive(Debug, Clone)]
pub struct Template {
    packet: Vec<u8>,
    qname_len: usize,
    qtype: u16,
    /// Question hash when the name is fixed.
    hash: u64,
    /// Hex digits to randomise: offset in `packet` and count.
    random: Option<(usize, usize)>,
}

impl Template {
    pub fn new(name: &str, qtype: u16, flags: QueryFlags) -> Result<Self, WireError> {
        let mut qname = Vec::with_capacity(64);
        wire::encode_name(name, &mut qname)?;
        Ok(Self {
            hash: wire::question_hash(&qname, qtype),
            packet: wire::build_query(&qname, qtype, flags),
            qname_len: qname.len(),
            qtype,
            random: None,
        })
    }

    /// `<prefix><digits random hex>.<suffix>`, different for every query.
    fn random_label(
        prefix: &str,
        digits: usize,
        suffix: &str,
        qtype: u16,
        flags: QueryFlags,
    ) -> Result<Self, WireError> {
        let placeholder = "0".repeat(digits);
        let mut t = Self::new(&format!("{prefix}{placeholder}.{suffix}"), qtype, flags)?;
        // Header, then the first label's length byte, then the prefix.
        t.random = Some((HEADER_LEN + 1 + prefix.len(), digits));
        Ok(t)
    }

    /// Writes the query into `buf` and returns its length and question hash.
    fn write(&self, rng: &mut Rng, buf: &mut [u8; MAX_QUERY_LEN]) -> (usize, u64) {
        let len = self.packet.len();
        buf[..len].copy_from_slice(&self.packet);
        match self.random {
            None => (len, self.hash),
            Some((at, digits)) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut r = rng.next_u64();
                for b in &mut buf[at..at + digits] {
                    *b = HEX[(r & 15) as usize];
                    r >>= 4;
                    if r == 0 {
                        r = rng.next_u64();
                    }
                }
                let qname = &buf[HEADER_LEN..HEADER_LEN + self.qname_len];
                (len, wire::question_hash(qname, self.qtype))
            }
        }
    }
}

/// A generated query class of `--mix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixClass {
    Local,
    Cached,
    Miss,
}

impl MixClass {
    pub fn name(self) -> &'static str {
        match self {
            MixClass::Local => "local",
            MixClass::Cached => "cached",
            MixClass::Miss => "miss",
        }
    }
}

/// `--mix local=70,cached=20,miss=10`: relative weights, any subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix(pub Vec<(MixClass, u32)>);

impl FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out: Vec<(MixClass, u32)> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected class=weight, e.g. local=70"))?;
            let class = match k.trim() {
                "local" => MixClass::Local,
                "cached" => MixClass::Cached,
                "miss" => MixClass::Miss,
                other => {
                    return Err(format!(
                        "unknown class {other:?}: use local, cached and/or miss"
                    ))
                }
            };
            let w: u32 = v
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: weight must be a whole number"))?;
            if out.iter().any(|(c, _)| *c == class) {
                return Err(format!("{} given twice", class.name()));
            }
            out.push((class, w));
        }
        out.retain(|&(_, w)| w > 0);
        if out.is_empty() {
            return Err("the mix needs at least one class with a weight above 0".into());
        }
        if out.iter().map(|&(_, w)| u64::from(w)).sum::<u64>() > u64::from(u32::MAX) {
            return Err("weights too large".into());
        }
        Ok(Mix(out))
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (c, w)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={w}", c.name())?;
        }
        Ok(())
    }
}

struct Class {
    weight: u32,
    templates: Vec<Template>,
    next: usize,
}

/// The query source of a run: classes picked by weight, each cycling
/// through its templates in order.
pub struct Workload {
    classes: Vec<Class>,
    total_weight: u32,
    description: String,
}

impl Workload {
    /// Replays dnsperf-format lines ("name TYPE") in order, forever.
    pub fn from_queries(text: &str, flags: QueryFlags) -> Result<Self, String> {
        let templates = parse_queries(text, flags)?;
        let description = format!("{} queries from file, cycled", templates.len());
        Ok(Self {
            classes: vec![Class {
                weight: 1,
                templates,
                next: 0,
            }],
            total_weight: 1,
            description,
        })
    }

    /// local: the cluster names under `zone` and `x<hex>.apps.<zone>`
    /// (half each); cached: `h0..h<cached_names-1>.<forward_domain>`,
    /// cycled so every name repeats; miss: `m<16 hex>.<forward_domain>`,
    /// unique per query. All type A.
    pub fn generated(
        mix: &Mix,
        zone: &str,
        forward_domain: &str,
        cached_names: u32,
        flags: QueryFlags,
    ) -> Result<Self, String> {
        let zone = zone.trim_end_matches('.');
        let fwd = forward_domain.trim_end_matches('.');
        let err = |name: &str, e: WireError| format!("{name}: {e}");
        let mut classes = Vec::new();
        for &(class, weight) in &mix.0 {
            let templates = match class {
                MixClass::Local => {
                    let mut t = Vec::new();
                    for n in LOCAL_NAMES {
                        let name = format!("{n}.{zone}");
                        t.push(Template::new(&name, 1, flags).map_err(|e| err(&name, e))?);
                    }
                    let apps = format!("apps.{zone}");
                    let wild = Template::random_label("x", WILDCARD_DIGITS, &apps, 1, flags)
                        .map_err(|e| err(&apps, e))?;
                    t.extend(std::iter::repeat_n(wild, LOCAL_NAMES.len()));
                    t
                }
                MixClass::Cached => (0..cached_names.max(1))
                    .map(|i| {
                        let name = format!("h{i}.{fwd}");
                        Template::new(&name, 1, flags).map_err(|e| err(&name, e))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                MixClass::Miss => vec![Template::random_label("m", MISS_DIGITS, fwd, 1, flags)
                    .map_err(|e| err(fwd, e))?],
            };
            classes.push(Class {
                weight,
                templates,
                next: 0,
            });
        }
        let description = format!(
            "mix {mix} (local: *.{zone}, cached: {} names h<N>.{fwd}, miss: m<hex>.{fwd})",
            cached_names.max(1)
        );
        Ok(Self {
            total_weight: classes.iter().map(|c| c.weight).sum(),
            classes,
            description,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Writes the next query into `buf`: (length, question hash).
    pub fn next_query(&mut self, rng: &mut Rng, buf: &mut [u8; MAX_QUERY_LEN]) -> (usize, u64) {
        let idx = if self.classes.len() == 1 {
            0
        } else {
            let mut r = rng.below(self.total_weight);
            let mut i = 0;
            while i + 1 < self.classes.len() && r >= self.classes[i].weight {
                r -= self.classes[i].weight;
                i += 1;
            }
            i
        };
        let class = &mut self.classes[idx];
        let t = &class.templates[class.next];
        class.next = (class.next + 1) % class.templates.len();
        t.write(rng, buf)
    }
}

/// dnsperf's input format: "name TYPE" per line; blank lines and lines
/// starting with ';' or '#' are skipped; a missing type means A.
pub fn parse_queries(text: &str, flags: QueryFlags) -> Result<Vec<Template>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default();
        let qtype = match words.next() {
            Some(t) => wire::parse_qtype(t).map_err(|e| format!("line {}: {e}", i + 1))?,
            None => 1,
        };
        if words.next().is_some() {
            return Err(format!(
                "line {}: expected \"name TYPE\", got {line:?}",
                i + 1
            ));
        }
        out.push(Template::new(name, qtype, flags).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    if out.is_empty() {
        return Err("no queries in the file".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::wire::{parse_response, question_hash};

    const FLAGS: QueryFlags = QueryFlags {
        rd: true,
        edns: false,
    };

    /// The presentation name of a query packet.
    fn qname(p: &[u8]) -> String {
        let mut i = HEADER_LEN;
        let mut labels = Vec::new();
        while p[i] != 0 {
            let n = p[i] as usize;
            labels.push(String::from_utf8(p[i + 1..i + 1 + n].to_vec()).unwrap());
            i += 1 + n;
        }
        labels.join(".")
    }

    /// Turns a query into a response and checks the hash the parser sees
    /// is the one the generator returned.
    fn check_roundtrip(buf: &[u8], hash: u64) {
        let mut r = buf.to_vec();
        r[2] |= 0x80;
        assert_eq!(parse_response(&r).unwrap().question, Some(hash));
    }

    #[test]
    fn mixes_parse() {
        let m: Mix = "local=70, cached=20,miss=10".parse().unwrap();
        assert_eq!(
            m.0,
            vec![
                (MixClass::Local, 70),
                (MixClass::Cached, 20),
                (MixClass::Miss, 10)
            ]
        );
        assert_eq!(m.to_string(), "local=70,cached=20,miss=10");
        assert_eq!("cached=1,miss=0".parse::<Mix>().unwrap().0.len(), 1);
        assert!("local".parse::<Mix>().is_err());
        assert!("local=x".parse::<Mix>().is_err());
        assert!("remote=1".parse::<Mix>().is_err());
        assert!("local=1,local=2".parse::<Mix>().is_err());
        assert!("local=0".parse::<Mix>().is_err());
        assert!("".parse::<Mix>().is_err());
    }

    #[test]
    fn query_files_parse() {
        let t = parse_queries(
            "; comment\napi.hc1.example.com A\n\nwww.example.net   AAAA\nbare.example.net\n",
            FLAGS,
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(qname(&t[1].packet), "www.example.net");
        assert_eq!(t[1].qtype, 28);
        assert_eq!(t[2].qtype, 1);
        let e = parse_queries("a.example A\nb..example A\n", FLAGS).unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        assert!(parse_queries("a.example BOGUS\n", FLAGS).is_err());
        assert!(parse_queries("a A extra\n", FLAGS).is_err());
        assert!(parse_queries("# nothing\n", FLAGS).is_err());
    }

    #[test]
    fn file_workload_cycles_in_order() {
        let mut w = Workload::from_queries("a.example A\nb.example MX\n", FLAGS).unwrap();
        let mut rng = Rng::new(1);
        let mut buf = [0u8; MAX_QUERY_LEN];
        let mut names = Vec::new();
        for _ in 0..5 {
            let (len, hash) = w.next_query(&mut rng, &mut buf);
            check_roundtrip(&buf[..len], hash);
            names.push(qname(&buf[..len]));
        }
        assert_eq!(
            names,
            [
                "a.example",
                "b.example",
                "a.example",
                "b.example",
                "a.example"
            ]
        );
    }

    #[test]
    fn generated_mix_has_the_right_names() {
        let mix: Mix = "local=50,cached=30,miss=20".parse().unwrap();
        let mut w =
            Workload::generated(&mix, "hc1.example.com.", "example.net", 100, FLAGS).unwrap();
        let mut rng = Rng::new(42);
        let mut buf = [0u8; MAX_QUERY_LEN];
        let (mut local, mut cached, mut miss) = (0i32, 0i32, 0i32);
        let mut cached_seen = std::collections::HashSet::new();
        let mut miss_seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let (len, hash) = w.next_query(&mut rng, &mut buf);
            check_roundtrip(&buf[..len], hash);
            let name = qname(&buf[..len]);
            if let Some(host) = name.strip_suffix(".hc1.example.com") {
                local += 1;
                let ok = LOCAL_NAMES.contains(&host)
                    || host.strip_suffix(".apps").is_some_and(|x| {
                        x.len() == 9
                            && x.starts_with('x')
                            && x[1..].bytes().all(|b| b.is_ascii_hexdigit())
                    });
                assert!(ok, "{name}");
            } else if let Some(h) = name.strip_suffix(".example.net") {
                if h.starts_with('h') {
                    cached += 1;
                    cached_seen.insert(h.to_string());
                } else {
                    assert_eq!(h.len(), 17, "{name}");
                    assert!(h.starts_with('m'));
                    miss += 1;
                    assert!(miss_seen.insert(h.to_string()), "miss name repeated");
                }
            } else {
                panic!("unexpected name {name}");
            }
        }
        assert_eq!(cached_seen.len(), 100);
        for (got, want) in [(local, 5000), (cached, 3000), (miss, 2000)] {
            assert!((got - want).abs() < 300, "{got} vs {want}");
        }
    }

    #[test]
    fn random_label_hash_matches_patched_name() {
        let t = Template::random_label("m", 16, "example.net", 1, FLAGS).unwrap();
        let mut rng = Rng::new(7);
        let mut buf = [0u8; MAX_QUERY_LEN];
        let (len, hash) = t.write(&mut rng, &mut buf);
        let mut name = Vec::new();
        wire::encode_name(&qname(&buf[..len]), &mut name).unwrap();
        assert_eq!(hash, question_hash(&name, 1));
        assert_ne!(hash, t.hash, "the placeholder name is never sent");
    }

    #[test]
    fn rng_below_stays_in_range() {
        let mut rng = Rng::new(3);
        for n in [1, 2, 3, 100, 1000] {
            for _ in 0..1000 {
                assert!(rng.below(n) < n);
            }
        }
    }
}
