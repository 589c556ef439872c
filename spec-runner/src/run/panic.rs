//! What a panic in a spec's task, a cleanup or a deferred check says.

/// The message of a panic payload (`&str` or `String`, as `panic!` makes them).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_owned(),
            Err(_) => "a panic with a non-string payload".to_owned(),
        },
    }
}
