//! Whether a DeviceClass selects the devices of a driver, decided from the AST of its CEL
//! selectors (parsed with the `cel` crate), never from their text: a class selects driver `D`
//! when its selectors *require* `device.driver == "D"`, that is when
//!
//! - one of them is `device.driver == "D"` (either side), or `device.driver in ["D"]`;
//! - or one of them is a conjunction (`&&`) with such a term, at any depth;
//! - or a disjunction (`||`) all of whose terms require it.
//!
//! The selectors of a class are ANDed, so one that requires the driver suffices. A class whose
//! selectors require another driver, or two different ones (it selects nothing), does not
//! select `D`; neither does one whose selectors prove nothing about the driver (none, or
//! expressions such as `device.driver.startsWith("D")`): the specs would get devices they cannot
//! attribute to the driver.

use cel::common::ast::{CallExpr, Expr, LiteralValue, operators};
use k8s_openapi::api::resource::v1::DeviceClass;

/// What a class's selectors require of `device.driver`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverRequirement {
    /// `device.driver` must be this name.
    Driver(String),
    /// Two different names at once: the class selects no device.
    Contradiction(String, String),
    /// Nothing provable; the text says why.
    Unproven(String),
}

impl DriverRequirement {
    /// Both must hold (`&&`, or two selectors of one class).
    fn and(self, other: DriverRequirement) -> DriverRequirement {
        use DriverRequirement::*;
        match (self, other) {
            (c @ Contradiction(..), _) | (_, c @ Contradiction(..)) => c,
            (Driver(a), Driver(b)) if a != b => Contradiction(a, b),
            (d @ Driver(_), _) | (_, d @ Driver(_)) => d,
            (Unproven(a), Unproven(_)) => Unproven(a),
        }
    }

    /// One must hold (`||`): only a name both require is required.
    fn or(self, other: DriverRequirement) -> DriverRequirement {
        use DriverRequirement::*;
        match (self, other) {
            (Driver(a), Driver(b)) if a == b => Driver(a),
            (Contradiction(..), other) | (other, Contradiction(..)) => other,
            _ => Unproven("a disjunction (||) whose terms do not all require the same driver".to_owned()),
        }
    }
}

/// What the selectors of `class` require of `device.driver` (ANDed over its CEL selectors).
pub fn class_requirement(class: &DeviceClass) -> DriverRequirement {
    let selectors = class.spec.as_ref().and_then(|s| s.selectors.as_ref());
    let expressions: Vec<&str> = selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .map(|c| c.expression.as_str())
        .collect();
    if expressions.is_empty() {
        return DriverRequirement::Unproven(
            "it has no CEL selector, so it selects the devices of every driver".to_owned(),
        );
    }
    expressions
        .into_iter()
        .map(expression_requirement)
        .reduce(DriverRequirement::and)
        .unwrap_or_else(|| DriverRequirement::Unproven("no selector".to_owned()))
}

/// What one CEL expression requires of `device.driver`.
pub fn expression_requirement(expression: &str) -> DriverRequirement {
    match cel::parser::Parser::new().parse(expression) {
        Ok(ast) => requirement(&ast.expr),
        Err(e) => DriverRequirement::Unproven(format!(
            "its selector {expression:?} is no CEL expression: {}",
            e.to_string().replace('\n', "; ")
        )),
    }
}

fn requirement(expr: &Expr) -> DriverRequirement {
    let unproven = || {
        DriverRequirement::Unproven(
            "no selector requires device.driver == \"<name>\" (alone, or as a term of &&)".to_owned(),
        )
    };
    let Expr::Call(call) = expr else { return unproven() };
    match call.func_name.as_str() {
        operators::LOGICAL_AND => fold(call, DriverRequirement::and).unwrap_or_else(unproven),
        operators::LOGICAL_OR => fold(call, DriverRequirement::or).unwrap_or_else(unproven),
        operators::EQUALS => match call.args.as_slice() {
            [a, b] if is_device_driver(&a.expr) => {
                string_literal(&b.expr).map_or_else(unproven, DriverRequirement::Driver)
            }
            [a, b] if is_device_driver(&b.expr) => {
                string_literal(&a.expr).map_or_else(unproven, DriverRequirement::Driver)
            }
            _ => unproven(),
        },
        operators::IN => match call.args.as_slice() {
            [a, list] if is_device_driver(&a.expr) => match &list.expr {
                Expr::List(list) => match list.elements.as_slice() {
                    [one] => string_literal(&one.expr).map_or_else(unproven, DriverRequirement::Driver),
                    _ => unproven(),
                },
                _ => unproven(),
            },
            _ => unproven(),
        },
        _ => unproven(),
    }
}

/// The operator's arguments' requirements combined with `combine`; `None` without arguments.
fn fold(
    call: &CallExpr,
    combine: fn(DriverRequirement, DriverRequirement) -> DriverRequirement,
) -> Option<DriverRequirement> {
    call.args.iter().map(|a| requirement(&a.expr)).reduce(combine)
}

/// Whether `expr` is `device.driver`.
fn is_device_driver(expr: &Expr) -> bool {
    matches!(expr, Expr::Select(s) if !s.test && s.field == "driver" && matches!(&s.operand.expr, Expr::Ident(d) if d == "device"))
}

fn string_literal(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_owned()),
        _ => None,
    }
}

/// Why `class` does not select the devices of `driver` only, or `None` when it does.
pub fn not_selecting(class: &DeviceClass, driver: &str) -> Option<String> {
    match class_requirement(class) {
        DriverRequirement::Driver(d) if d == driver => None,
        DriverRequirement::Driver(other) => {
            Some(format!("its selectors require device.driver == {other:?}, another driver"))
        }
        DriverRequirement::Contradiction(a, b) => Some(format!(
            "its selectors require device.driver to be both {a:?} and {b:?}, so it selects no device"
        )),
        DriverRequirement::Unproven(why) => Some(why),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    const D: &str = "d.example.com";

    fn driver(name: &str) -> DriverRequirement {
        DriverRequirement::Driver(name.to_owned())
    }

    #[test]
    fn a_driver_is_required_only_in_forms_the_ast_proves() {
        for expression in [
            r#"device.driver == "d.example.com""#,
            r#""d.example.com" == device.driver"#,
            "device.driver=='d.example.com'",
            r#"device.driver in ["d.example.com"]"#,
            r#"device.attributes["d.example.com"].model == "x" && device.driver == "d.example.com""#,
            r#"(device.driver == "d.example.com") && (true || false)"#,
            r#"device.driver == "d.example.com" || device.driver == 'd.example.com'"#,
            r#"a && (b && device.driver == "d.example.com")"#,
        ] {
            assert_eq!(expression_requirement(expression), driver(D), "{expression}");
        }
        for expression in [
            r#"device.driver == "d.example.com" || true"#,
            r#"device.driver != "d.example.com""#,
            r#"!(device.driver == "d.example.com")"#,
            r#"device.driver.startsWith("d.example.com")"#,
            r#"device.driver in ["d.example.com", "e.example.com"]"#,
            r#"device.attributes["device.driver"] == "d.example.com""#,
            r#"other.driver == "d.example.com""#,
            r#"device.driver == x"#,
            r#"has(device.driver) ? device.driver == "d.example.com" : true"#,
            r#"'device.driver == "d.example.com"'"#,
            "true",
        ] {
            assert!(
                matches!(expression_requirement(expression), DriverRequirement::Unproven(_)),
                "{expression}: {:?}",
                expression_requirement(expression)
            );
        }
        assert_eq!(
            expression_requirement(r#"device.driver == "a.example.com" && device.driver == "b.example.com""#),
            DriverRequirement::Contradiction("a.example.com".into(), "b.example.com".into())
        );
        let broken = expression_requirement(r#"device.driver == "d.example.com" &&"#);
        assert!(
            matches!(&broken, DriverRequirement::Unproven(why) if why.contains("is no CEL expression")),
            "{broken:?}"
        );
    }

    fn class(expressions: &[&str]) -> DeviceClass {
        let selectors: Vec<_> =
            expressions.iter().map(|e| serde_json::json!({ "cel": { "expression": e } })).collect();
        serde_json::from_value(
            serde_json::json!({ "metadata": { "name": "c" }, "spec": { "selectors": selectors } }),
        )
        .unwrap()
    }

    #[test]
    fn a_class_selects_the_driver_when_one_of_its_selectors_requires_it() {
        assert_eq!(not_selecting(&class(&[r#"device.driver == "d.example.com""#]), D), None);
        assert_eq!(not_selecting(&class(&["true", r#"device.driver == "d.example.com""#]), D), None);
        let other = not_selecting(&class(&[r#"device.driver == "e.example.com""#]), D).unwrap();
        assert!(other.contains("\"e.example.com\", another driver"), "{other}");
        let none = not_selecting(&class(&[]), D).unwrap();
        assert!(none.contains("no CEL selector"), "{none}");
        let both = not_selecting(
            &class(&[r#"device.driver == "d.example.com""#, r#"device.driver == "e.example.com""#]),
            D,
        )
        .unwrap();
        assert!(both.contains("selects no device"), "{both}");
        let loose = not_selecting(&class(&[r#"device.driver.endsWith("example.com")"#]), D).unwrap();
        assert!(loose.contains("no selector requires"), "{loose}");
    }
}
