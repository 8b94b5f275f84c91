//! rows.json: `{"meta": RunMeta, "rows": [Row, ...]}`, every check included.
//!
//! JSON has no NaN or infinity, and serde_json silently writes them as
//! `null`, which would make `lse = -inf` (an empty row, correct) look like a
//! missing value. Non-finite floats are therefore written as the strings
//! `"NaN"`, `"Infinity"` and `"-Infinity"`, which both Python's `float()` and
//! JavaScript's `Number()` parse back. `null` keeps meaning "not measured"
//! (an `Option` that is `None`).

use serde::ser;
use serde::Serialize;
use serde_json::{Map, Value};

use super::RunMeta;
use crate::result::Row;

#[derive(Serialize)]
struct Document<'a> {
    meta: &'a RunMeta,
    rows: &'a [Row],
}

/// The whole file, pretty-printed.
pub fn render(meta: &RunMeta, rows: &[Row]) -> anyhow::Result<String> {
    let value = to_value(&Document { meta, rows })?;
    let mut s = serde_json::to_string_pretty(&value)?;
    s.push('\n');
    Ok(s)
}

#[derive(serde::Deserialize)]
struct OwnedDocument {
    meta: RunMeta,
    rows: Vec<Row>,
}

/// Reads a rows.json back (for `run --resume`).
pub fn parse(text: &str) -> Result<(RunMeta, Vec<Row>), serde_json::Error> {
    let d: OwnedDocument = serde_json::from_str(text)?;
    Ok((d.meta, d.rows))
}

/// Like `serde_json::to_value`, but non-finite floats become strings.
pub fn to_value<T: Serialize + ?Sized>(v: &T) -> Result<Value, serde_json::Error> {
    v.serialize(ValueSerializer)
}

fn float(x: f64) -> Value {
    if x.is_nan() {
        Value::String("NaN".into())
    } else if x == f64::INFINITY {
        Value::String("Infinity".into())
    } else if x == f64::NEG_INFINITY {
        Value::String("-Infinity".into())
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

/// Builds a `Value` the way serde_json's own value serializer does, except
/// for floats. The compound states below mirror serde_json's.
struct ValueSerializer;

type Error = serde_json::Error;

impl ser::Serializer for ValueSerializer {
    type Ok = Value;
    type Error = Error;
    type SerializeSeq = SeqState;
    type SerializeTuple = SeqState;
    type SerializeTupleStruct = SeqState;
    type SerializeTupleVariant = VariantSeqState;
    type SerializeMap = MapState;
    type SerializeStruct = MapState;
    type SerializeStructVariant = VariantMapState;

    fn serialize_bool(self, v: bool) -> Result<Value, Error> {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_u8(self, v: u8) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_f32(self, v: f32) -> Result<Value, Error> {
        if v.is_finite() {
            // serde_json's own f32 handling, so finite values print the same.
            serde_json::to_value(v)
        } else {
            Ok(float(v as f64))
        }
    }
    fn serialize_f64(self, v: f64) -> Result<Value, Error> {
        Ok(float(v))
    }
    fn serialize_char(self, v: char) -> Result<Value, Error> {
        Ok(Value::String(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Value, Error> {
        Ok(Value::String(v.to_string()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, Error> {
        Ok(Value::Array(v.iter().map(|&b| Value::from(b)).collect()))
    }
    fn serialize_none(self) -> Result<Value, Error> {
        Ok(Value::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<Value, Error> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, Error> {
        Ok(Value::Null)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<Value, Error> {
        Ok(Value::Null)
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<Value, Error> {
        Ok(Value::String(variant.to_string()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, v: &T) -> Result<Value, Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<Value, Error> {
        let mut m = Map::new();
        m.insert(variant.to_string(), to_value(v)?);
        Ok(Value::Object(m))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqState, Error> {
        Ok(SeqState(Vec::with_capacity(len.unwrap_or(0))))
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqState, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<SeqState, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantSeqState, Error> {
        Ok(VariantSeqState {
            variant,
            items: Vec::with_capacity(len),
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<MapState, Error> {
        Ok(MapState {
            map: Map::new(),
            key: None,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<MapState, Error> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<VariantMapState, Error> {
        Ok(VariantMapState {
            variant,
            map: Map::new(),
        })
    }
}

struct SeqState(Vec<Value>);

impl ser::SerializeSeq for SeqState {
    type Ok = Value;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.0.push(to_value(v)?);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        Ok(Value::Array(self.0))
    }
}

impl ser::SerializeTuple for SeqState {
    type Ok = Value;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, v)
    }
    fn end(self) -> Result<Value, Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for SeqState {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, v)
    }
    fn end(self) -> Result<Value, Error> {
        ser::SerializeSeq::end(self)
    }
}

struct VariantSeqState {
    variant: &'static str,
    items: Vec<Value>,
}

impl ser::SerializeTupleVariant for VariantSeqState {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.items.push(to_value(v)?);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        let mut m = Map::new();
        m.insert(self.variant.to_string(), Value::Array(self.items));
        Ok(Value::Object(m))
    }
}

struct MapState {
    map: Map<String, Value>,
    key: Option<String>,
}

/// JSON keys are strings; serde_json also accepts numbers and bools there.
fn key_string(v: Value) -> Result<String, Error> {
    match v {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(ser::Error::custom(format!(
            "a JSON object key must be a string, not {other}"
        ))),
    }
}

impl ser::SerializeMap for MapState {
    type Ok = Value;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), Error> {
        self.key = Some(key_string(to_value(k)?)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        let k = self
            .key
            .take()
            .ok_or_else(|| <Error as ser::Error>::custom("map value without a key"))?;
        self.map.insert(k, to_value(v)?);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        Ok(Value::Object(self.map))
    }
}

impl ser::SerializeStruct for MapState {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> Result<(), Error> {
        self.map.insert(key.to_string(), to_value(v)?);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        Ok(Value::Object(self.map))
    }
}

struct VariantMapState {
    variant: &'static str,
    map: Map<String, Value>,
}

impl ser::SerializeStructVariant for VariantMapState {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> Result<(), Error> {
        self.map.insert(key.to_string(), to_value(v)?);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        let mut m = Map::new();
        m.insert(self.variant.to_string(), Value::Object(self.map));
        Ok(Value::Object(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{meta, row, skipped};
    use crate::result::Status;
    use std::collections::BTreeMap;

    #[test]
    fn round_trips_with_non_finite_metrics() {
        let mut r = row("mla-b4", "ps1", Status::Fail, "cuda-events");
        r.checks[1].metrics.worst_ref = f64::NEG_INFINITY;
        r.checks[1].metrics.max_rel = f64::NAN;
        r.checks[1].metrics.max_abs = f64::INFINITY;
        let mut m = meta();
        m.reference_gflops = Some(12.5);
        let text = render(&m, &[r, skipped("mla-b4", "page64")]).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let lse = &v["rows"][0]["checks"][1];
        assert_eq!(lse["tensor"], "lse");
        assert_eq!(lse["metrics"]["worst_ref"], "-Infinity");
        assert_eq!(lse["metrics"]["max_rel"], "NaN");
        assert_eq!(lse["metrics"]["max_abs"], "Infinity");
        assert_eq!(v["rows"][0]["checks"][0]["metrics"]["max_abs"], 3e-3);
        assert_eq!(v["rows"][0]["status"], "fail");
        assert_eq!(v["rows"][1]["gbps"], Value::Null);
        assert_eq!(v["rows"][1]["status"], "skip");
        assert_eq!(v["meta"]["reference_gflops"], 12.5);
        assert_eq!(v["meta"]["device"]["details"][0][1], "13.0");
        assert_eq!(v["rows"].as_array().unwrap().len(), 2);
        // And back: every float, non-finite ones included, and None stay.
        let (m2, rows2) = parse(&text).unwrap();
        assert_eq!(m2.reference_gflops, Some(12.5));
        let l = &rows2[0].checks[1].metrics;
        assert!(l.max_rel.is_nan() && l.max_abs == f64::INFINITY && l.worst_ref == f64::NEG_INFINITY);
        assert_eq!(rows2[1].gbps, None);
        assert_eq!(rows2[0].status, Status::Fail);
        assert_eq!(render(&m2, &rows2).unwrap(), text);
    }

    #[test]
    fn finite_values_match_serde_json_exactly() {
        let r = row("mla-b4", "ps1", Status::Pass, "cuda-graph");
        assert_eq!(to_value(&r).unwrap(), serde_json::to_value(&r).unwrap());
        assert_eq!(to_value(&meta()).unwrap(), serde_json::to_value(meta()).unwrap());
    }

    #[derive(Serialize)]
    enum Shape {
        Unit,
        New(f64),
        Tuple(u8, f32),
        Struct { x: f64 },
    }

    #[derive(Serialize)]
    #[serde(tag = "family")]
    enum Tagged {
        Mla { heads: usize },
    }

    #[test]
    fn enum_and_map_shapes_match_serde_json() {
        let mut keyed = BTreeMap::new();
        keyed.insert(3u32, 0.5f32);
        let shapes = (
            vec![
                Shape::Unit,
                Shape::New(1.5),
                Shape::Tuple(7, 0.1),
                Shape::Struct { x: -2.0 },
            ],
            Tagged::Mla { heads: 96 },
            keyed,
            ('c', (), Some(1i64), None::<u8>),
        );
        assert_eq!(to_value(&shapes).unwrap(), serde_json::to_value(&shapes).unwrap());
        let v = to_value(&Shape::Struct { x: f64::NAN }).unwrap();
        assert_eq!(v, serde_json::json!({"Struct": {"x": "NaN"}}));
        assert_eq!(to_value(&f32::NEG_INFINITY).unwrap(), "-Infinity");
    }
}
