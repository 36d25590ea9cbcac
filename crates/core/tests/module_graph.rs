//! Core's modules import each other without a cycle, between files and
//! between concept groups, and the groups depend on each other only in the
//! order ARCHITECTURE.md draws (each on those before it in [`LAYERS`]).
//!
//! The graph is read from the sources: every `use` tree and every inline
//! `crate::`/`super::` path of a file (comments and `#[cfg(test)] mod tests`
//! blocks left out: tests may use anything), resolved to the file that
//! defines the item, through `pub use` re-exports. A module's `mod`
//! declarations and its re-exports of its own submodules are structure, not
//! imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The concept groups, lowest first: each may import only groups before it.
const LAYERS: &[&str] = &[
    "error",
    "transport",
    "launch",
    "protocol",
    "decisions",
    "cache",
    "persistence",
];

type Module = Vec<String>;

/// One source file: its module path and code.
struct Source {
    module: Module,
    code: String,
}

fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

fn read_sources(dir: &Path, root: &Path, out: &mut Vec<Source>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("under src");
            let text = std::fs::read_to_string(&path).expect("read source");
            out.push(Source {
                module: module_of(rel),
                code: strip(&text),
            });
        }
    }
}

/// The code without comments and without `#[cfg(test)] mod … { … }`
/// blocks (wherever they stand; any other `#[cfg(test)]` item is read).
fn strip(text: &str) -> String {
    let mut code = String::new();
    for line in text.lines() {
        let kept = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        code.push_str(kept);
        code.push('\n');
    }
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_mod = item.starts_with("mod ") || item.starts_with("pub mod ");
        match (is_mod, item.find('{')) {
            (true, Some(open)) if !item[..open].contains(';') => {
                // Skip to the brace that closes the module.
                let body = &item[open..];
                let mut depth = 0usize;
                let mut end = body.len();
                for (i, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &body[end..];
            }
            _ => {
                out.push_str("#[cfg(test)]");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths a `use` tree names, each as its segments.
fn expand_tree(tree: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    expand_into(tree.trim(), &mut Vec::new(), &mut out);
    out
}

fn expand_into(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let (head, rest) = match tree.find('{') {
        Some(i) => (
            &tree[..i],
            Some(&tree[i + 1..tree.rfind('}').unwrap_or(tree.len())]),
        ),
        None => (tree, None),
    };
    let depth = prefix.len();
    for seg in head.split("::") {
        // `name as alias`: the name is what is imported; the alias is kept
        // after a `|` so that a re-export can be found by it.
        let mut words = seg.split_whitespace();
        if let Some(name) = words.next() {
            match (words.next(), words.next()) {
                (Some("as"), Some(alias)) => prefix.push(format!("{name}|{alias}")),
                _ => prefix.push(name.to_owned()),
            }
        }
    }
    match rest {
        None => out.push(prefix.clone()),
        Some(inner) => {
            // Split the inner list at top-level commas.
            let mut level = 0;
            let mut start = 0;
            let bytes: Vec<char> = inner.chars().collect();
            let mut items = Vec::new();
            for (i, &c) in bytes.iter().enumerate() {
                match c {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        items.push(bytes[start..i].iter().collect::<String>());
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(bytes[start..].iter().collect::<String>());
            for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
                if item == "self" {
                    out.push(prefix.clone());
                } else {
                    expand_into(item, prefix, out);
                }
            }
        }
    }
    prefix.truncate(depth);
}

/// As [`uses`], with an aliased last segment kept as `name|alias`.
fn aliased_uses(code: &str) -> Vec<(bool, Vec<String>)> {
    uses_with(code, true)
}

/// A file's `use` statements: (is `pub use`, path) for each path.
fn uses(code: &str) -> Vec<(bool, Vec<String>)> {
    uses_with(code, false)
}

fn uses_with(code: &str, keep_alias: bool) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = &rest[..i];
        let at_start = before
            .chars()
            .last()
            .is_none_or(|c| !is_ident(c) && c != ':');
        let tail = &rest[i + 4..];
        if !at_start {
            rest = tail;
            continue;
        }
        let public = before.trim_end().ends_with("pub") || before.trim_end().ends_with(')');
        let end = tail.find(';').unwrap_or(tail.len());
        for mut path in expand_tree(&tail[..end]) {
            // `name|alias` (from `name as alias`): the path names `name`.
            if let Some(last) = path.last_mut().filter(|_| !keep_alias) {
                if let Some((name, _)) = last.split_once('|') {
                    *last = name.to_owned();
                }
            }
            out.push((public, path));
        }
        rest = &tail[end..];
    }
    out
}

/// Inline `crate::…` and `super::…` paths outside `use` statements.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if code[..at]
                .chars()
                .last()
                .is_some_and(|c| is_ident(c) || c == ':')
            {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|&c| is_ident(c) || c == ':')
                .collect();
            if code[at + path.len()..].starts_with('{') {
                continue; // a `use` tree: `uses` expands it
            }
            let segs: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            out.push(segs);
        }
    }
    out
}

struct Crate {
    modules: BTreeSet<Module>,
    /// (module, name) → the path it re-exports.
    reexports: BTreeMap<(Module, String), Vec<String>>,
}

impl Crate {
    /// An absolute path (segments after `crate`) from `path` as written in
    /// `module`; `None` for paths into other crates.
    fn absolute(&self, module: &Module, path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.clone(),
            "super" => {
                let mut m = module.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                return Some(m);
            }
            name => {
                let mut child = module.clone();
                child.push(name.to_owned());
                if !self.modules.contains(&child) {
                    return None; // std, serde, …
                }
                module.clone()
            }
        };
        let skip = usize::from(matches!(first.as_str(), "crate" | "self"));
        base.extend(path[skip..].iter().cloned());
        Some(base)
    }

    /// The file module that defines what `abs` names.
    fn resolve(&self, abs: &[String], depth: usize) -> Module {
        let mut len = abs.len();
        while len > 0 && !self.modules.contains(&abs[..len]) {
            len -= 1;
        }
        let module = abs[..len].to_vec();
        if depth < 8 {
            if let Some(name) = abs.get(len) {
                if let Some(target) = self.reexports.get(&(module.clone(), name.clone())) {
                    if let Some(t) = self.absolute(&module, target) {
                        let mut t = t;
                        t.extend(abs[len + 1..].iter().cloned());
                        return self.resolve(&t, depth + 1);
                    }
                }
            }
        }
        module
    }
}

/// The file-level import graph of the sources.
fn graph(sources: &[Source]) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut krate = Crate {
        modules: sources.iter().map(|s| s.module.clone()).collect(),
        reexports: BTreeMap::new(),
    };
    for s in sources {
        for (public, mut path) in aliased_uses(&s.code) {
            if public {
                if let Some(last) = path.pop() {
                    // Found by its alias; names the item before the `|`.
                    let (name, alias) = last.split_once('|').unwrap_or((&last, &last));
                    let (name, alias) = (name.to_owned(), alias.to_owned());
                    path.push(name);
                    krate.reexports.insert((s.module.clone(), alias), path);
                }
            }
        }
    }
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for s in sources {
        let mut paths: Vec<(bool, Vec<String>)> = uses(&s.code);
        paths.extend(inline_paths(&s.code).into_iter().map(|p| (false, p)));
        let out = edges.entry(s.module.clone()).or_default();
        for (public, path) in paths {
            let Some(abs) = krate.absolute(&s.module, &path) else {
                continue;
            };
            let target = krate.resolve(&abs, 0);
            // Re-exporting one's own submodules is structure.
            let own_child = target.len() > s.module.len() && target.starts_with(&s.module);
            if target != s.module && !(public && own_child) && !target.is_empty() {
                out.insert(target);
            }
        }
    }
    edges
}

/// A cycle in `edges`, if any, as the nodes along it.
fn find_cycle<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        n: &N,
        edges: &BTreeMap<N, BTreeSet<N>>,
        state: &mut BTreeMap<N, u8>,
        stack: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|x| x == m).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn groups(edges: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in edges {
        let Some(g) = from.first() else { continue };
        let entry = out.entry(g.clone()).or_default();
        for to in tos {
            if let Some(h) = to.first().filter(|h| *h != g) {
                entry.insert(h.clone());
            }
        }
    }
    out
}

fn show(m: &[Module]) -> String {
    m.iter()
        .map(|m| m.join("::"))
        .collect::<Vec<_>>()
        .join(" → ")
}

fn core_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Vec::new();
    read_sources(&src, &src, &mut sources);
    assert!(sources.len() >= 20, "read {} files", sources.len());
    graph(&sources)
}

#[test]
fn no_import_cycle_between_core_files() {
    let edges = core_graph();
    // The graph is read, not empty: the channel imports the envelope.
    let channel = edges
        .get(&vec!["protocol".to_owned(), "channel".to_owned()])
        .expect("protocol::channel");
    assert!(channel.contains(&vec!["protocol".to_owned(), "envelope".to_owned()]));
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle between core's files: {}", show(&cycle));
    }
}

#[test]
fn concept_groups_depend_only_on_lower_layers() {
    let files = core_graph();
    let layer = |g: &str| LAYERS.iter().position(|l| *l == g);
    for (from, tos) in &files {
        let Some(g) = from.first() else { continue };
        let Some(lf) = layer(g) else {
            panic!("module group `{g}` is in no layer of LAYERS (tests/module_graph.rs, ARCHITECTURE.md)");
        };
        for to in tos {
            let Some(h) = to.first().filter(|h| *h != g) else {
                continue;
            };
            let lt = layer(h).unwrap_or(usize::MAX);
            assert!(
                lt < lf,
                "`{}` imports `{}`: group `{g}` may import only groups below it ({LAYERS:?})",
                from.join("::"),
                to.join("::")
            );
        }
    }
    let edges = groups(&files);
    // Decisions really do sit on the protocol (the check has edges to check).
    assert!(edges["decisions"].contains("protocol"));
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle between core's groups: {}", cycle.join(" → "));
    }
}

/// What the reader above does not follow is not written: no glob import or
/// renamed import of the crate's own paths outside test modules (a glob
/// would hide an edge), and `lib.rs` holds only structure (`mod`
/// declarations, `pub use` re-exports, attributes), so that no item passes
/// an import through the crate root.
#[test]
fn core_sources_keep_to_what_the_graph_check_reads() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Vec::new();
    read_sources(&src, &src, &mut sources);
    let problems = rule_problems(&sources);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn rule_problems(sources: &[Source]) -> Vec<String> {
    let mut problems = Vec::new();
    let modules: BTreeSet<Module> = sources.iter().map(|s| s.module.clone()).collect();
    for s in sources {
        let name = if s.module.is_empty() {
            "lib.rs".to_owned()
        } else {
            s.module.join("::")
        };
        for (_, path) in aliased_uses(&s.code) {
            let first = path.first().map(String::as_str).unwrap_or("");
            let mut child = s.module.clone();
            child.push(first.to_owned());
            let ours = matches!(first, "crate" | "super" | "self") || modules.contains(&child);
            if !ours {
                continue;
            }
            if path.last().is_some_and(|l| l == "*") {
                problems.push(format!("{name}: glob import {}", path.join("::")));
            }
            if path.iter().any(|seg| seg.contains('|')) && !uses(&s.code).is_empty() {
                let public = aliased_uses(&s.code).iter().any(|(p, q)| *p && q == &path);
                if !public {
                    problems.push(format!("{name}: renamed import {}", path.join("::")));
                }
            }
        }
        // Paths into the crate root resolve through its re-exports; an item
        // of its own would hide the edges behind it.
        if s.module.is_empty() {
            let mut rest = s.code.clone();
            while let Some(i) = rest.find("use ") {
                let end = rest[i..].find(';').map_or(rest.len(), |e| i + e + 1);
                rest.replace_range(i..end, "");
            }
            for line in rest.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let structure = line.starts_with('#')
                    || line == "pub"
                    || line.strip_suffix(';').is_some_and(|d| {
                        let d = d
                            .trim_start_matches("pub(crate) ")
                            .trim_start_matches("pub ");
                        d.strip_prefix("mod ")
                            .is_some_and(|m| m.chars().all(is_ident))
                    });
                if !structure {
                    problems.push(format!(
                        "{name}: `{line}` in the crate root (move it into a file of its group)"
                    ));
                }
            }
        }
    }
    problems
}

/// The reader finds a cycle through a `use` tree, a re-export, `super::` and
/// an inline path: the check can fail.
#[test]
fn a_cycle_is_found() {
    let src = |m: &[&str], code: &str| Source {
        module: m.iter().map(|s| (*s).to_owned()).collect(),
        code: strip(code),
    };
    let sources = vec![
        src(&[], "pub mod a;\npub mod b;\npub use b::inner::Thing;\n"),
        src(
            &["a"],
            "use crate::{Thing, b::inner as x}; // crate::a::nope\n",
        ),
        src(&["b"], "pub mod inner;\npub use inner::Thing;\n"),
        src(
            &["b", "inner"],
            "pub struct Thing;\nfn f() { super::super::a::g() }\n",
        ),
        src(
            &["c"],
            "fn h() -> crate::a::T { todo!() }\n#[cfg(test)]\nmod tests { use crate::c; }\n",
        ),
    ];
    let edges = graph(&sources);
    let cycle = find_cycle(&edges).expect("a ↔ b::inner");
    assert_eq!(show(&cycle), "a → b::inner → a");
    assert!(!edges[&vec!["b".to_owned()]].contains(&vec!["b".to_owned(), "inner".to_owned()]));
    assert_eq!(edges[&vec!["c".to_owned()]].len(), 1);
    assert!(find_cycle(&graph(&sources[2..])).is_none());

    // Edges after a `#[cfg(test)]` item, after a test module, and through
    // an aliased re-export are read.
    let edge = |sources: &[Source], from: &str, to: &str| {
        let g = graph(sources);
        let from: Module = from.split("::").map(str::to_owned).collect();
        let to: Module = to.split("::").map(str::to_owned).collect();
        g.get(&from).is_some_and(|t| t.contains(&to))
    };
    let crate_of = |a: &str, b: &str| {
        vec![
            src(&[], &format!("pub mod a;\npub mod b;\n{b}")),
            src(&["a"], a),
            src(&["b"], "pub struct T;\n"),
        ]
    };
    let after_cfg = "#[cfg(test)]\nconst X: () = ();\nfn f(_: crate::b::T) {}\n";
    assert!(edge(&crate_of(after_cfg, ""), "a", "b"));
    let after_tests =
        "#[cfg(test)]\nmod tests {\n fn t() { if true { } }\n}\nfn f(_: crate::b::T) {}\n";
    assert!(edge(&crate_of(after_tests, ""), "a", "b"));
    let tests_only = "#[cfg(test)]\nmod tests {\n use crate::b::T;\n}\n";
    assert!(!edge(&crate_of(tests_only, ""), "a", "b"));
    let aliased = "use crate::Vote;\n";
    assert!(edge(
        &crate_of(aliased, "pub use b::T as Vote;\n"),
        "a",
        "b"
    ));
    // The rules refuse what the reader would not follow.
    let rules = |a: &str, root: &str| rule_problems(&crate_of(a, root));
    assert!(rules("fn f(_: crate::b::T) {}\n", "").is_empty());
    assert_eq!(rules("use crate::*;\n", "").len(), 1);
    assert_eq!(rules("use super::*;\n", "").len(), 1);
    assert_eq!(rules("use crate::b as bee;\n", "").len(), 1);
    assert_eq!(rules("", "pub type Vote = b::T;\n").len(), 1);
    assert!(rules("", "pub use b::T as Vote;\n#![forbid(unsafe_code)]\n").is_empty());
}
