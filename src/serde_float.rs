//! Reads back the floats rows.json writes: numbers, or the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"` for the non-finite ones (see report::json).

use serde::de::{self, Deserializer, Visitor};
use std::fmt;

struct FloatVisitor;

impl<'de> Visitor<'de> for FloatVisitor {
    type Value = f64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, \"NaN\", \"Infinity\" or \"-Infinity\"")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        match v {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

/// For `f64` fields: `#[serde(deserialize_with = "crate::serde_float::f64")]`.
pub fn f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    d.deserialize_any(FloatVisitor)
}

struct OptVisitor;

impl<'de> Visitor<'de> for OptVisitor {
    type Value = Option<f64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null or a float")
    }
    fn visit_none<E: de::Error>(self) -> Result<Option<f64>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<f64>, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<f64>, D::Error> {
        f64(d).map(Some)
    }
}

/// For `Option<f64>` fields (`null` is `None`); pair with `#[serde(default)]`.
pub fn opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    d.deserialize_option(OptVisitor)
}
