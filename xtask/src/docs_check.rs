//! Tests that keep the newcomer's documents true to the tree: every path the map `docs/layout.md`
//! names exists, every workspace crate and each of its top-level folders and `src/*.rs`/`src/*/`
//! entries is in the map, and every relative link of README.md and docs/layout.md reaches an
//! existing file (and heading, when it names one).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use crate::repo::repo_root;

/// The map of the tree, from the repository root.
const MAP: &str = "docs/layout.md";

/// The documents whose relative links must resolve.
const LINKED_DOCS: &[&str] = &["README.md", MAP];

/// What the map must name besides the crates.
const REQUIRED_OUTSIDE_CRATES: &[&str] = &["kind.yaml", "manifests/", ".ci/", "docs/", "suites/upstream/"];

/// Directories inside a crate that are not part of its map: build output.
const NOT_MAPPED: &[&str] = &["target"];

/// A file of the repository as text; a test fails with the path when it cannot be read.
fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|err| panic!("cannot read {rel}: {err}"))
}

/// The paths a map names: the first code span of each table row (`` | `path` | … ``).
fn map_paths(map: &str) -> Vec<String> {
    map.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(path, _)| path.to_string())
        .collect()
}

/// The crates of `members = [...]` in the workspace's Cargo.toml.
fn workspace_members(cargo_toml: &str) -> Result<Vec<String>, String> {
    let start = cargo_toml.find("members").ok_or("the workspace Cargo.toml has no `members`")?;
    let rest = &cargo_toml[start..];
    let open = rest.find('[').ok_or("`members` is not followed by `[`")?;
    let close = rest.find(']').ok_or("`members` has no closing `]`")?;
    let list = rest.get(open + 1..close).ok_or("`members` is not a list")?;
    let members: Vec<String> = list
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_string())
        .filter(|item| !item.is_empty())
        .collect();
    if members.is_empty() { Err("`members` lists no crate".to_string()) } else { Ok(members) }
}

/// The names in a directory, with whether each is a directory.
fn entries(dir: &Path) -> Result<Vec<(String, bool)>, String> {
    let read = std::fs::read_dir(dir).map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
    let mut out = Vec::new();
    for entry in read {
        let entry = entry.map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
        let is_dir =
            entry.file_type().map_err(|err| format!("cannot stat {:?}: {err}", entry.path()))?.is_dir();
        out.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
    }
    out.sort();
    Ok(out)
}

/// What the map must name: each crate, its top-level folders, its `src/*.rs` and `src/*/`, and
/// [`REQUIRED_OUTSIDE_CRATES`].
fn required_paths(root: &Path) -> Result<Vec<String>, String> {
    let mut required: Vec<String> = REQUIRED_OUTSIDE_CRATES.iter().map(|path| path.to_string()).collect();
    for member in workspace_members(&read(root, "Cargo.toml"))? {
        required.push(format!("{member}/"));
        for (name, is_dir) in entries(&root.join(&member))? {
            if is_dir && name != "src" && !NOT_MAPPED.contains(&name.as_str()) {
                required.push(format!("{member}/{name}/"));
            }
        }
        for (name, is_dir) in entries(&root.join(&member).join("src"))? {
            if is_dir {
                required.push(format!("{member}/src/{name}/"));
            } else if name.ends_with(".rs") {
                required.push(format!("{member}/src/{name}"));
            }
        }
    }
    Ok(required)
}

/// What is wrong with `map` as a map of the tree at `root`: paths that do not exist (a path ending
/// in `/` must be a directory, any other a file), paths named twice, and required paths missing.
fn map_problems(root: &Path, map: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut named = BTreeSet::new();
    for path in map_paths(map) {
        let on_disk = root.join(&path);
        match path.strip_suffix('/') {
            Some(_) if !on_disk.is_dir() => problems.push(format!("{path}: no such directory")),
            None if !on_disk.is_file() => problems.push(format!("{path}: no such file")),
            _ => {}
        }
        if !named.insert(path.clone()) {
            problems.push(format!("{path}: named twice"));
        }
    }
    match required_paths(root) {
        Ok(required) => problems.extend(
            required
                .into_iter()
                .filter(|path| !named.contains(path))
                .map(|path| format!("{path}: not in the map")),
        ),
        Err(err) => problems.push(err),
    }
    problems
}

/// The targets of a Markdown text's inline links (`[text](target)`), outside fenced code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in outside_fences(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    targets
}

/// The lines of a Markdown text that are not inside a fenced code block.
fn outside_fences(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            lines.push(line);
        }
    }
    lines
}

/// GitHub's anchor for a heading: lower case, spaces as `-`, punctuation other than `-` and `_`
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    outside_fences(text)
        .into_iter()
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// The broken relative links of the document `doc` (from the repository root) with text `text`:
/// a target file that does not exist, or a `#heading` its Markdown file does not have. Links
/// with a scheme (`https:`, `mailto:`) are not checked.
fn broken_links(root: &Path, doc: &str, text: &str) -> Vec<String> {
    let dir = Path::new(doc).parent().map(Path::to_path_buf).unwrap_or_default();
    let mut broken = Vec::new();
    for target in link_targets(text) {
        if target.contains(':') {
            continue;
        }
        let (file, heading) = match target.split_once('#') {
            Some((file, heading)) => (file, Some(heading)),
            None => (target.as_str(), None),
        };
        let rel: PathBuf = if file.is_empty() { PathBuf::from(doc) } else { dir.join(file) };
        let path = root.join(&rel);
        if !file.is_empty() && !path.exists() {
            broken.push(format!("{doc}: ({target}): {} does not exist", rel.display()));
            continue;
        }
        if let Some(heading) = heading
            && rel.extension().is_some_and(|ext| ext == "md")
        {
            let linked = if file.is_empty() { text.to_string() } else { read(root, &rel.to_string_lossy()) };
            if !anchors(&linked).contains(heading) {
                broken.push(format!("{doc}: ({target}): {} has no heading #{heading}", rel.display()));
            }
        }
    }
    broken
}

#[test]
fn the_map_names_existing_paths_and_every_crate_module() {
    let root = repo_root();
    let problems = map_problems(&root, &read(&root, MAP));
    assert!(problems.is_empty(), "{MAP} does not match the tree:\n{}", problems.join("\n"));
}

#[test]
fn the_map_check_finds_a_wrong_path_and_a_missing_module() {
    let root = repo_root();
    let map = read(&root, MAP);
    assert!(map.contains("| `harness/src/wait.rs` |"), "the map lost the entry this test edits");
    let wrong = map.replace("| `harness/src/wait.rs` |", "| `harness/src/waits.rs` |");
    let problems = map_problems(&root, &wrong);
    assert!(problems.contains(&"harness/src/waits.rs: no such file".to_string()), "{problems:?}");
    assert!(problems.contains(&"harness/src/wait.rs: not in the map".to_string()), "{problems:?}");

    let as_file = map.replace("| `harness/src/driver/` |", "| `harness/src/driver` |");
    let problems = map_problems(&root, &as_file);
    assert!(problems.contains(&"harness/src/driver: no such file".to_string()), "{problems:?}");
}

#[test]
fn workspace_members_are_read_from_cargo_toml() {
    let toml = "[workspace]\nresolver = \"3\"\nmembers = [\n  \"a\",\n  \"b-c\",\n]\n\n[x]\ny = [1]\n";
    assert_eq!(workspace_members(toml), Ok(vec!["a".to_string(), "b-c".to_string()]));
    assert!(workspace_members("[workspace]\n").is_err());
}

#[test]
fn links_of_the_readme_and_the_map_resolve() {
    let root = repo_root();
    let broken: Vec<String> =
        LINKED_DOCS.iter().flat_map(|doc| broken_links(&root, doc, &read(&root, doc))).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_finds_broken_links() {
    let root = repo_root();
    let text = "# Top\n[ok](docs/layout.md) [ok](#top) [web](https://example.com/x)\n\
                ```sh\n[not a link](nowhere.md)\n```\n[gone](docs/gone.md) [no heading](docs/layout.md#nope)\n";
    let broken = broken_links(&root, "README.md", text);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("docs/gone.md does not exist"), "{broken:?}");
    assert!(broken[1].contains("has no heading #nope"), "{broken:?}");
    assert_eq!(
        anchor(" Moved from the README (its figures, 2026-12-04)"),
        "moved-from-the-readme-its-figures-2026-12-04"
    );
}
