//! No crate's modules import each other in a circle.
//!
//! For every crate under `crates/` and `bench/`, the module tree is read from
//! its `src/lib.rs` and `src/main.rs` down through `mod` declarations
//! (`#[path]` included). Every path that starts with `crate::`, `super::` or
//! `self::` (in `use` items, `use` groups such as `use crate::{a, b::c}`, and
//! in code) is resolved to the module it names, following `use` re-exports
//! such as the `pub use server::Error` of a `lib.rs`. A reference from module
//! `x::a::…` to `x::b::…` is an edge `a -> b` among the children of `x`; a
//! circle among siblings fails the test and is printed with the line behind
//! each edge.
//!
//! It reads text, not the compiler's view: a `use` whose first segment is a
//! child module (`use server::Error` in `lib.rs`) counts, a name reached only
//! through a glob re-export does not.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates whose circles are known and being taken apart: their circles are
/// printed but do not fail the test. Empty since the operator split: a
/// crate goes here only with an issue that takes its circle apart.
const KNOWN_CIRCLES: &[&str] = &[];

#[test]
fn no_crate_has_a_use_circle_between_its_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    crate_dirs.push(root.join("bench"));
    crate_dirs.sort();

    let mut failures = Vec::new();
    let mut checked = 0;
    for dir in crate_dirs.iter().filter(|d| d.join("Cargo.toml").is_file()) {
        let name = package_name(&dir.join("Cargo.toml"));
        let files = read_sources(&dir.join("src"));
        for crate_root in ["lib.rs", "main.rs"] {
            if !files.contains_key(crate_root) {
                continue;
            }
            checked += 1;
            let circles = circles(&files, crate_root);
            if circles.is_empty() {
                continue;
            }
            let report = format!("{name} (src/{crate_root}):\n{}", circles.join("\n"));
            if KNOWN_CIRCLES.contains(&name.as_str()) {
                eprintln!("known circles, to be taken apart:\n{report}");
            } else {
                failures.push(report);
            }
        }
    }
    assert!(
        checked >= 9,
        "only {checked} crate roots found under {root:?}"
    );
    assert!(
        failures.is_empty(),
        "modules import each other in a circle:\n{}",
        failures.join("\n")
    );
}

/// Directions the operator's layout promises (docs/architecture.md): the
/// Infra side and the DPF bridge never reach into each other, and the shared layers
/// (`k8s`, `hosted`) know neither controller.
const OPERATOR_NEVER: &[(&str, &str)] = &[
    ("infra", "dpf"),
    ("dpf", "infra"),
    ("k8s", "infra"),
    ("k8s", "dpf"),
    ("k8s", "hosted"),
    ("hosted", "infra"),
    ("hosted", "dpf"),
];

/// The edges of `OPERATOR_NEVER` found among the crate root's children.
fn broken_directions(files: &BTreeMap<String, String>) -> Vec<String> {
    let graphs = sibling_edges(files, "lib.rs");
    let top = graphs.get(&Vec::new()).cloned().unwrap_or_default();
    OPERATOR_NEVER
        .iter()
        .filter_map(|(from, to)| {
            top.get(&(from.to_string(), to.to_string()))
                .map(|at| format!("  {from} -> {to}: {at}"))
        })
        .collect()
}

#[test]
fn the_operator_keeps_its_directions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../causeway-operator/src");
    let files = read_sources(&root);
    assert!(
        files.contains_key("lib.rs"),
        "no operator sources at {root:?}"
    );
    let broken = broken_directions(&files);
    assert!(
        broken.is_empty(),
        "the operator's modules import against its layout:\n{}",
        broken.join("\n")
    );
}

/// The operator's pure modules: what they decide is tested without an API
/// server, so none of them may reach one (docs/architecture.md).
const OPERATOR_PURE: &[&str] = &[
    "dpf/plan.rs",
    "dpf/spec.rs",
    "dpf/render.rs",
    "dpf/status.rs",
    "dpf/csr.rs",
    "dpf/events.rs",
    "dpf/bfcfg/mod.rs",
    "hosted/facts.rs",
    "infra/plan.rs",
    "infra/render.rs",
    "infra/status.rs",
    "infra/validate.rs",
    "k8s/conditions.rs",
    "k8s/drift.rs",
];

/// The lines of a pure module that name a client, an API handle or an
/// await: each a way to read or write the cluster.
fn impure_lines(source: &str) -> Vec<String> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| {
            line.contains(".await")
                || line.contains("Api<")
                || line
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|word| word == "Client")
        })
        .map(|(n, line)| format!("{}: {}", n + 1, line.trim()))
        .collect()
}

#[test]
fn the_operators_pure_modules_name_no_client() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../causeway-operator/src");
    let files = read_sources(&root);
    let mut found = Vec::new();
    for module in OPERATOR_PURE {
        let source = files
            .get(*module)
            .unwrap_or_else(|| panic!("pure module {module} not found under {root:?}"));
        found.extend(
            impure_lines(source)
                .into_iter()
                .map(|l| format!("  {module}:{l}")),
        );
    }
    assert!(
        found.is_empty(),
        "pure modules reach the API server:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_purity_check_finds_a_client_an_api_and_an_await() {
    let source = "use kube::Client;\n// a Client in a comment is fine\nfn f(a: Api<Pod>) {}\nasync fn g() { h().await }\nstruct ClientHello;\n";
    let lines = impure_lines(source);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].starts_with("1: "), "{lines:?}");
}

#[test]
fn the_direction_check_finds_an_infra_module_importing_dpf() {
    let files = tree(&[
        ("lib.rs", "pub mod infra;\npub mod dpf;\npub mod hosted;\n"),
        ("infra/mod.rs", "pub mod ingress;\n"),
        ("infra/ingress.rs", "use crate::dpf::access::client;\n"),
        ("dpf/mod.rs", "pub mod access;\n"),
        (
            "dpf/access.rs",
            "use crate::hosted::Endpoint;\npub fn client() {}\n",
        ),
        ("hosted.rs", "pub struct Endpoint;\n"),
    ]);
    let broken = broken_directions(&files);
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(broken[0].starts_with("  infra -> dpf: "), "{broken:?}");
}

#[test]
fn the_checker_finds_a_circle_and_prints_it() {
    let files = tree(&[
        (
            "lib.rs",
            "mod server;\nmod wire;\nmod conn;\npub use server::Shared;\n",
        ),
        (
            "server.rs",
            "use crate::conn::handle;\npub struct Shared;\n",
        ),
        // Reaches server through the root's re-export and a group.
        (
            "conn.rs",
            "use crate::{wire::parse, Shared};\npub fn handle(_: &Shared) {}\n",
        ),
        ("wire.rs", "/* crate::server::x */ pub fn parse() {}\n"),
    ]);
    let found = circles(&files, "lib.rs");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("conn -> server -> conn")
            || found[0].contains("server -> conn -> server"),
        "{}",
        found[0]
    );
    assert!(found[0].contains("conn.rs:1"), "{}", found[0]);
    assert!(found[0].contains("server.rs:1"), "{}", found[0]);

    // The same tree with the edge turned the other way has no circle; a
    // comment naming a module is no edge.
    let files = tree(&[
        ("lib.rs", "mod server;\nmod wire;\nmod conn;\n"),
        ("server.rs", "use crate::conn::handle;\n"),
        ("conn.rs", "use crate::wire::parse;\n"),
        ("wire.rs", "// use crate::server;\n"),
    ]);
    assert_eq!(circles(&files, "lib.rs"), Vec::<String>::new());
}

#[test]
fn the_checker_follows_super_and_nested_modules() {
    let files = tree(&[
        ("main.rs", "mod dns;\nmod stats;\n"),
        ("dns.rs", "mod wire;\nmod floor;\n"),
        // A child's reference counts for its parent: dns -> stats.
        ("dns/wire.rs", "use super::super::stats::Summary;\n"),
        // Siblings under dns, one way only: floor -> wire.
        ("dns/floor.rs", "use super::wire;\n"),
        // An inline test module's reference counts for its file: stats -> dns.
        (
            "stats.rs",
            "pub struct Summary;\n#[cfg(test)]\nmod tests {\n    use crate::dns::floor;\n}\n",
        ),
    ]);
    let found = circles(&files, "main.rs");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("among the children of `crate`"),
        "{}",
        found[0]
    );
    assert!(found[0].contains("stats.rs:4"), "{}", found[0]);

    // #[path] modules are read from the file named.
    let files = tree(&[
        ("lib.rs", "mod engine;\nmod store;\n"),
        (
            "engine.rs",
            "#[cfg(test)]\n#[path = \"engine_tests.rs\"]\nmod tests;\n",
        ),
        ("engine_tests.rs", "use crate::store::Log;\n"),
        ("store.rs", "use crate::engine::Engine;\n"),
    ]);
    let found = circles(&files, "lib.rs");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("engine_tests.rs:1"), "{}", found[0]);
}

fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect()
}

fn package_name(manifest: &Path) -> String {
    let text = std::fs::read_to_string(manifest).unwrap();
    text.lines()
        .find_map(|line| {
            let value = line.trim().strip_prefix("name")?.trim().strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| manifest.display().to_string())
}

/// Every `.rs` file below `src`, by its path relative to `src` (with `/`).
fn read_sources(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).unwrap().to_string_lossy();
                let rel = rel.replace('\\', "/");
                out.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    if src.is_dir() {
        walk(src, src, &mut out);
    }
    out
}

// ---- The checker: module tree, references, circles. ----

type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    PathSep,
    Punct(char),
}

/// A path met in a file: absolute from the crate root, with where it stands.
struct Reference {
    from: ModPath,
    path: ModPath,
    at: String,
}

/// A `use` binding: in module `module`, `name` stands for `target`.
struct Alias {
    module: ModPath,
    name: String,
    target: ModPath,
}

#[derive(Default)]
struct Crate {
    modules: BTreeSet<ModPath>,
    references: Vec<Reference>,
    aliases: Vec<Alias>,
}

/// The circles among sibling modules of the crate rooted at `root` (a key of
/// `files`), one line each: the parent, the circle, and the line behind each
/// edge of it. Empty when there are none.
fn circles(files: &BTreeMap<String, String>, root: &str) -> Vec<String> {
    let graphs = sibling_edges(files, root);
    let mut found = Vec::new();
    for (parent, edges) in &graphs {
        for (group, cycle) in cycles_in(edges) {
            let mut line = format!(
                "  among the children of `{}`, {} reach each other; one circle: {}",
                if parent.is_empty() {
                    "crate".to_string()
                } else {
                    parent.join("::")
                },
                group.join(", "),
                cycle.join(" -> ")
            );
            for pair in cycle.windows(2) {
                let at = &edges[&(pair[0].clone(), pair[1].clone())];
                line.push_str(&format!("\n    {} -> {}: {at}", pair[0], pair[1]));
            }
            found.push(line);
        }
    }
    found
}

/// Every edge among sibling modules, keyed by their parent (empty for the
/// crate root), with the first line seen behind each.
fn sibling_edges(
    files: &BTreeMap<String, String>,
    root: &str,
) -> BTreeMap<ModPath, BTreeMap<(String, String), String>> {
    let mut krate = Crate::default();
    krate.modules.insert(Vec::new());
    // Modules first (a relative `use` needs to know them), then references.
    let mut parsed = Vec::new();
    let mut pending = vec![(root.to_string(), ModPath::new())];
    while let Some((file, module)) = pending.pop() {
        let Some(text) = files.get(&file) else {
            continue;
        };
        let (tokens, lines) = lex(text);
        for (child_file, child) in declared_modules(&file, &module, &tokens, &mut krate.modules) {
            pending.push((child_file, child));
        }
        parsed.push((file, module, tokens, lines));
    }
    for (file, module, tokens, lines) in &parsed {
        collect_references(file, module, tokens, lines, &mut krate);
    }

    // Edges among siblings, keyed by their parent; the first line seen for each.
    let mut graphs: BTreeMap<ModPath, BTreeMap<(String, String), String>> = BTreeMap::new();
    for reference in &krate.references {
        let target = resolve(&krate, &reference.path, 0);
        let common = reference
            .from
            .iter()
            .zip(&target)
            .take_while(|(a, b)| a == b)
            .count();
        if common < reference.from.len() && common < target.len() {
            let edge = (reference.from[common].clone(), target[common].clone());
            graphs
                .entry(reference.from[..common].to_vec())
                .or_default()
                .entry(edge)
                .or_insert_with(|| reference.at.clone());
        }
    }

    graphs
}

/// Each group of modules that reach each other (more than one), with one
/// shortest circle through its first module: names, the first again last.
fn cycles_in(edges: &BTreeMap<(String, String), String>) -> Vec<(Vec<String>, Vec<String>)> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
    }
    // Breadth first, so the circle printed is a shortest one.
    let path = |from: &str, to: &str| -> Option<Vec<String>> {
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(node) = queue.pop_front() {
            for &n in next.get(node).map(Vec::as_slice).unwrap_or(&[]) {
                if n == to {
                    let mut path = vec![to.to_string(), node.to_string()];
                    let mut at = node;
                    while at != from {
                        at = came_from[at];
                        path.push(at.to_string());
                    }
                    path.reverse();
                    return Some(path);
                }
                if n != from && !came_from.contains_key(n) {
                    came_from.insert(n, node);
                    queue.push_back(n);
                }
            }
        }
        None
    };
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for &node in next.keys() {
        if seen.contains(node) {
            continue;
        }
        if let Some(cycle) = path(node, node) {
            let group: Vec<String> = next
                .keys()
                .filter(|&&other| {
                    other == node || (path(node, other).is_some() && path(other, node).is_some())
                })
                .map(|other| other.to_string())
                .collect();
            seen.extend(next.keys().filter(|k| group.iter().any(|g| g == *k)));
            out.push((group, cycle));
        }
    }
    out
}

/// The module a path names: the longest run of modules it walks through,
/// following `use` bindings met on the way.
fn resolve(krate: &Crate, path: &[String], depth: usize) -> ModPath {
    let mut current = ModPath::new();
    for (i, segment) in path.iter().enumerate() {
        let mut child = current.clone();
        child.push(segment.clone());
        if krate.modules.contains(&child) {
            current = child;
            continue;
        }
        if depth < 16 {
            if let Some(alias) = krate
                .aliases
                .iter()
                .find(|a| a.module == current && &a.name == segment)
            {
                let mut target = alias.target.clone();
                target.extend_from_slice(&path[i + 1..]);
                return resolve(krate, &target, depth + 1);
            }
        }
        break;
    }
    current
}

/// The `mod name;` and `mod name { … }` of a file: inline ones are added to
/// `modules`; file ones are returned with the file that holds them.
fn declared_modules(
    file: &str,
    module: &ModPath,
    tokens: &[Tok],
    modules: &mut BTreeSet<ModPath>,
) -> Vec<(String, ModPath)> {
    let file_dir = match file.rfind('/') {
        Some(i) => file[..i + 1].to_string(),
        None => String::new(),
    };
    let stem = file
        .rsplit('/')
        .next()
        .unwrap_or(file)
        .trim_end_matches(".rs");
    let owns_dir = matches!(stem, "lib" | "main" | "mod");
    let mod_dir = if owns_dir {
        file_dir.clone()
    } else {
        format!("{file_dir}{stem}/")
    };

    let mut out = Vec::new();
    let mut inline: Vec<(String, isize)> = Vec::new();
    let mut depth: isize = 0;
    let mut path_attr: Option<String> = None;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Punct('#') => {
                if let [Tok::Punct('['), Tok::Ident(p), Tok::Punct('='), Tok::Str(s), Tok::Punct(']'), ..] =
                    &tokens[i + 1..]
                {
                    if p == "path" {
                        path_attr = Some(s.clone());
                    }
                }
            }
            Tok::Ident(m) if m == "mod" => {
                if let [Tok::Ident(name), Tok::Punct(p), ..] = &tokens[i + 1..] {
                    let mut child = module.clone();
                    child.extend(inline.iter().map(|(n, _)| n.clone()));
                    child.push(name.clone());
                    modules.insert(child.clone());
                    if *p == ';' {
                        let sub: String = inline.iter().map(|(n, _)| format!("{n}/")).collect();
                        let candidates = match path_attr.take() {
                            Some(p) => vec![format!("{file_dir}{sub}{p}")],
                            None => vec![
                                format!("{mod_dir}{sub}{name}.rs"),
                                format!("{mod_dir}{sub}{name}/mod.rs"),
                            ],
                        };
                        for candidate in candidates {
                            out.push((candidate, child.clone()));
                        }
                    } else if *p == '{' {
                        inline.push((name.clone(), depth));
                        depth += 1;
                        path_attr = None;
                        i += 2;
                    }
                }
            }
            Tok::Punct(';') => path_attr = None,
            _ => {}
        }
        i += 1;
    }
    out
}

/// Every `crate::`, `super::` and `self::` path of a file, and every `use`
/// binding (for re-exports), made absolute.
fn collect_references(
    file: &str,
    module: &ModPath,
    tokens: &[Tok],
    lines: &[usize],
    krate: &mut Crate,
) {
    let mut inline: Vec<(String, isize)> = Vec::new();
    let mut depth: isize = 0;
    let mut in_use = false;
    let mut i = 0;
    while i < tokens.len() {
        let mut here = module.clone();
        here.extend(inline.iter().map(|(n, _)| n.clone()));
        match &tokens[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Punct(';') => in_use = false,
            Tok::Ident(m) if m == "mod" => {
                if let [Tok::Ident(name), Tok::Punct('{'), ..] = &tokens[i + 1..] {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(u) if u == "use" => {
                in_use = true;
                // A `use` tree: every leaf is a reference and a binding.
                let mut leaves = Vec::new();
                let end = use_tree(tokens, i + 1, Vec::new(), &mut leaves);
                for (segments, name) in leaves {
                    let Some(path) = absolute(&here, &segments, &krate.modules) else {
                        continue;
                    };
                    krate.references.push(Reference {
                        from: here.clone(),
                        path: path.clone(),
                        at: format!("{file}:{}", lines[i]),
                    });
                    if let Some(name) = name {
                        krate.aliases.push(Alias {
                            module: here.clone(),
                            name,
                            target: path,
                        });
                    }
                }
                i = end;
                continue;
            }
            Tok::Ident(k)
                if !in_use
                    && matches!(k.as_str(), "crate" | "super" | "self")
                    && tokens.get(i + 1) == Some(&Tok::PathSep) =>
            {
                let mut segments = vec![k.clone()];
                let mut j = i + 1;
                while tokens.get(j) == Some(&Tok::PathSep) {
                    match tokens.get(j + 1) {
                        Some(Tok::Ident(s)) => segments.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                if let Some(path) = absolute(&here, &segments, &krate.modules) {
                    krate.references.push(Reference {
                        from: here.clone(),
                        path,
                        at: format!("{file}:{}", lines[i]),
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// Reads a `use` tree from `i`, pushing each leaf's segments and the name it
/// binds (none for `*`); returns the index after the tree.
fn use_tree(
    tokens: &[Tok],
    mut i: usize,
    mut prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    loop {
        match tokens.get(i) {
            Some(Tok::PathSep) => i += 1,
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                i += 1;
                if tokens.get(i) != Some(&Tok::PathSep) {
                    let mut name = prefix.last().cloned();
                    if name.as_deref() == Some("self") {
                        prefix.pop();
                        name = prefix.last().cloned();
                    }
                    if let (Some(Tok::Ident(a)), Some(Tok::Ident(alias))) =
                        (tokens.get(i), tokens.get(i + 1))
                    {
                        if a == "as" {
                            name = Some(alias.clone());
                            i += 2;
                        }
                    }
                    leaves.push((prefix, name));
                    return i;
                }
            }
            Some(Tok::Punct('*')) => {
                leaves.push((prefix, None));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match tokens.get(i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => {
                            let before = i;
                            i = use_tree(tokens, i, prefix.clone(), leaves);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            _ => return i,
        }
    }
}

/// A path as written in module `here`, made absolute from the crate root;
/// none for a path into another crate.
fn absolute(here: &ModPath, segments: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let first = segments.first()?;
    let (mut base, rest) = match first.as_str() {
        "crate" | "$crate" => (ModPath::new(), &segments[1..]),
        "self" => (here.clone(), &segments[1..]),
        "super" => (here.clone(), segments),
        _ => {
            let mut child = here.clone();
            child.push(first.clone());
            if !modules.contains(&child) {
                return None;
            }
            (here.clone(), segments)
        }
    };
    let mut rest = rest;
    while rest.first().map(String::as_str) == Some("super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Tokens without comments, with the line each starts on.
fn lex(text: &str) -> (Vec<Tok>, Vec<usize>) {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut lines = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let start_line = line;
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut nesting = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    nesting += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    nesting -= 1;
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"…", r#"…"#, br"…"
            let mut j = i;
            while chars[j] != '"' {
                j += 1;
            }
            j += 1;
            let body_start = j;
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while j < chars.len() && !chars[j..].starts_with(&close) {
                if chars[j] == '\n' {
                    line += 1;
                }
                j += 1;
            }
            tokens.push(Tok::Str(
                chars[body_start..j.min(chars.len())].iter().collect(),
            ));
            lines.push(start_line);
            i = j + close.len();
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let body_start = j;
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\\' {
                    j += 1;
                }
                if chars.get(j) == Some(&'\n') {
                    line += 1;
                }
                j += 1;
            }
            tokens.push(Tok::Str(
                chars[body_start..j.min(chars.len())].iter().collect(),
            ));
            lines.push(start_line);
            i = j + 1;
        } else if c == '\'' || (c == 'b' && next == Some('\'')) {
            let j = if c == 'b' { i + 1 } else { i };
            if chars.get(j + 1) == Some(&'\\') {
                // An escaped char literal: to its closing quote.
                let mut k = j + 2;
                while k < chars.len() && chars[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if chars.get(j + 2) == Some(&'\'') {
                i = j + 3;
            } else {
                // A lifetime or label.
                i = j + 1;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if ident_char(c) || (c == '$' && next.is_some_and(ident_char)) {
            let mut j = i + 1;
            if c == 'r' && next == Some('#') {
                j += 1;
            }
            while j < chars.len() && ident_char(chars[j]) {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            tokens.push(Tok::Ident(word.trim_start_matches("r#").to_string()));
            lines.push(start_line);
            i = j;
        } else if c == ':' && next == Some(':') {
            tokens.push(Tok::PathSep);
            lines.push(start_line);
            i += 2;
        } else {
            tokens.push(Tok::Punct(c));
            lines.push(start_line);
            i += 1;
        }
    }
    (tokens, lines)
}

/// At a raw string (`r"`, `r#"`, `br#"`…): the number of its `#`s.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some(hashes)
}
