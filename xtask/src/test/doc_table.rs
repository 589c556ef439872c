//! The Markdown tables of docs/ that steps of `cargo xtask test` read and obey (the lanes' host
//! skips in docs/lanes.md, the restart exceptions in docs/restart-exceptions.md): a table's rows
//! as cells, its header checked, so a doc that no longer says what the step reads fails the step
//! instead of excusing nothing or everything.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use regex::Regex;

/// What a table's rows are read as.
pub(crate) trait Row: Sized {
    /// The doc, from the repository's root.
    const DOC: &'static str;
    /// The heading the table follows.
    const HEADING: &'static str;
    /// The table's columns.
    const COLUMNS: &'static [&'static str];

    /// One row from its cells (as many as [`Row::COLUMNS`]); `doc` names the file in errors.
    fn from_cells(cells: Vec<String>, doc: &str) -> Result<Self>;
}

/// A doc's table, read.
#[derive(Debug)]
pub(crate) struct Table<R> {
    /// Its rows.
    pub rows: Vec<R>,
    /// The file they were read from.
    pub source: PathBuf,
}

impl<R: Row> Table<R> {
    /// The table of the repository's doc.
    pub(crate) fn load(repo: &Path) -> Result<Self> {
        let source = repo.join(R::DOC);
        let text = std::fs::read_to_string(&source).with_context(|| format!("read {}", source.display()))?;
        Self::parse(&text, source)
    }

    /// The table of `text` (read from `source`).
    pub(crate) fn parse(text: &str, source: PathBuf) -> Result<Self> {
        let doc = source.display().to_string();
        let rows = rows(text, R::HEADING, R::COLUMNS).with_context(|| format!("{doc}, {}", R::HEADING))?;
        let rows = rows.into_iter().map(|cells| R::from_cells(cells, &doc)).collect::<Result<_>>()?;
        Ok(Self { rows, source })
    }
}

/// A cell that holds a regular expression: `what` of `row` in errors.
pub(crate) fn regex(cell: &str, what: &str, row: &str, doc: &str) -> Result<Regex> {
    if cell.is_empty() {
        bail!("{doc}: {row} has an empty {what}");
    }
    Regex::new(cell).with_context(|| format!("{doc}: the {what} of {row}"))
}

/// The rows of the first table after the line `heading` in `text`: each row's cells, trimmed,
/// `\|` read as `|`, a cell that is one code span (`` `x` ``) read as its content. The table's
/// header must be `columns`.
pub(crate) fn rows(text: &str, heading: &str, columns: &[&str]) -> Result<Vec<Vec<String>>> {
    let Some(start) = text.lines().position(|l| l.trim() == heading) else {
        bail!("it has no line {heading:?}");
    };
    let mut lines = text.lines().skip(start + 1).skip_while(|l| !l.trim_start().starts_with('|'));
    let header = lines.next().map(cells).unwrap_or_default();
    if header != columns {
        bail!("the table after {heading:?} must have the columns {columns:?}, it has {header:?}");
    }
    let mut rows = Vec::new();
    for (i, line) in lines.take_while(|l| l.trim_start().starts_with('|')).enumerate() {
        let row = cells(line);
        if i == 0 && row.iter().all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':'))) {
            continue; // the delimiter row
        }
        if row.len() != columns.len() {
            bail!(
                "row {} of the table after {heading:?} has {} cells, not {}: {line}",
                i,
                row.len(),
                columns.len()
            );
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The cells of a table row.
fn cells(line: &str) -> Vec<String> {
    let line = line.trim();
    let line = line.strip_prefix('|').unwrap_or(line);
    let line = line.strip_suffix('|').filter(|l| !l.ends_with('\\')).unwrap_or(line);
    let mut cells = vec![String::new()];
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().into_iter().for_each(|cell| cell.push('|'));
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().into_iter().for_each(|cell| cell.push(c)),
        }
    }
    cells.into_iter().map(|cell| code_span(cell.trim()).to_owned()).collect()
}

/// The content of a cell that is one code span, else the cell.
fn code_span(cell: &str) -> &str {
    match cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')) {
        Some(inner) if !inner.contains('`') => inner,
        _ => cell,
    }
}

/// The items of a cell that lists them with commas, each in a code span or not (`` `a`, `b` ``
/// and `a, b` are both `["a", "b"]`).
pub(crate) fn list(cell: &str) -> Vec<&str> {
    cell.split(',').map(|item| code_span(item.trim())).filter(|item| !item.is_empty()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    const DOC: &str = "# T\n\ntext\n\n## Rows\n\nSome words.\n\n| A | B |\n|---|:--|\n| `x \\| y` | plain |\n| 2 | `` |\n\nafter\n\n| other | table |\n";

    #[test]
    fn the_rows_of_the_table_after_the_heading_are_read() {
        let rows = rows(DOC, "## Rows", &["A", "B"]).unwrap();
        assert_eq!(rows, [vec!["x | y".to_owned(), "plain".to_owned()], vec!["2".to_owned(), String::new()]]);
    }

    #[test]
    fn an_empty_table_has_no_rows() {
        assert!(rows("## Rows\n| A | B |\n|---|---|\n", "## Rows", &["A", "B"]).unwrap().is_empty());
    }

    #[test]
    fn a_missing_heading_other_columns_or_a_short_row_fail() {
        let no_heading = rows(DOC, "## None", &["A", "B"]).unwrap_err().to_string();
        assert!(no_heading.contains("no line \"## None\""), "{no_heading}");
        let columns = rows(DOC, "## Rows", &["A", "C"]).unwrap_err().to_string();
        assert!(columns.contains("must have the columns"), "{columns}");
        let short = rows("## Rows\n| A | B |\n|---|---|\n| 1 |\n", "## Rows", &["A", "B"]).unwrap_err();
        assert!(short.to_string().contains("has 1 cells, not 2"), "{short}");
    }

    #[test]
    fn a_list_cell_is_split_on_commas() {
        assert_eq!(list("`suites`, `next-release`"), ["suites", "next-release"]);
        assert_eq!(list("suites"), ["suites"]);
        assert!(list("").is_empty());
    }
}
