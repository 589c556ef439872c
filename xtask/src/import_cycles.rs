//! A test that keeps the workspace free of import circles: in every crate, the files of `src/`
//! and the `use crate::…`, `use super::…` and `use self::…` imports between them (and the same
//! paths written inline, `crate::x::f()`) form a graph without a cycle. A file that imports from
//! a file that imports it back, directly or around a longer loop, fails the test with the loop
//! and the first import of each step, so that a reader can open any file and find what it
//! depends on below it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use crate::repo::repo_root;

/// A crate's module tree: module path (`["local", "build"]`) to the file that holds it.
type Modules = BTreeMap<Vec<String>, PathBuf>;

/// The import that made an edge between two files: the file, the path as written.
type Edges = BTreeMap<PathBuf, BTreeMap<PathBuf, String>>;

/// The module path of a file below `src/` (`lib.rs`/`main.rs` are the root, `a/mod.rs` is `a`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
            parts.push(stem);
        }
    }
    parts
}

/// Every `.rs` file below `dir`, relative to it, `src/bin/` left out (each is a crate of its own).
fn rust_files(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let Ok(read) = std::fs::read_dir(dir.join(rel)) else { return };
    let mut entries: Vec<_> = read.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let rel = rel.join(entry.file_name());
        if entry.path().is_dir() {
            if rel != Path::new("bin") {
                rust_files(dir, &rel, out);
            }
        } else if rel.extension().is_some_and(|e| e == "rs") {
            out.push(rel);
        }
    }
}

/// The text of a Rust file without its comments, string and character literals (each replaced
/// by a space), so that only code is searched for paths.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('#') || next == Some('"')) && !ident_char_before(&chars, i) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(_) => j += 1,
                }
            }
            out.push(' ');
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' {
            // A character literal ('a', '\n', '\''), or a lifetime ('a), which stays.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push(' ');
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push(' ');
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths a `use` tree names (`a::{b, c::d as e, f::*}` gives `a::b`, `a::c::d`, `a::f`).
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    fn split_top(list: &str) -> Vec<&str> {
        let (mut depth, mut start, mut out) = (0, 0, Vec::new());
        for (i, c) in list.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(&list[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&list[start..]);
        out
    }
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    if tree.is_empty() {
        return Vec::new();
    }
    if let Some(open) = tree.find('{') {
        let prefix: Vec<String> =
            tree[..open].split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        let inner = tree[open + 1..].trim_end().trim_end_matches('}');
        let mut out = Vec::new();
        for item in split_top(inner) {
            // `self` in a list names the prefix itself.
            for rest in expand_use_tree(item) {
                out.push(prefix.iter().cloned().chain(rest).collect());
            }
        }
        return out;
    }
    let path = tree.split(" as ").next().unwrap_or(tree);
    let segments: Vec<String> = path
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "*" && *s != "self")
        .map(String::from)
        .collect();
    vec![segments]
}

/// The crate-relative paths a file's code names, each with where it is: its `use` trees and the
/// `crate::`/`super::`/`self::` paths written inline.
fn named_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let ident_before =
        |at: usize| code[..at].chars().next_back().is_some_and(|c| is_ident(c) || c == ':' || c == '$');
    // `use` trees, to the `;`.
    let mut i = 0;
    while let Some(pos) = code[i..].find("use ") {
        let at = i + pos;
        let end = code[at..].find(';').map_or(code.len(), |e| at + e);
        if ident_before(at) {
            i = at + 4;
        } else {
            out.extend(expand_use_tree(&code[at + 4..end]).into_iter().map(|p| (at, p)));
            i = end;
        }
    }
    // Inline paths (those inside `use` trees were found above and resolve the same).
    for start in ["crate::", "super::", "self::"] {
        let mut i = 0;
        while let Some(pos) = code[i..].find(start) {
            let at = i + pos;
            i = at + start.len();
            if ident_before(at) {
                continue;
            }
            let path: String = code[at..].chars().take_while(|c| is_ident(*c) || *c == ':').collect();
            if path.ends_with("::") {
                continue; // `use super::{…}`: its tree was read above
            }
            out.push((at, path.split("::").filter(|s| !s.is_empty()).map(String::from).collect()));
        }
    }
    out
}

/// The inline modules of a file's code (`mod tests { … }`): name and the byte range of the body.
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut open: Vec<(Option<(String, usize)>, usize)> = Vec::new(); // (module, depth) per `{`
    let mut pending: Option<String> = None;
    let mut words = String::new();
    for (i, c) in code.char_indices() {
        if is_ident(c) {
            words.push(c);
            continue;
        }
        if !words.is_empty() {
            let word = std::mem::take(&mut words);
            pending = match pending {
                Some(ref m) if m.is_empty() => Some(word),
                _ if word == "mod" => Some(String::new()),
                _ => None,
            };
        }
        match c {
            '{' => {
                let module = pending.take().filter(|m| !m.is_empty()).map(|m| (m, i + 1));
                open.push((module, i));
            }
            '}' => {
                if let Some((Some((name, start)), _)) = open.pop() {
                    out.push((name, start..i));
                }
                pending = None;
            }
            c if c.is_whitespace() => {}
            _ => pending = None,
        }
    }
    out.sort_by_key(|(_, range)| range.start);
    out
}

/// The file a path resolves to from module `from`: the deepest module of the path that is a file
/// of the crate; `None` for paths outside the crate (`std::…`, other crates).
fn resolve(modules: &Modules, from: &[String], path: &[String]) -> Option<PathBuf> {
    let mut absolute: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => from.to_vec(),
        Some("super") => from.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        absolute.pop();
        while rest.first().is_some_and(|s| s == "super") {
            absolute.pop();
            rest = &rest[1..];
        }
    }
    absolute.extend(rest.iter().cloned());
    (0..=absolute.len()).rev().find_map(|n| modules.get(&absolute[..n]).cloned())
}

/// The import graph of one crate's `src/`: file to the files it imports from (with the first
/// path written for each).
fn crate_edges(src: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(src, Path::new(""), &mut files);
    let modules: Modules = files.iter().map(|f| (module_path(f), f.clone())).collect();
    let mut edges = Edges::new();
    for file in &files {
        let text = std::fs::read_to_string(src.join(file))
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", src.join(file).display()));
        let code = code_only(&text);
        let inline = inline_modules(&code);
        for (at, path) in named_paths(&code) {
            // `self::`/`super::` start at the module the path is written in: the file's, or an
            // inline module inside it (`mod tests { use super::*; }` names the file itself).
            let mut from = module_path(file);
            from.extend(inline.iter().filter(|(_, body)| body.contains(&at)).map(|(name, _)| name.clone()));
            if let Some(to) = resolve(&modules, &from, &path)
                && &to != file
            {
                edges.entry(file.clone()).or_default().entry(to).or_insert_with(|| path.join("::"));
            }
        }
    }
    edges
}

/// Files that import each other: every file of `files` reaches every other through imports.
#[derive(Debug)]
struct Cycle {
    /// The files of the strongly connected set.
    files: BTreeSet<PathBuf>,
    /// One loop through it: each file and the import that leads to the next (the last to the first).
    steps: Vec<(PathBuf, String)>,
}

/// The import cycles of a graph: each strongly connected set of two files or more, with one loop
/// through it.
fn cycles(edges: &Edges) -> Vec<Cycle> {
    let nodes: BTreeSet<&PathBuf> = edges.keys().chain(edges.values().flat_map(|m| m.keys())).collect();
    let reaches = |from: &PathBuf| -> BTreeSet<PathBuf> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for to in edges.get(&n).into_iter().flat_map(|m| m.keys()) {
                if seen.insert(to.clone()) {
                    stack.push(to.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&PathBuf, BTreeSet<PathBuf>> = nodes.iter().map(|n| (*n, reaches(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for node in &nodes {
        if done.contains(*node) || !reach[node].contains(*node) {
            continue;
        }
        let component: BTreeSet<PathBuf> = nodes
            .iter()
            .filter(|m| reach[node].contains(**m) && reach[*m].contains(*node))
            .map(|m| m.to_path_buf())
            .collect();
        done.extend(component.iter().cloned());
        // One loop through the component, back to `node`, by breadth-first search.
        let mut previous: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([(*node).clone()]);
        'search: while let Some(n) = queue.pop_front() {
            for to in edges.get(&n).into_iter().flat_map(|m| m.keys()) {
                if !component.contains(to) {
                    continue;
                }
                if to == *node {
                    previous.insert((*node).clone(), n.clone());
                    break 'search;
                }
                if !previous.contains_key(to) {
                    previous.insert(to.clone(), n.clone());
                    queue.push_back(to.clone());
                }
            }
        }
        let mut path = vec![(*node).clone()];
        let mut at = previous[*node].clone();
        while at != **node {
            path.push(at.clone());
            at = previous[&at].clone();
        }
        path.reverse();
        // `path` runs node → … → last, and last imports node.
        let steps = (0..path.len())
            .map(|i| {
                let (from, to) = (&path[i], &path[(i + 1) % path.len()]);
                (from.clone(), format!("imports {} ({})", to.display(), edges[from][to]))
            })
            .collect();
        out.push(Cycle { files: component, steps });
    }
    out
}

#[test]
fn no_crate_of_the_workspace_has_an_import_cycle() {
    let root = repo_root();
    let mut found = Vec::new();
    for member in ["harness", "kubelet-plugin", "spec-runner", "suites", "xtask"] {
        let src = root.join(member).join("src");
        assert!(src.is_dir(), "{} is not a directory", src.display());
        for cycle in cycles(&crate_edges(&src)) {
            let files: Vec<String> = cycle.files.iter().map(|f| f.display().to_string()).collect();
            let steps: Vec<String> = cycle
                .steps
                .iter()
                .map(|(file, step)| format!("  {member}/src/{} {step}", file.display()))
                .collect();
            found.push(format!(
                "{} files of {member}/src import each other ({}); one loop:\n{}",
                files.len(),
                files.join(", "),
                steps.join("\n")
            ));
        }
    }
    assert!(found.is_empty(), "{} import cycle(s):\n{}", found.len(), found.join("\n\n"));
}

/// The edges from files below `from` into files below `into` (folders of one crate's `src/`).
fn imports_between(edges: &Edges, from: &str, into: &str) -> Vec<String> {
    edges
        .iter()
        .filter(|(file, _)| file.starts_with(from))
        .flat_map(|(file, targets)| {
            targets
                .iter()
                .filter(|(to, _)| to.starts_with(into))
                .map(move |(to, path)| format!("{} imports {} ({path})", file.display(), to.display()))
        })
        .collect()
}

#[test]
fn the_providers_never_import_each_other() {
    let edges = crate_edges(&repo_root().join("xtask").join("src"));
    let mut found = imports_between(&edges, "kind", "local");
    found.extend(imports_between(&edges, "local", "kind"));
    assert!(
        found.is_empty(),
        "kind/ and local/ build on common/, never on each other:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_workspace_members_are_the_crates_checked() {
    let cargo =
        std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("read the workspace Cargo.toml");
    assert!(
        cargo.contains(r#"members = ["harness", "kubelet-plugin", "spec-runner", "suites", "xtask"]"#),
        "the workspace members changed: update the list of no_crate_of_the_workspace_has_an_import_cycle"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Edges {
        let dir = tempfile::tempdir().unwrap();
        for (rel, text) in files {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        crate_edges(dir.path())
    }

    #[test]
    fn a_two_file_loop_is_found_with_its_imports() {
        let edges = graph(&[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "use crate::b::{Thing, other as o};\n"),
            ("b.rs", "pub fn f() { crate::a::g(); }\n"),
        ]);
        let found = cycles(&edges);
        assert_eq!(found.len(), 1, "{found:?}");
        let text = format!("{found:?}");
        assert!(text.contains("crate::b::Thing") && text.contains("crate::a::g"), "{text}");
    }

    #[test]
    fn a_child_using_its_parent_that_uses_it_is_a_loop() {
        let edges = graph(&[
            ("lib.rs", "mod p;"),
            ("p/mod.rs", "mod c;\npub use c::X;\npub struct Y;\nuse self::c::Z;"),
            ("p/c.rs", "use super::Y;\npub struct X; pub struct Z;"),
        ]);
        assert_eq!(cycles(&edges).len(), 1, "{edges:?}");
    }

    #[test]
    fn an_inline_test_module_using_super_names_its_own_file() {
        let edges = graph(&[
            ("lib.rs", "mod p;"),
            ("p/mod.rs", "mod c;\npub use c::X;"),
            (
                "p/c.rs",
                "pub struct X;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn f() { let _ = super::X; }\n}\n",
            ),
        ]);
        assert!(cycles(&edges).is_empty(), "{edges:?}");
        assert!(!edges.contains_key(Path::new("p/c.rs")), "{edges:?}");
    }

    #[test]
    fn layers_without_a_loop_pass_and_comments_and_strings_do_not_count() {
        let edges = graph(&[
            ("main.rs", "mod a; mod b; use crate::a::f; use crate::b::g;"),
            ("a.rs", "use crate::b::g; // use crate::main_only\n"),
            (
                "b.rs",
                "/* use crate::a::f; */ const S: &str = \"crate::a::f\"; const R: &str = r#\"use crate::a;\"#; fn c() -> char { '\"' }\n",
            ),
        ]);
        assert!(cycles(&edges).is_empty(), "{edges:?}");
        assert_eq!(edges[Path::new("a.rs")].keys().collect::<Vec<_>>(), [Path::new("b.rs")]);
    }

    #[test]
    fn super_resolves_from_the_module_not_the_folder() {
        let modules: Modules = [
            (vec![], PathBuf::from("lib.rs")),
            (vec!["a".into()], PathBuf::from("a/mod.rs")),
            (vec!["a".into(), "b".into()], PathBuf::from("a/b.rs")),
        ]
        .into();
        let from_b = ["a".to_string(), "b".to_string()];
        let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
        assert_eq!(resolve(&modules, &from_b, &path("super::X")), Some(PathBuf::from("a/mod.rs")));
        assert_eq!(resolve(&modules, &from_b, &path("super::super::Y")), Some(PathBuf::from("lib.rs")));
        assert_eq!(resolve(&modules, &["a".to_string()], &path("self::b::Z")), Some(PathBuf::from("a/b.rs")));
        assert_eq!(resolve(&modules, &from_b, &path("std::fmt")), None);
    }

    #[test]
    fn imports_between_folders_are_listed() {
        let edges = graph(&[
            ("main.rs", "mod kind; mod local; mod common;"),
            ("kind/mod.rs", "use crate::local::Layout;\nuse crate::common::x;"),
            ("local/mod.rs", "use crate::common::x;"),
            ("common/mod.rs", ""),
        ]);
        assert_eq!(imports_between(&edges, "kind", "local").len(), 1);
        assert!(imports_between(&edges, "local", "kind").is_empty());
    }

    #[test]
    fn use_trees_expand() {
        let got = expand_use_tree("crate::a::{b, c::{d as e, f::*}, self}");
        let want: Vec<Vec<String>> = ["crate::a::b", "crate::a::c::d", "crate::a::c::f", "crate::a"]
            .iter()
            .map(|p| p.split("::").map(String::from).collect())
            .collect();
        assert_eq!(got, want);
    }
}
