//! Compares our specs with upstream's list, given the declarations, and explains each
//! discrepancy with the closest text on the other side.

use std::{collections::HashMap, fmt};

use super::files::{Declaration, Kind, Spec};

/// One way our registry and upstream's list disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discrepancy {
    /// Ours has the same words and the same `[labels]` as an upstream spec, in another order.
    LabelPlacement {
        /// Our full text.
        ours: String,
        /// Upstream's.
        upstream: String,
    },
    /// An upstream spec we do not register, and it is not declared missing.
    Missing {
        /// Upstream's full text.
        upstream: String,
        /// Where upstream declares it.
        origin: String,
        /// The closest of our unmatched specs.
        closest: Option<String>,
    },
    /// A spec of ours upstream lacks, and it is not declared ours.
    Unknown {
        /// Our full text.
        ours: String,
        /// The closest of upstream's specs we do not register.
        closest: Option<String>,
    },
    /// Same text, different label sets.
    Labels {
        /// The full text.
        text: String,
        /// Labels only upstream has.
        only_upstream: Vec<String>,
        /// Labels only ours has.
        only_ours: Vec<String>,
    },
    /// A declaration that no longer holds.
    Stale {
        /// The declared full text.
        text: String,
        /// Its line in the declarations file.
        line: usize,
        /// Why it is stale.
        why: &'static str,
    },
}

impl fmt::Display for Discrepancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let closest = |f: &mut fmt::Formatter<'_>, side: &str, text: &Option<String>| match text {
            Some(t) => write!(f, "\n      closest {side}: {t:?}"),
            None => Ok(()),
        };
        match self {
            Self::LabelPlacement { ours, upstream } => write!(
                f,
                "label order/placement differs: ours {ours:?}\n      upstream has the same words and labels as {upstream:?}"
            ),
            Self::Missing { upstream, origin, closest: c } => {
                write!(f, "upstream spec not registered and not declared missing ({origin}): {upstream:?}")?;
                closest(f, "of ours", c)
            }
            Self::Unknown { ours, closest: c } => {
                write!(f, "spec of ours not upstream and not declared ours: {ours:?}")?;
                closest(f, "upstream", c)
            }
            Self::Labels { text, only_upstream, only_ours } => write!(
                f,
                "labels differ for {text:?}: only upstream has {only_upstream:?}, only ours has {only_ours:?}"
            ),
            Self::Stale { text, line, why } => write!(f, "stale declaration on line {line}: {text:?} {why}"),
        }
    }
}

/// Every discrepancy, upstream's order first, then ours.
pub fn compare(upstream: &[Spec], ours: &[Spec], declarations: &[Declaration]) -> Vec<Discrepancy> {
    let up: HashMap<&str, &Spec> = upstream.iter().map(|s| (s.text.as_str(), s)).collect();
    let our: HashMap<&str, &Spec> = ours.iter().map(|s| (s.text.as_str(), s)).collect();
    let declared: HashMap<&str, &Declaration> = declarations.iter().map(|d| (d.text.as_str(), d)).collect();
    let is_declared = |text: &str, kind: Kind| declared.get(text).is_some_and(|d| d.kind == kind);

    let mut out = Vec::new();
    for d in declarations {
        let why = match d.kind {
            Kind::Missing if !up.contains_key(d.text.as_str()) => {
                Some("is declared missing but is not upstream's")
            }
            Kind::Missing if our.contains_key(d.text.as_str()) => {
                Some("is declared missing but is registered")
            }
            Kind::Ours if up.contains_key(d.text.as_str()) => Some("is declared ours but upstream has it"),
            Kind::Ours if !our.contains_key(d.text.as_str()) => {
                Some("is declared ours but is not registered")
            }
            _ => None,
        };
        if let Some(why) = why {
            out.push(Discrepancy::Stale { text: d.text.clone(), line: d.line, why });
        }
    }

    // Upstream specs we lack, and our specs upstream lacks; each side is matched against the
    // other side's leftovers.
    let lacking: Vec<&Spec> = upstream.iter().filter(|u| !our.contains_key(u.text.as_str())).collect();
    let extra: Vec<&Spec> = ours.iter().filter(|o| !up.contains_key(o.text.as_str())).collect();
    let mut renamed = Vec::new();
    for o in extra.iter().filter(|o| !is_declared(&o.text, Kind::Ours)) {
        if let Some(u) = lacking.iter().find(|u| same_tokens(&o.text, &u.text)) {
            renamed.push(u.text.as_str());
            out.push(Discrepancy::LabelPlacement { ours: o.text.clone(), upstream: u.text.clone() });
            continue;
        }
        let closest = closest(&o.text, lacking.iter().map(|u| u.text.as_str())).map(str::to_owned);
        out.push(Discrepancy::Unknown { ours: o.text.clone(), closest });
    }
    for u in &lacking {
        if is_declared(&u.text, Kind::Missing) || renamed.contains(&u.text.as_str()) {
            continue;
        }
        out.push(Discrepancy::Missing {
            upstream: u.text.clone(),
            origin: u.origin.clone(),
            closest: closest(&u.text, extra.iter().map(|o| o.text.as_str())).map(str::to_owned),
        });
    }

    for u in upstream {
        let Some(o) = our.get(u.text.as_str()) else { continue };
        if u.labels != o.labels {
            out.push(Discrepancy::Labels {
                text: u.text.clone(),
                only_upstream: u.labels.difference(&o.labels).cloned().collect(),
                only_ours: o.labels.difference(&u.labels).cloned().collect(),
            });
        }
    }
    out
}

/// Whether two texts have the same words and `[labels]`, ignoring order.
fn same_tokens(a: &str, b: &str) -> bool {
    fn sorted(s: &str) -> Vec<&str> {
        let mut v: Vec<&str> = s.split_whitespace().collect();
        v.sort_unstable();
        v
    }
    sorted(a) == sorted(b)
}

/// The candidate with the smallest word-level edit distance to `text`, first one on ties.
fn closest<'a>(text: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let words: Vec<&str> = text.split_whitespace().collect();
    candidates.min_by_key(|c| word_distance(&words, &c.split_whitespace().collect::<Vec<_>>()))
}

/// Levenshtein distance over words.
fn word_distance(a: &[&str], b: &[&str]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, wa) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, wb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(wa != wb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::files::parse_declarations;

    fn spec(text: &str, labels: &[&str]) -> Spec {
        Spec {
            text: text.to_owned(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            origin: "dra.go:1".to_owned(),
        }
    }

    const UP: &str = "[sig-node] [DRA] control plane [FeatureGate:X] should filter by pool name [Alpha] [Feature:OffByDefault]";
    const MISPLACED: &str = "[sig-node] [DRA] control plane [FeatureGate:X] [Alpha] [Feature:OffByDefault] should filter by pool name";
    const LABELS: [&str; 5] = ["sig-node", "DRA", "FeatureGate:X", "Alpha", "Feature:OffByDefault"];

    #[test]
    fn identical_lists_agree() {
        let up = [spec(UP, &LABELS), spec("[sig-node] [DRA] b", &["sig-node", "DRA"])];
        assert_eq!(compare(&up, &up, &[]), []);
    }

    #[test]
    fn reports_label_placement_once_with_both_texts() {
        let got = compare(&[spec(UP, &LABELS)], &[spec(MISPLACED, &LABELS)], &[]);
        assert_eq!(
            got,
            [Discrepancy::LabelPlacement { ours: MISPLACED.to_owned(), upstream: UP.to_owned() }]
        );
        assert!(got[0].to_string().contains("label order/placement differs"), "{}", got[0]);
    }

    #[test]
    fn prefers_the_same_words_in_another_order_over_a_closer_text() {
        let ours = "[sig-node] [DRA] a b c [X] [Y] [Z]";
        let moved = "[sig-node] [DRA] [X] [Y] [Z] a b c";
        let one_word_off = "[sig-node] [DRA] a b d [X] [Y] [Z]";
        let got = compare(&[spec(one_word_off, &[]), spec(moved, &[])], &[spec(ours, &[])], &[]);
        assert_eq!(
            got,
            [
                Discrepancy::LabelPlacement { ours: ours.to_owned(), upstream: moved.to_owned() },
                Discrepancy::Missing {
                    upstream: one_word_off.to_owned(),
                    origin: "dra.go:1".to_owned(),
                    closest: Some(ours.to_owned())
                },
            ]
        );
    }

    #[test]
    fn reports_missing_and_unknown_with_the_closest_text() {
        let renamed = "[sig-node] [DRA] control plane [FeatureGate:X] should filter by name [Alpha] [Feature:OffByDefault]";
        let far = "[sig-node] [DRA] kubelet something else entirely";
        let got = compare(&[spec(UP, &LABELS)], &[spec(far, &[]), spec(renamed, &LABELS)], &[]);
        assert_eq!(
            got,
            [
                Discrepancy::Unknown { ours: far.to_owned(), closest: Some(UP.to_owned()) },
                Discrepancy::Unknown { ours: renamed.to_owned(), closest: Some(UP.to_owned()) },
                Discrepancy::Missing {
                    upstream: UP.to_owned(),
                    origin: "dra.go:1".to_owned(),
                    closest: Some(renamed.to_owned())
                },
            ]
        );
    }

    #[test]
    fn reports_label_set_differences() {
        let got = compare(
            &[spec(UP, &LABELS)],
            &[spec(UP, &["DRA", "FeatureGate:X", "Alpha", "Feature:OffByDefault", "Slow"])],
            &[],
        );
        assert_eq!(
            got,
            [Discrepancy::Labels {
                text: UP.to_owned(),
                only_upstream: vec!["sig-node".to_owned()],
                only_ours: vec!["Slow".to_owned()]
            }]
        );
    }

    #[test]
    fn honours_declarations_and_reports_stale_ones() {
        let ours_only = "[sig-node] [DRA] ours only";
        let up = [spec(UP, &LABELS), spec("[sig-node] [DRA] later", &[])];
        let ours = [spec(UP, &LABELS), spec(ours_only, &[])];
        let declarations = parse_declarations(&format!(
            "missing: not yet\n[sig-node] [DRA] later\nours: extra\n{ours_only}\n"
        ))
        .unwrap();
        assert_eq!(compare(&up, &ours, &declarations), []);

        let stale = parse_declarations(&format!(
            "missing: not yet\n{UP}\n[sig-node] [DRA] nowhere\nours: extra\n[sig-node] [DRA] later\n{ours_only}\n[sig-node] [DRA] gone\n"
        ))
        .unwrap();
        let whys: Vec<_> = compare(&up, &ours, &stale)
            .into_iter()
            .filter_map(|d| match d {
                Discrepancy::Stale { line, why, .. } => Some((line, why)),
                _ => None,
            })
            .collect();
        assert_eq!(
            whys,
            [
                (2, "is declared missing but is registered"),
                (3, "is declared missing but is not upstream's"),
                (5, "is declared ours but upstream has it"),
                (7, "is declared ours but is not registered"),
            ]
        );
    }

    #[test]
    fn measures_word_distance() {
        fn w(s: &str) -> Vec<&str> {
            s.split_whitespace().collect()
        }
        assert_eq!(word_distance(&w("a b c"), &w("a b c")), 0);
        assert_eq!(word_distance(&w("a b c"), &w("a c")), 1);
        assert_eq!(word_distance(&w("a b c"), &w("c b a")), 2);
        assert_eq!(word_distance(&w(""), &w("a b")), 2);
    }
}
