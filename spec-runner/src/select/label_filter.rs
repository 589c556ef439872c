//! `--label-filter`: ginkgo's label expression language.
//!
//! Grammar (loosest binding first):
//!
//! ```text
//! expr    := and (("||" | ",") and)*
//! and     := unary ("&&" unary)*
//! unary   := "!" unary | primary
//! primary := "(" expr ")" | "/" regex "/" | label | key ": " set-op [argument]
//! set-op  := containsAny | containsAll | consistsOf | isSubsetOf | isEmpty   (any case)
//! argument:= "{" value ("," value)* "}" | value
//! ```
//!
//! As in ginkgo: a bare label matches a spec label case-insensitively (it may
//! contain spaces: `a b` is one label); `/regex/` matches if the regex matches
//! any label (case-sensitive unless the regex says `(?i)`); `,` is `||`; `!`
//! binds tighter than `&&`, which binds tighter than `||`. A label
//! `Key:Value` is also the value `value` of the set `key`; set operations
//! compare keys and values trimmed and case-insensitively. `isSubsetOf` is
//! true when the spec has no value for the key, which is why upstream CI's
//! `DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky` also
//! runs specs without any `Feature:` label. A `:` starts a set operation only
//! when a space follows it, so `Feature:DRA` is a plain label.
//! An empty (or all-blank) expression matches every spec.

use std::collections::BTreeSet;

use regex::Regex;

use crate::spec::label::key_value;

/// A parse error, with the 0-based character position where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (at column {} of {input:?})", position + 1)]
pub struct LabelFilterError {
    /// The expression as given.
    pub input: String,
    /// 0-based character index into `input`.
    pub position: usize,
    /// What is wrong, in one sentence.
    pub message: String,
}

/// A parsed label filter expression.
#[derive(Debug, Clone)]
pub struct LabelFilter {
    expr: Option<Expr>,
    source: String,
}

#[derive(Debug, Clone)]
enum Expr {
    Label(String),
    Regex(Regex),
    Set { key: String, op: SetOp, values: Vec<String> },
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetOp {
    ContainsAny,
    ContainsAll,
    ConsistsOf,
    IsSubsetOf,
    IsEmpty,
}

impl SetOp {
    fn parse(word: &str) -> Option<Self> {
        Some(match word.to_lowercase().as_str() {
            "containsany" => Self::ContainsAny,
            "containsall" => Self::ContainsAll,
            "consistsof" => Self::ConsistsOf,
            "issubsetof" => Self::IsSubsetOf,
            "isempty" => Self::IsEmpty,
            _ => return None,
        })
    }

    const ALL: [(&'static str, SetOp); 5] = [
        ("containsAny", SetOp::ContainsAny),
        ("containsAll", SetOp::ContainsAll),
        ("consistsOf", SetOp::ConsistsOf),
        ("isSubsetOf", SetOp::IsSubsetOf),
        ("isEmpty", SetOp::IsEmpty),
    ];

    fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, op)| *op == self).map_or("?", |(name, _)| name)
    }
}

impl LabelFilter {
    /// Parses an expression; an empty one matches everything.
    pub fn parse(input: &str) -> Result<Self, LabelFilterError> {
        if input.trim().is_empty() {
            return Ok(Self { expr: None, source: input.to_owned() });
        }
        let tokens = Lexer::new(input).tokens()?;
        let mut parser = Parser { tokens, next: 0, input, depth: 0 };
        let expr = parser.expression()?;
        parser.expect_end()?;
        Ok(Self { expr: Some(expr), source: input.to_owned() })
    }

    /// The filter that selects everything.
    pub fn match_all() -> Self {
        Self { expr: None, source: String::new() }
    }

    /// The expression as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether a spec with these labels is selected.
    pub fn matches<S: AsRef<str>>(&self, labels: &[S]) -> bool {
        self.expr.as_ref().is_none_or(|e| e.eval(labels))
    }
}

impl Expr {
    fn eval<S: AsRef<str>>(&self, labels: &[S]) -> bool {
        match self {
            Expr::Label(wanted) => labels.iter().any(|l| l.as_ref().to_lowercase() == *wanted),
            Expr::Regex(re) => labels.iter().any(|l| re.is_match(l.as_ref())),
            Expr::Not(e) => !e.eval(labels),
            Expr::And(a, b) => a.eval(labels) && b.eval(labels),
            Expr::Or(a, b) => a.eval(labels) || b.eval(labels),
            Expr::Set { key, op, values } => {
                let set: BTreeSet<String> = labels
                    .iter()
                    .filter_map(|l| key_value(l.as_ref()))
                    .filter(|(k, _)| k == key)
                    .map(|(_, v)| v)
                    .collect();
                match op {
                    SetOp::IsEmpty => set.is_empty(),
                    SetOp::ContainsAny => values.iter().any(|v| set.contains(v)),
                    SetOp::ContainsAll => values.iter().all(|v| set.contains(v)),
                    SetOp::ConsistsOf => {
                        let wanted: BTreeSet<&String> = values.iter().collect();
                        set.len() == wanted.len() && wanted.iter().all(|v| set.contains(*v))
                    }
                    SetOp::IsSubsetOf => set.iter().all(|v| values.contains(v)),
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    And,
    Or,
    Not,
    Open,
    Close,
    Regex(String),
    Label(String),
    SetKey(String),
    SetOp(SetOp),
    SetArg(String),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::And => "'&&'".to_owned(),
            Tok::Or => "'||'".to_owned(),
            Tok::Not => "'!'".to_owned(),
            Tok::Open => "'('".to_owned(),
            Tok::Close => "')'".to_owned(),
            Tok::Regex(r) => format!("/{r}/"),
            Tok::Label(l) => format!("label {l:?}"),
            Tok::SetKey(k) => format!("set key {k:?}"),
            Tok::SetOp(op) => format!("set operation {}", op.name()),
            Tok::SetArg(a) => format!("set argument {a:?}"),
            Tok::End => "the end".to_owned(),
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    pos: usize,
}

struct Lexer<'a> {
    input: &'a str,
    chars: Vec<char>,
    i: usize,
    last: Option<Tok>,
}

const OPERATOR_CHARS: &str = "&|!,()/";

impl<'a> Lexer<'a> {
    fn new(input: &'a str) -> Self {
        Self { input, chars: input.chars().collect(), i: 0, last: None }
    }

    fn error(&self, position: usize, message: impl Into<String>) -> LabelFilterError {
        LabelFilterError { input: self.input.to_owned(), position, message: message.into() }
    }

    /// Characters from the cursor up to (not including) one of `stops`.
    fn take_until(&mut self, stops: &str) -> String {
        let start = self.i;
        while self.i < self.chars.len() && !stops.contains(self.chars[self.i]) {
            self.i += 1;
        }
        self.chars[start..self.i].iter().collect()
    }

    fn peek_at(&self, index: usize) -> Option<char> {
        self.chars.get(index).copied()
    }

    fn tokens(mut self) -> Result<Vec<Token>, LabelFilterError> {
        let mut out = Vec::new();
        loop {
            let token = self.next_token()?;
            self.last = Some(token.tok.clone());
            let end = token.tok == Tok::End;
            out.push(token);
            if end {
                return Ok(out);
            }
        }
    }

    fn next_token(&mut self) -> Result<Token, LabelFilterError> {
        while self.peek_at(self.i) == Some(' ') {
            self.i += 1;
        }
        let pos = self.i;
        let Some(c) = self.peek_at(self.i) else {
            return Ok(Token { tok: Tok::End, pos });
        };
        let tok = match self.last {
            Some(Tok::SetKey(_)) => {
                let word = self.take_until(" )");
                let op = SetOp::parse(&word).ok_or_else(|| {
                    self.error(
                        pos,
                        format!(
                            "invalid set operation {word:?}; use containsAny, containsAll, consistsOf, isSubsetOf or isEmpty"
                        ),
                    )
                })?;
                Tok::SetOp(op)
            }
            Some(Tok::SetOp(op)) => self.set_argument(op, pos)?,
            _ => match c {
                '&' | '|' => {
                    if self.peek_at(self.i + 1) != Some(c) {
                        return Err(self.error(pos, format!("invalid token '{c}'; did you mean '{c}{c}'?")));
                    }
                    self.i += 2;
                    if c == '&' { Tok::And } else { Tok::Or }
                }
                ',' => {
                    self.i += 1;
                    Tok::Or
                }
                '!' => {
                    self.i += 1;
                    Tok::Not
                }
                '(' => {
                    self.i += 1;
                    Tok::Open
                }
                ')' => {
                    self.i += 1;
                    Tok::Close
                }
                '/' => {
                    self.i += 1;
                    let body = self.take_until("/");
                    if self.i >= self.chars.len() {
                        return Err(self.error(pos, "regular expression has no closing '/'"));
                    }
                    self.i += 1;
                    Tok::Regex(body)
                }
                _ => self.label_or_set_key(pos)?,
            },
        };
        Ok(Token { tok, pos })
    }

    fn set_argument(&mut self, op: SetOp, pos: usize) -> Result<Tok, LabelFilterError> {
        let arg = if self.peek_at(self.i) == Some('{') {
            self.i += 1;
            let body = self.take_until("}");
            if self.i >= self.chars.len() {
                return Err(self.error(pos, "missing closing '}' in set operation argument"));
            }
            self.i += 1;
            body
        } else {
            self.take_until(OPERATOR_CHARS).trim().to_owned()
        };
        if op == SetOp::IsEmpty && !arg.trim().is_empty() {
            return Err(self.error(pos, format!("isEmpty takes no argument, but was given {arg:?}")));
        }
        if op != SetOp::IsEmpty && arg.trim().is_empty() {
            let message = if self.peek_at(self.i) == Some('/') {
                "set operations do not support regular expressions".to_owned()
            } else {
                format!("set operation {} needs an argument such as {{A, B}}", op.name())
            };
            return Err(self.error(pos, message));
        }
        Ok(Tok::SetArg(arg))
    }

    fn label_or_set_key(&mut self, pos: usize) -> Result<Tok, LabelFilterError> {
        let mut value = self.take_until("&|!,()/:");
        if self.peek_at(self.i) == Some(':') {
            if self.peek_at(self.i + 1) == Some(' ') {
                let key = value.trim();
                if key.is_empty() {
                    return Err(self.error(self.i, "missing set key before ': '"));
                }
                self.i += 1;
                return Ok(Tok::SetKey(key.to_owned()));
            }
            let colon = self.i;
            let rest = self.take_until(OPERATOR_CHARS);
            if rest.trim() == ":" {
                return Err(
                    self.error(colon, "missing set operation after ':' (write 'key: operation {values}')")
                );
            }
            value.push_str(&rest);
        }
        let lower = value.to_lowercase();
        for (name, _) in SetOp::ALL {
            if let Some(index) = lower.find(&format!(" {}", name.to_lowercase()))
                && index > 0
            {
                let column = pos + lower[..index].chars().count() + 1;
                return Err(self.error(
                    column,
                    format!("looks like the set operation {name} without a set key; did you forget the ': ' after the key?"),
                ));
            }
        }
        Ok(Tok::Label(value.trim().to_owned()))
    }
}

struct Parser<'a> {
    tokens: Vec<Token>,
    next: usize,
    input: &'a str,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        // The lexer always ends the list with `End`, and `bump` never moves past it.
        &self.tokens[self.next.min(self.tokens.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let token = self.peek().clone();
        if token.tok != Tok::End {
            self.next += 1;
        }
        token
    }

    fn error(&self, position: usize, message: impl Into<String>) -> LabelFilterError {
        LabelFilterError { input: self.input.to_owned(), position, message: message.into() }
    }

    fn expression(&mut self) -> Result<Expr, LabelFilterError> {
        let mut left = self.and()?;
        while self.peek().tok == Tok::Or {
            self.bump();
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, LabelFilterError> {
        let mut left = self.unary()?;
        while self.peek().tok == Tok::And {
            self.bump();
            let right = self.unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, LabelFilterError> {
        if self.peek().tok == Tok::Not {
            self.bump();
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, LabelFilterError> {
        let previous = self.next.checked_sub(1).map(|i| self.tokens[i].clone());
        let token = self.bump();
        match token.tok {
            Tok::Label(label) => Ok(Expr::Label(label.to_lowercase())),
            Tok::Regex(source) => Regex::new(&source).map(Expr::Regex).map_err(|e| {
                self.error(token.pos, format!("invalid regular expression /{source}/: {}", regex_reason(&e)))
            }),
            Tok::SetKey(key) => self.set(key, token.pos),
            Tok::Open => {
                if self.peek().tok == Tok::Close {
                    return Err(self.error(token.pos, "empty '()' group"));
                }
                self.depth += 1;
                let inner = self.expression()?;
                if self.peek().tok != Tok::Close {
                    return Err(self.error(token.pos, "'(' has no matching ')'"));
                }
                self.bump();
                self.depth -= 1;
                Ok(inner)
            }
            Tok::And | Tok::Or => Err(self.error(
                token.pos,
                format!("operator {} is missing its left-hand operand", token.tok.describe()),
            )),
            Tok::End => Err(match previous {
                Some(Token { tok: op @ (Tok::And | Tok::Or | Tok::Not), pos }) => {
                    self.error(pos, format!("operator {} is missing its right-hand operand", op.describe()))
                }
                _ => self.error(token.pos, "unexpected end of the expression"),
            }),
            Tok::Close if self.depth == 0 => Err(self.error(token.pos, "')' has no matching '('")),
            other => Err(self.error(
                token.pos,
                format!(
                    "expected a label, /regex/, 'key: operation', '!' or '(' but found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn set(&mut self, key: String, pos: usize) -> Result<Expr, LabelFilterError> {
        let op_token = self.bump();
        let (op, op_pos) = match op_token.tok {
            Tok::SetOp(op) => (op, op_token.pos),
            _ => {
                return Err(self.error(
                    pos,
                    format!(
                        "set key {key:?} needs an operation: containsAny, containsAll, consistsOf, isSubsetOf or isEmpty"
                    ),
                ));
            }
        };
        let argument = match &self.peek().tok {
            Tok::SetArg(arg) => {
                let arg = arg.clone();
                let arg_pos = self.peek().pos;
                self.bump();
                Some((arg, arg_pos))
            }
            _ => None,
        };
        let mut values = Vec::new();
        match (op, argument) {
            (SetOp::IsEmpty, _) => {}
            (_, None) => {
                return Err(self.error(
                    op_pos,
                    format!("set operation {} needs an argument such as {{A, B}}", op.name()),
                ));
            }
            (_, Some((arg, arg_pos))) => {
                for raw in arg.split(',') {
                    let value = raw.trim().to_lowercase();
                    if value.is_empty() {
                        return Err(self.error(arg_pos, "empty value in set operation argument"));
                    }
                    if value.contains(|c| OPERATOR_CHARS.contains(c)) {
                        return Err(
                            self.error(arg_pos, format!("invalid value {value:?} in set operation argument"))
                        );
                    }
                    values.push(value);
                }
            }
        }
        Ok(Expr::Set { key: key.trim().to_lowercase(), op, values })
    }

    fn expect_end(&mut self) -> Result<(), LabelFilterError> {
        let token = self.peek().clone();
        match token.tok {
            Tok::End => Ok(()),
            Tok::Close => Err(self.error(token.pos, "')' has no matching '('")),
            other => Err(self
                .error(token.pos, format!("expected an operator (&&, || or ,) before {}", other.describe()))),
        }
    }
}

/// The one-line reason of a regex error (its `Display` spans several lines).
pub(crate) fn regex_reason(error: &regex::Error) -> String {
    let text = error.to_string();
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map_or_else(|| text.split_whitespace().collect::<Vec<_>>().join(" "), str::to_owned)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const DRA_KUBELET: &[&str] = &["DRA", "Feature:DynamicResourceAllocation"];
    const DRA_CP: &[&str] = &["DRA"];
    const DRA_ALPHA: &[&str] = &[
        "DRA",
        "Feature:DynamicResourceAllocation",
        "FeatureGate:DRAResourcePoolStatus",
        "Alpha",
        "Feature:OffByDefault",
    ];
    const SLOW: &[&str] = &["DRA", "Slow", "Serial"];
    const FLAKY: &[&str] = &["DRA", "Flaky"];
    const NONE: &[&str] = &[];

    fn m(expr: &str, labels: &[&str]) -> bool {
        LabelFilter::parse(expr).unwrap().matches(labels)
    }

    #[rstest]
    #[case("", NONE, true)]
    #[case("  ", DRA_CP, true)]
    #[case("DRA", DRA_CP, true)]
    #[case("dra", DRA_CP, true)]
    #[case("Slow", DRA_CP, false)]
    #[case("!Slow", DRA_CP, true)]
    #[case("!!Slow", SLOW, true)]
    #[case("DRA && !Slow", SLOW, false)]
    #[case("Slow || Flaky", FLAKY, true)]
    #[case("Slow, Flaky", FLAKY, true)]
    #[case("Slow,Flaky", NONE, false)]
    // precedence: `!` > `&&` > `||`
    #[case("Flaky || Slow && Missing", FLAKY, true)]
    #[case("(Flaky || Slow) && Missing", FLAKY, false)]
    #[case("!Flaky && DRA", FLAKY, false)]
    #[case("!(Flaky && Missing)", FLAKY, true)]
    #[case("((DRA))", DRA_CP, true)]
    #[case("feature:dynamicresourceallocation", DRA_KUBELET, true)]
    // regexes match any label, case-sensitively
    #[case("/^Feature:/", DRA_KUBELET, true)]
    #[case("/^feature:/", DRA_KUBELET, false)]
    #[case("/(?i)^feature:/", DRA_KUBELET, true)]
    #[case("/Slo/ && !/Flak/", SLOW, true)]
    // set queries on `key:value` labels
    #[case("Feature: isSubsetOf {DynamicResourceAllocation}", DRA_KUBELET, true)]
    #[case("Feature: isSubsetOf {DynamicResourceAllocation}", DRA_CP, true)]
    #[case("Feature: isSubsetOf {DynamicResourceAllocation}", DRA_ALPHA, false)]
    #[case("Feature: isSubsetOf { DynamicResourceAllocation, OffByDefault }", DRA_ALPHA, true)]
    #[case("Feature: containsAny {OffByDefault, X}", DRA_ALPHA, true)]
    #[case("Feature: containsAny OffByDefault", DRA_ALPHA, true)]
    #[case("Feature: containsAny {X}", DRA_ALPHA, false)]
    #[case("Feature: containsAll {offbydefault, DYNAMICRESOURCEALLOCATION}", DRA_ALPHA, true)]
    #[case("Feature: containsAll {OffByDefault, X}", DRA_ALPHA, false)]
    #[case("Feature: consistsOf {DynamicResourceAllocation}", DRA_KUBELET, true)]
    #[case("Feature: consistsOf {DynamicResourceAllocation}", DRA_ALPHA, false)]
    #[case("Feature: isEmpty", DRA_CP, true)]
    #[case("Feature: isEmpty", DRA_KUBELET, false)]
    #[case("feature: ISEMPTY && DRA", DRA_CP, true)]
    #[case("!Feature: isEmpty", DRA_KUBELET, true)]
    // upstream CI's DRA lane
    #[case("DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky", DRA_KUBELET, true)]
    #[case("DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky", DRA_CP, true)]
    #[case("DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky", DRA_ALPHA, false)]
    #[case("DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky", FLAKY, false)]
    #[case("DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky", NONE, false)]
    fn evaluates(#[case] expr: &str, #[case] labels: &[&str], #[case] expected: bool) {
        assert_eq!(m(expr, labels), expected, "{expr:?} on {labels:?}");
    }

    #[rstest]
    #[case("DRA &&", 4, "operator '&&' is missing its right-hand operand")]
    #[case("&& DRA", 0, "operator '&&' is missing its left-hand operand")]
    #[case("DRA & Slow", 4, "invalid token '&'; did you mean '&&'?")]
    #[case("DRA | Slow", 4, "invalid token '|'; did you mean '||'?")]
    #[case("(DRA", 0, "'(' has no matching ')'")]
    #[case("DRA)", 3, "')' has no matching '('")]
    #[case("()", 0, "empty '()' group")]
    #[case("DRA (Slow)", 4, "expected an operator (&&, || or ,) before '('")]
    #[case("DRA !Slow", 4, "expected an operator (&&, || or ,) before '!'")]
    #[case("/[/", 0, "invalid regular expression /[/: unclosed character class")]
    #[case("/abc", 0, "regular expression has no closing '/'")]
    #[case("!", 0, "operator '!' is missing its right-hand operand")]
    #[case("Feature: frobnicate {A}", 9, "invalid set operation \"frobnicate\"")]
    #[case("Feature: containsAny", 9, "set operation containsAny needs an argument")]
    #[case("Feature: containsAny && DRA", 21, "set operation containsAny needs an argument")]
    #[case("Feature: containsAny /x/", 21, "set operations do not support regular expressions")]
    #[case("Feature: containsAny {A", 21, "missing closing '}'")]
    #[case("Feature: containsAny {A,,B}", 21, "empty value in set operation argument")]
    #[case("Feature: isEmpty {A}", 17, "isEmpty takes no argument")]
    #[case("Feature isSubsetOf {A}", 8, "did you forget the ': ' after the key?")]
    #[case(": isEmpty", 0, "missing set key")]
    #[case("Feature: ", 0, "set key \"Feature\" needs an operation")]
    fn reports_errors_with_position(#[case] expr: &str, #[case] position: usize, #[case] message: &str) {
        let error = LabelFilter::parse(expr).unwrap_err();
        assert!(error.message.contains(message), "{expr:?}: got {:?}, want {message:?}", error.message);
        assert_eq!(error.position, position, "{expr:?}: {error}");
        assert_eq!(error.input, expr);
        assert_eq!(error.to_string().lines().count(), 1, "one line: {error}");
        assert!(error.to_string().contains(&format!("column {}", position + 1)));
    }
}
