//! Reading a topology file's JSON objects: each value by its key, an unknown key rejected, every error naming the
//! field's path (`links.intra.message_us[3]`).

use super::topology::{error, Cached, Link, TopologyError};
use serde_json::{Map, Value};

/// One JSON object of the file and its path, for errors that name the field.
pub(super) struct Fields<'a> {
    prefix: String,
    map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub(super) fn new(prefix: &str, value: &'a Value, known: &[&str]) -> Result<Self, TopologyError> {
        let what = if prefix.is_empty() { "the topology" } else { prefix };
        let map = value.as_object().ok_or_else(|| error(what, "must be a JSON object"))?;
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            let field = if prefix.is_empty() { unknown.clone() } else { format!("{prefix}.{unknown}") };
            return Err(error(&field, format!("is not a topology field; known here: {}", known.join(", "))));
        }
        Ok(Fields { prefix: prefix.to_string(), map })
    }

    pub(super) fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn optional<T>(
        &self,
        key: &str,
        read: fn(&'a Value) -> Option<T>,
        what: &str,
    ) -> Result<Option<T>, TopologyError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| error(&self.path(key), format!("must be {what}, not {v}"))),
        }
    }

    pub(super) fn required<T>(
        &self,
        key: &str,
        read: fn(&'a Value) -> Option<T>,
        what: &str,
    ) -> Result<T, TopologyError> {
        self.optional(key, read, what)?.ok_or_else(|| error(&self.path(key), format!("is missing ({what})")))
    }

    pub(super) fn number(&self, key: &str) -> Result<f64, TopologyError> {
        self.required(key, Value::as_f64, "a number")
    }

    pub(super) fn count(&self, key: &str) -> Result<u32, TopologyError> {
        let v = self.required(key, Value::as_i64, "a whole number")?;
        u32::try_from(v).map_err(|_| error(&self.path(key), format!("must be a whole number from 1, not {v}")))
    }

    pub(super) fn optional_count(&self, key: &str) -> Result<Option<u32>, TopologyError> {
        self.get(key).map(|_| self.count(key)).transpose()
    }

    pub(super) fn object(&self, key: &str, known: &[&str]) -> Result<Fields<'a>, TopologyError> {
        let value = self.get(key).ok_or_else(|| error(&self.path(key), "is missing"))?;
        Fields::new(&self.path(key), value, known)
    }

    pub(super) fn optional_link(&self, key: &str) -> Result<Option<Link>, TopologyError> {
        self.get(key).map(|_| self.link(key)).transpose()
    }

    /// A regime's rates (`cached`, `llc`), where the file gives them.
    pub(super) fn cached(&self, key: &str) -> Result<Option<Cached>, TopologyError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        let c = self.object(key, &["max_bytes", "bandwidth_gbps", "reduce_gbps", "copy_gbps"])?;
        Ok(Some(Cached {
            max_bytes: c.count("max_bytes")?,
            bandwidth_gbps: c.number("bandwidth_gbps")?,
            reduce_gbps: c.number("reduce_gbps")?,
            copy_gbps: c.number("copy_gbps")?,
        }))
    }

    pub(super) fn link(&self, key: &str) -> Result<Link, TopologyError> {
        let fields = self.object(key, &["alpha_us", "bandwidth_gbps", "message_us"])?;
        let message_us = match fields.get("message_us") {
            None => None,
            Some(value) => Some(curve(&fields.path("message_us"), value)?),
        };
        Ok(Link { alpha_us: fields.number("alpha_us")?, bandwidth_gbps: fields.number("bandwidth_gbps")?, message_us })
    }
}

/// A `message_us` curve: a non-empty array of `[bytes, microseconds]` pairs (its order is checked by `validate`).
fn curve(field: &str, value: &Value) -> Result<Vec<[f64; 2]>, TopologyError> {
    let points = value.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        error(field, "must be a non-empty array of [bytes, microseconds] pairs, e.g. [[8, 0.3], [65536, 6.5]]")
    })?;
    let pair = |point: &Value| match point.as_array().map(Vec::as_slice) {
        Some([bytes, us]) => Some([bytes.as_f64()?, us.as_f64()?]),
        _ => None,
    };
    let not_a_pair = |i: usize| error(&format!("{field}[{i}]"), "must be a pair of numbers [bytes, microseconds]");
    points.iter().enumerate().map(|(i, point)| pair(point).ok_or_else(|| not_a_pair(i))).collect()
}
