//! Turns raw TOML values into sweep axes, with errors that name the key.

use toml::Value;

/// Describes a value for error messages: its TOML type and a short rendering.
pub fn describe(v: &Value) -> String {
    let s = v.to_string();
    let s = if s.len() > 40 { format!("{}...", &s[..40]) } else { s };
    format!("{} {}", v.type_str(), s)
}

/// A positive integer, or a list of them.
pub fn usize_axis(v: &Value, key: &str, min: usize) -> Result<Vec<usize>, String> {
    let one = |x: &Value| -> Result<usize, String> {
        match x {
            Value::Integer(i) if *i >= min as i64 => Ok(*i as usize),
            Value::Integer(i) => Err(format!("key `{key}`: {i} is below the minimum {min}")),
            other => Err(format!(
                "key `{key}`: expected an integer or a list of integers, got {}",
                describe(other)
            )),
        }
    };
    match v {
        Value::Array(a) if a.is_empty() => Err(format!("key `{key}`: the list is empty; give at least one value")),
        Value::Array(a) => a.iter().map(one).collect(),
        x => Ok(vec![one(x)?]),
    }
}

/// A string, or a list of strings, each parsed by `parse`.
pub fn str_axis<T>(v: &Value, key: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let one = |x: &Value| -> Result<T, String> {
        match x {
            Value::String(s) => parse(s).map_err(|e| format!("key `{key}`: {e}")),
            other => Err(format!(
                "key `{key}`: expected a string or a list of strings, got {}",
                describe(other)
            )),
        }
    };
    match v {
        Value::Array(a) if a.is_empty() => Err(format!("key `{key}`: the list is empty; give at least one value")),
        Value::Array(a) => a.iter().map(one).collect(),
        x => Ok(vec![one(x)?]),
    }
}

/// A required key, with the error naming it.
pub fn required<'a>(v: &'a Option<Value>, key: &str) -> Result<&'a Value, String> {
    v.as_ref().ok_or_else(|| format!("key `{key}` is missing"))
}
