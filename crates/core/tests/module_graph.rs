//! Core's concept groups (each a file or directory under `src`) depend on
//! each other only in the order of [`LAYERS`], ARCHITECTURE.md's drawing:
//! every `crate::` path of a group's files, and every `super::` chain that
//! reaches the crate root, names its own group or one before it. A name at the
//! root is a group or a re-export of lib.rs, owned by the group it comes from.
//! Comment lines and `#[cfg(test)] mod` blocks are skipped; all else is read as
//! code, so a path in a string or trailing comment can give a false alarm but
//! never hide an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The concept groups, lowest first: each may use only groups before it.
const LAYERS: &str = "error ◄ transport ◄ launch ◄ protocol ◄ decisions ◄ cache ◄ persistence";

/// `text` without comment lines and without `#[cfg(test)] mod … { … }`
/// blocks (rustfmt closes a block at the indentation it opened at).
fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut i) = (String::new(), 0);
    while i < lines.len() {
        let (line, next) = (lines[i], lines.get(i + 1).map_or("", |l| l.trim()));
        if line.trim() == "#[cfg(test)]" && next.contains("mod ") && next.ends_with('{') {
            let close = format!("{}}}", &line[..line.len() - line.trim_start().len()]);
            let end = lines[i..].iter().position(|l| *l == close);
            i += end.expect("a #[cfg(test)] mod closes at its indentation");
        } else if !line.trim_start().starts_with("//") {
            out.extend([line, "\n"]);
        }
        i += 1;
    }
    out
}

/// The crate-root names `code` uses: the head of every `crate::` path (every
/// head of a `crate::{…}` tree) and of every `super::` chain `depth` long.
fn root_names(code: &str, depth: usize) -> Vec<String> {
    let ident = |s: &str| {
        let s = s.trim_start();
        let end = s.find(|c: char| !c.is_alphanumeric() && c != '_');
        s[..end.unwrap_or(s.len())].to_owned()
    };
    let mut out = Vec::new();
    for prefix in ["crate::".to_owned(), "super::".repeat(depth)] {
        for (at, _) in code.match_indices(&prefix) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // `pub(crate)`, or inside a longer path
            }
            let (rest, mut level) = (&code[at + prefix.len()..], 0);
            if !rest.starts_with('{') {
                out.push(ident(rest));
            }
            for (i, c) in rest.char_indices().take_while(|_| rest.starts_with('{')) {
                level += i32::from(c == '{') - i32::from(c == '}');
                if level == 0 {
                    break;
                } else if level == 1 && (c == '{' || c == ',') {
                    out.push(ident(&rest[i + 1..]));
                }
            }
        }
    }
    out.retain(|name| !name.is_empty());
    out
}

/// The group of each name at the crate root: lib.rs's modules (the groups)
/// and what its `use` statements (re-exports) bring in from them.
fn owners(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in code_of(lib).split(';') {
        let mut words = statement.split_whitespace().skip_while(|w| *w != "mod");
        if let Some(group) = words.nth(1) {
            out.insert(group.to_owned(), group.to_owned());
        } else if let Some((_, path)) = statement.split_once("use ") {
            let group = path.split("::").next().unwrap_or_default().trim();
            for leaf in path.split(['{', '}', ',']) {
                let last = leaf.rsplit("::").next().unwrap_or_default();
                if let Some(name) = last.split_whitespace().last() {
                    out.insert(name.to_owned(), group.to_owned()); // `X as name`
                }
            }
        }
    }
    out
}

fn layer(group: &str) -> usize {
    let found = LAYERS.split(" ◄ ").position(|l| l == group);
    found.unwrap_or_else(|| panic!("group `{group}` is not in LAYERS (ARCHITECTURE.md)"))
}

/// Every `.rs` file under `dir`, as its path relative to `root`.
fn files(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(root).expect("under src").to_owned());
        }
    }
}

#[test]
fn each_group_uses_only_itself_and_the_groups_before_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let read = |rel: &Path| std::fs::read_to_string(src.join(rel)).expect("read source");
    let owner = owners(&read(Path::new("lib.rs")));
    let (mut paths, mut problems, mut uses) = (Vec::new(), Vec::new(), BTreeSet::new());
    files(&src, &src, &mut paths);
    for rel in paths.iter().filter(|rel| *rel != Path::new("lib.rs")) {
        let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
        let group = parts[0].trim_end_matches(".rs");
        let depth = parts.len() - usize::from(parts[parts.len() - 1] == "mod.rs");
        for name in root_names(&code_of(&read(rel)), depth) {
            let file = rel.display();
            let used = owner.get(&name).unwrap_or_else(|| {
                panic!("{file}: `crate::{name}` is neither a group nor a re-export of lib.rs")
            });
            uses.insert(format!("{group} → {used}"));
            if layer(used) > layer(group) {
                problems.push(format!(
                    "{file}: group `{group}` uses `crate::{name}` (group `{used}`), which is not \
                     before it in {LAYERS}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for edge in ["protocol → transport", "decisions → protocol"] {
        assert!(uses.contains(edge), "no {edge}: the sources were not read");
    }
}

#[test]
fn every_form_of_path_is_read() {
    let code = "use crate::{a::{b, c}, D,\n    E};\n/// crate::Doc\nfn f() -> crate::F { super::super::G }\n\
        const S: &str = \"x//y\"; fn g(_: crate::H) {}\n#[cfg(test)]\nmod tests {\n    use crate::T;\n}\n";
    let names = root_names(&code_of(code), 2);
    assert_eq!(names, ["a", "D", "E", "F", "H", "G"]);
    let lib = "#![x]\npub mod a;\nmod b;\npub use a::x::{P, Q as R};\nuse b::S;\n";
    let owner: Vec<String> = owners(lib).into_iter().map(|(k, v)| k + &v).collect();
    assert_eq!(owner, ["Pa", "Ra", "Sb", "aa", "bb"]);
}
