//! Durations on the command line (`90s`, `5m`, `1h30m`, `250ms`) and in messages.

use std::time::Duration;

/// Parses `250ms`, `30s`, `5m`, `1h30m` (humantime's units), or a bare number of seconds.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration {text:?} ({e}); use e.g. 90s, 5m or 1h30m"))
}

/// `250ms`, `1.5s`, `5m`, `1h30m`, `2m5s`: short and exact enough for messages.
pub fn display(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        let tenths = (ms % 1000) / 100;
        return if tenths == 0 { format!("{secs}s") } else { format!("{secs}.{tenths}s") };
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("90", Ok(Duration::from_secs(90)))]
    #[case("90s", Ok(Duration::from_secs(90)))]
    #[case("5m", Ok(Duration::from_secs(300)))]
    #[case("1h30m", Ok(Duration::from_secs(5400)))]
    #[case("250ms", Ok(Duration::from_millis(250)))]
    #[case("2m5s", Ok(Duration::from_secs(125)))]
    #[case("", Err(()))]
    #[case("5x", Err(()))]
    #[case("m5", Err(()))]
    #[case("-5s", Err(()))]
    fn parses(#[case] text: &str, #[case] expected: Result<Duration, ()>) {
        assert_eq!(parse(text).map_err(|_| ()), expected);
    }

    #[rstest]
    #[case(Duration::from_millis(50), "50ms")]
    #[case(Duration::from_millis(1500), "1.5s")]
    #[case(Duration::from_secs(10), "10s")]
    #[case(Duration::from_secs(600), "10m")]
    #[case(Duration::from_secs(5400), "1h30m")]
    #[case(Duration::from_secs(125), "2m5s")]
    fn displays(#[case] d: Duration, #[case] expected: &str) {
        assert_eq!(display(d), expected);
    }
}
