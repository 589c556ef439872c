//! Spec labels: validation and `key: value` label sets, as ginkgo has them.
//!
//! A label is free text without the characters `&|!,()/` (they are operators
//! of the label filter) and without `[` `]` (labels are rendered as `[label]`
//! in the spec text). A label `Key:Value` is also the member `value` of the
//! label set `key` (both trimmed, compared case-insensitively), so
//! `Feature:DynamicResourceAllocation` can be selected by
//! `Feature: isSubsetOf {DynamicResourceAllocation}`.

/// Characters a label must not contain.
const FORBIDDEN: &[char] = &['&', '|', '!', ',', '(', ')', '/', '[', ']'];

/// Checks a label and returns it trimmed, or says what is wrong with it.
pub(crate) fn validate(label: &str) -> Result<String, String> {
    let trimmed = label.trim();
    if trimmed.is_empty() {
        return Err("a label must not be empty".to_owned());
    }
    if let Some(c) = trimmed.chars().find(|c| FORBIDDEN.contains(c)) {
        return Err(format!(
            "label {label:?} contains {c:?}; labels must not contain any of & | ! , ( ) / [ ]"
        ));
    }
    if trimmed.starts_with(':') {
        return Err(format!("label {label:?} starts with ':'; a `key:value` label needs a key"));
    }
    if let Some((_, value)) = trimmed.split_once(':')
        && value.trim().is_empty()
    {
        return Err(format!("label {label:?} has an empty value after ':'"));
    }
    Ok(trimmed.to_owned())
}

/// The `(key, value)` of a `key:value` label, trimmed and lower-cased.
pub(crate) fn key_value(label: &str) -> Option<(String, String)> {
    let (key, value) = label.split_once(':')?;
    Some((key.trim().to_lowercase(), value.trim().to_lowercase()))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("Slow", Ok("Slow"))]
    #[case("  Feature:DynamicResourceAllocation ", Ok("Feature:DynamicResourceAllocation"))]
    #[case("KubeletMinVersion:1.34", Ok("KubeletMinVersion:1.34"))]
    #[case("", Err(()))]
    #[case("a&b", Err(()))]
    #[case("a/b", Err(()))]
    #[case("[Slow]", Err(()))]
    #[case(":x", Err(()))]
    #[case("Feature:", Err(()))]
    fn validates_labels(#[case] input: &str, #[case] expected: Result<&str, ()>) {
        assert_eq!(validate(input).map_err(|_| ()), expected.map(str::to_owned));
    }

    #[rstest]
    #[case("Feature:DRA", Some(("feature", "dra")))]
    #[case("Feature: A b ", Some(("feature", "a b")))]
    #[case("Slow", None)]
    fn splits_key_value(#[case] label: &str, #[case] expected: Option<(&str, &str)>) {
        assert_eq!(key_value(label), expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }
}
