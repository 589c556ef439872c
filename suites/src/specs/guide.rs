//! The test that keeps suites/README.md, the guide to writing a spec, true: each of its ```rust
//! blocks is, verbatim, a region of a compiled source file between `// guide:begin NAME` and
//! `// guide:end` (compared without the region's common indentation), and each such region is in
//! the guide. So every code block of the guide compiles, and a change of the code shows as a
//! failing test until the guide shows it too.

/// The guide.
const GUIDE: &str = include_str!("../../README.md");

/// The files with guide regions, by path from the suites crate.
const SOURCES: [(&str, &str); 3] = [
    ("src/specs/kubelet.rs", include_str!("kubelet.rs")),
    ("src/specs/kubelet/network.rs", include_str!("kubelet/network.rs")),
    ("src/specs/kubelet/two_claims.rs", include_str!("kubelet/two_claims.rs")),
];

const BEGIN: &str = "// guide:begin ";
const END: &str = "// guide:end";

/// The ```rust blocks of a Markdown text, each without its fences.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_start() == "```rust" => current = Some(Vec::new()),
            None => {}
            Some(lines) if line.trim_start() == "```" => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            Some(lines) => lines.push(line),
        }
    }
    blocks
}

/// The guide regions of a source file: name and text, without their common indentation.
fn regions(source: &str) -> Result<Vec<(String, String)>, String> {
    let mut regions = Vec::new();
    let mut current: Option<(String, Vec<&str>)> = None;
    for (number, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        match (current.as_mut(), trimmed.strip_prefix(BEGIN)) {
            (None, Some(name)) => current = Some((name.trim().to_owned(), Vec::new())),
            (Some((name, _)), Some(_)) => {
                return Err(format!(
                    "line {}: region {name} is not ended before the next begins",
                    number + 1
                ));
            }
            (Some(_), None) if trimmed == END => {
                if let Some((name, lines)) = current.take() {
                    regions.push((name, dedent(&lines)));
                }
            }
            (Some((_, lines)), None) => lines.push(line),
            (None, None) if trimmed == END => {
                return Err(format!("line {}: an end without a begin", number + 1));
            }
            (None, None) => {}
        }
    }
    match current {
        Some((name, _)) => Err(format!("region {name} is never ended")),
        None => Ok(regions),
    }
}

/// The lines without the indentation they all share (empty lines aside).
fn dedent(lines: &[&str]) -> String {
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines.iter().map(|l| l.get(indent..).unwrap_or("").trim_end()).collect::<Vec<_>>().join("\n")
}

#[test]
fn every_rust_block_of_the_guide_is_a_region_of_compiled_source_and_back() {
    let mut all = Vec::new();
    for (path, source) in SOURCES {
        let found = regions(source).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(!found.is_empty(), "{path} has no guide region: remove it from SOURCES");
        all.extend(found.into_iter().map(|(name, text)| (path, name, text)));
    }
    let blocks = rust_blocks(GUIDE);
    assert!(blocks.len() >= 5, "the guide has {} rust blocks", blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let first = block.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
        assert!(
            all.iter().any(|(_, _, text)| text == block),
            "rust block {} of suites/README.md (starting {first:?}) is no guide region of {:?}: \
             the guide shows code that is not compiled, or differs from it; copy the region here",
            i + 1,
            SOURCES.map(|(path, _)| path)
        );
    }
    for (path, name, text) in &all {
        assert!(
            blocks.contains(text),
            "guide region {name} of {path} differs from every rust block of suites/README.md:\n{text}"
        );
    }
}

#[test]
fn regions_and_blocks_are_read_as_written() {
    let source = "fn f() {\n    // guide:begin a\n    let x = 1;\n\n        x\n    // guide:end\n}\n";
    assert_eq!(regions(source).unwrap(), [("a".to_owned(), "let x = 1;\n\n    x".to_owned())]);
    assert!(regions("// guide:begin a\n").unwrap_err().contains("never ended"));
    assert!(regions("// guide:end\n").unwrap_err().contains("without a begin"));
    assert!(regions("// guide:begin a\n// guide:begin b\n").unwrap_err().contains("not ended"));
    let markdown = "text\n```rust\nlet x = 1;\n```\n```sh\nls\n```\n```rust\ny\n\nz\n```\n";
    assert_eq!(rust_blocks(markdown), ["let x = 1;", "y\n\nz"]);
}
