//! Typed reads of JSON object fields, each failure a [`ImportError::BadField`] that names the
//! file, the dotted field path, what was expected and what was found.
//!
//! Conventions: an absent key and a `null` value are the same ("not set") for optional reads,
//! as `transformers` treats `None` as "use the default" for every field read here; a required
//! read reports both as missing.

use std::path::Path;

use serde_json::{Map, Value};

use super::error::ImportError;

type R<T> = Result<T, ImportError>;

/// A JSON object being read, with the file it came from and its path inside that file.
#[derive(Clone, Copy)]
pub(crate) struct Fields<'a> {
    file: &'a Path,
    obj: &'a Map<String, Value>,
    /// `""` at top level, `"rope_parameters."` inside that dict.
    prefix: &'a str,
}

/// Up to 60 characters of a JSON value, for "found ..." in messages.
pub(crate) fn show(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= 60 {
        text
    } else {
        let head: String = text.chars().take(57).collect();
        format!("{head}...")
    }
}

impl<'a> Fields<'a> {
    pub fn new(file: &'a Path, obj: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Fields { file, obj, prefix }
    }

    pub fn file(&self) -> &'a Path {
        self.file
    }

    /// The dotted path of `key` in this object, as it appears in messages.
    pub fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub fn bad(&self, key: &str, message: impl Into<String>) -> ImportError {
        ImportError::BadField {
            file: self.file.to_path_buf(),
            field: self.path(key),
            message: message.into(),
        }
    }

    fn expected(&self, key: &str, what: &str, found: &Value) -> ImportError {
        self.bad(key, format!("expected {what}, found {}", show(found)))
    }

    pub fn missing(&self, key: &str, what: &str) -> ImportError {
        self.bad(key, format!("missing; expected {what}"))
    }

    /// The raw value, `None` when absent or null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// Whether the object sets `key` at all (null included).
    pub fn has(&self, key: &str) -> bool {
        self.obj.contains_key(key)
    }

    /// Whether the key is present with an explicit `null`.
    pub fn is_null(&self, key: &str) -> bool {
        self.obj.get(key).is_some_and(Value::is_null)
    }

    fn integer(&self, key: &str, v: &Value, min: u64, what: &str) -> R<usize> {
        v.as_u64()
            .filter(|&n| n >= min)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.expected(key, what, v))
    }

    /// A non-negative integer, if set.
    pub fn count_opt(&self, key: &str) -> R<Option<usize>> {
        self.get(key)
            .map(|v| self.integer(key, v, 0, "a non-negative integer"))
            .transpose()
    }

    /// A positive integer, if set.
    pub fn positive_opt(&self, key: &str) -> R<Option<usize>> {
        self.get(key)
            .map(|v| self.integer(key, v, 1, "a positive integer"))
            .transpose()
    }

    /// A required positive integer.
    pub fn positive(&self, key: &str) -> R<usize> {
        self.positive_opt(key)?
            .ok_or_else(|| self.missing(key, "a positive integer"))
    }

    pub fn positive_or(&self, key: &str, default: usize) -> R<usize> {
        Ok(self.positive_opt(key)?.unwrap_or(default))
    }

    /// A required non-negative integer.
    pub fn count(&self, key: &str) -> R<usize> {
        self.count_opt(key)?
            .ok_or_else(|| self.missing(key, "a non-negative integer"))
    }

    /// A number `>= 0` (`> 0` when `positive`) that is finite as an f32, if set.
    pub fn number_opt(&self, key: &str, positive: bool) -> R<Option<f64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let what = if positive {
            "a positive number (f32 range)"
        } else {
            "a non-negative number (f32 range)"
        };
        match v.as_f64() {
            Some(x) if (x as f32).is_finite() && (x > 0.0 || (!positive && x == 0.0)) => {
                Ok(Some(x))
            }
            _ => Err(self.expected(key, what, v)),
        }
    }

    /// A required positive number.
    pub fn positive_number(&self, key: &str) -> R<f64> {
        self.number_opt(key, true)?
            .ok_or_else(|| self.missing(key, "a positive number"))
    }

    pub fn bool_or(&self, key: &str, default: bool) -> R<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.expected(key, "true or false", v)),
        }
    }

    pub fn str_opt(&self, key: &str) -> R<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.expected(key, "a string", v)))
            .transpose()
    }

    /// A nested object, if set.
    pub fn object_opt(&self, key: &str) -> R<Option<&'a Map<String, Value>>> {
        self.get(key)
            .map(|v| {
                v.as_object()
                    .ok_or_else(|| self.expected(key, "an object", v))
            })
            .transpose()
    }

    /// An array, if set.
    pub fn array_opt(&self, key: &str) -> R<Option<&'a Vec<Value>>> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| self.expected(key, "a list", v)))
            .transpose()
    }

    /// A list of non-negative integers, if set.
    pub fn index_list_opt(&self, key: &str) -> R<Option<Vec<usize>>> {
        let Some(items) = self.array_opt(key)? else {
            return Ok(None);
        };
        let what = "a list of non-negative integers";
        let list = items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.expected(key, what, v))
            })
            .collect::<R<Vec<usize>>>()?;
        Ok(Some(list))
    }

    /// A token id, if set.
    pub fn token_id_opt(&self, key: &str) -> R<Option<u32>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let id = v.as_u64().and_then(|n| u32::try_from(n).ok());
        id.map(Some)
            .ok_or_else(|| self.expected(key, "a token id (a non-negative integer)", v))
    }

    /// Token ids given as one integer, a list of integers, or null (none).
    pub fn token_ids_opt(&self, key: &str) -> R<Option<Vec<u32>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let what = "a token id or a list of token ids";
        let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
        match v {
            Value::Array(items) => items
                .iter()
                .map(|x| one(x).ok_or_else(|| self.expected(key, what, v)))
                .collect::<R<Vec<u32>>>()
                .map(Some),
            _ => one(v)
                .map(|id| Some(vec![id]))
                .ok_or_else(|| self.expected(key, what, v)),
        }
    }
}
