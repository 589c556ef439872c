//! The two inputs of the parity check: upstream's spec list and our declarations file.

use std::collections::{BTreeSet, HashMap};

/// A spec: its full text and its label set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The full text `--focus` and `--skip` match.
    pub text: String,
    /// Its labels, duplicates removed.
    pub labels: BTreeSet<String>,
    /// Where it is declared (upstream: `file:line` in kubernetes).
    pub origin: String,
}

/// Parses upstream's list: one spec a line, `FULL TEXT <TAB> labels, comma-separated <TAB>
/// file:line`; `#` lines are comments.
pub fn parse_upstream(content: &str) -> Result<Vec<Spec>, String> {
    let mut specs: Vec<Spec> = Vec::new();
    let mut seen = HashMap::new();
    for (i, line) in content.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [text, labels, origin] = fields[..] else {
            return Err(format!("line {n}: expected 3 tab-separated fields, found {}", fields.len()));
        };
        if text.trim() != text || text.is_empty() {
            return Err(format!("line {n}: empty full text or surrounding spaces: {text:?}"));
        }
        if let Some(first) = seen.insert(text.to_owned(), n) {
            return Err(format!("line {n}: spec {text:?} is also on line {first}"));
        }
        let labels = labels.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect();
        specs.push(Spec { text: text.to_owned(), labels, origin: origin.trim().to_owned() });
    }
    if specs.is_empty() {
        return Err("no spec in the file".to_owned());
    }
    Ok(specs)
}

/// What a declaration says about a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An upstream spec we do not register (yet).
    Missing,
    /// A spec of ours that upstream's list lacks.
    Ours,
}

/// One declared spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// Missing or ours.
    pub kind: Kind,
    /// The spec's full text.
    pub text: String,
    /// Why.
    pub reason: String,
    /// Its line in the declarations file.
    pub line: usize,
}

/// Parses the declarations file: `missing: <reason>` or `ours: <reason>` starts a group, each
/// following line is one spec's full text; `#` lines and empty lines are ignored.
pub fn parse_declarations(content: &str) -> Result<Vec<Declaration>, String> {
    let mut out: Vec<Declaration> = Vec::new();
    let mut group: Option<(Kind, String, usize)> = None;
    let mut group_size = 0;
    let mut seen = HashMap::new();
    let close = |group: &Option<(Kind, String, usize)>, size: usize| match group {
        Some((_, _, line)) if size == 0 => Err(format!("line {line}: the group declares no spec")),
        _ => Ok(()),
    };
    for (i, raw) in content.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end();
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let header = [("missing:", Kind::Missing), ("ours:", Kind::Ours)]
            .into_iter()
            .find_map(|(prefix, kind)| line.strip_prefix(prefix).map(|reason| (kind, reason.trim())));
        if let Some((kind, reason)) = header {
            if reason.is_empty() {
                return Err(format!("line {n}: a group needs a reason after the colon"));
            }
            close(&group, group_size)?;
            group = Some((kind, reason.to_owned(), n));
            group_size = 0;
            continue;
        }
        let Some((kind, reason, _)) = &group else {
            return Err(format!("line {n}: a spec before the first `missing:` or `ours:` line"));
        };
        if line.trim_start() != line {
            return Err(format!("line {n}: leading spaces in {line:?}"));
        }
        if let Some(first) = seen.insert(line.to_owned(), n) {
            return Err(format!("line {n}: {line:?} is already declared on line {first}"));
        }
        out.push(Declaration { kind: *kind, text: line.to_owned(), reason: reason.clone(), line: n });
        group_size += 1;
    }
    close(&group, group_size)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_lines() {
        let specs = parse_upstream(
            "# header\n[sig-node] [DRA] a b [Conformance]\tsig-node, DRA, Conformance, DRA\tdra.go:99\n\n",
        )
        .unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].text, "[sig-node] [DRA] a b [Conformance]");
        assert_eq!(specs[0].labels, BTreeSet::from(["Conformance", "DRA", "sig-node"].map(str::to_owned)));
        assert_eq!(specs[0].origin, "dra.go:99");
    }

    #[test]
    fn rejects_bad_upstream_lines() {
        assert!(parse_upstream("a\tb\n").unwrap_err().starts_with("line 1: expected 3"));
        assert!(parse_upstream("a\t\tx\na\t\ty\n").unwrap_err().contains("also on line 1"));
        assert!(parse_upstream("# only comments\n").is_err());
    }

    #[test]
    fn parses_groups() {
        let decls = parse_declarations("# c\nmissing: not yet\nA\nB\n\nours: extra\nC\n").unwrap();
        let got: Vec<_> =
            decls.iter().map(|d| (d.kind, d.text.as_str(), d.reason.as_str(), d.line)).collect();
        assert_eq!(
            got,
            [
                (Kind::Missing, "A", "not yet", 3),
                (Kind::Missing, "B", "not yet", 4),
                (Kind::Ours, "C", "extra", 7)
            ]
        );
    }

    #[test]
    fn rejects_bad_declarations() {
        for (content, problem) in [
            ("A\n", "line 1: a spec before the first"),
            ("missing:\nA\n", "line 1: a group needs a reason"),
            ("missing: x\nours: y\nA\n", "line 1: the group declares no spec"),
            ("ours: y\nA\n", ""),
            ("ours: y\nA\nA\n", "line 3: \"A\" is already declared on line 2"),
            ("ours: y\n  A\n", "line 2: leading spaces"),
            ("missing: x\n", "line 1: the group declares no spec"),
        ] {
            match parse_declarations(content) {
                Ok(_) => assert!(problem.is_empty(), "{content:?} parsed"),
                Err(e) => assert!(!problem.is_empty() && e.starts_with(problem), "{content:?}: {e}"),
            }
        }
    }
}
