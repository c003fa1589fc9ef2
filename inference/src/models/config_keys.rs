//! Reading a family's own keys from its `config.json`: as a serde struct of the family's
//! (the way a family should read them: every key named once, types checked, one error that
//! names the family), or one key at a time for the shared readers.

use crate::error::{InferenceError, Result};
use serde_json::Value;

/// The family's own keys of `json`, as its struct `T`; an error names the family and the key.
pub(crate) fn family_keys<T: serde::de::DeserializeOwned>(json: &Value, family: &str) -> Result<T> {
    T::deserialize(json)
        .map_err(|e| InferenceError::BadConfig(format!("a {family} config.json: {e}")))
}

/// An integer of config.json, or `default` when absent or null.
pub(crate) fn usize_or(v: &Value, key: &str, default: usize) -> usize {
    v.get(key)
        .and_then(Value::as_u64)
        .map_or(default, |x| x as usize)
}

/// A required integer of config.json; an error names the key and, when it is there but not
/// a non-negative integer, what it holds.
pub(crate) fn required(v: &Value, key: &str) -> Result<usize> {
    match v.get(key) {
        Some(n) => n.as_u64().map(|x| x as usize).ok_or_else(|| {
            let shown: String = n.to_string().chars().take(40).collect();
            InferenceError::BadConfig(format!(
                "config.json's `{key}` is {shown}; it must be a non-negative integer"
            ))
        }),
        None => Err(InferenceError::BadConfig(format!(
            "config.json has no `{key}`"
        ))),
    }
}
