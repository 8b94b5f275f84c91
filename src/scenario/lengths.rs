//! Length specs for MLA contexts and V4 positions: fixed, per-sequence list,
//! an expanded range, or a seeded random distribution.

use rand::Rng;
use toml::Value;

use super::axis::describe;
use crate::workload::rng;

#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    Uniform,
    /// Uniform in log space: many short, some long (closer to real batches).
    LogUniform,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LengthSpec {
    Fixed(usize),
    /// Sequence `b` gets `list[b % len]`.
    PerSeq(Vec<usize>),
    Random {
        min: usize,
        max: usize,
        dist: Dist,
    },
}

impl LengthSpec {
    /// Short label for case ids (no spaces or slashes).
    pub fn label(&self) -> String {
        match self {
            LengthSpec::Fixed(n) => n.to_string(),
            LengthSpec::PerSeq(v) => {
                let s: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                let s = s.join("_");
                if s.len() <= 40 {
                    format!("l{s}")
                } else {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    format!("l{}x{:08x}", v.len(), crate::case::stable_hash(&[&bytes]) as u32)
                }
            }
            LengthSpec::Random { min, max, dist } => {
                let d = match dist {
                    Dist::Uniform => "u",
                    Dist::LogUniform => "lu",
                };
                format!("{d}{min}-{max}")
            }
        }
    }

    pub fn min(&self) -> usize {
        match self {
            LengthSpec::Fixed(n) => *n,
            LengthSpec::PerSeq(v) => v.iter().copied().min().unwrap_or(0),
            LengthSpec::Random { min, .. } => *min,
        }
    }

    pub fn max(&self) -> usize {
        match self {
            LengthSpec::Fixed(n) => *n,
            LengthSpec::PerSeq(v) => v.iter().copied().max().unwrap_or(0),
            LengthSpec::Random { max, .. } => *max,
        }
    }

    /// `n` lengths; random ones are drawn from a stream of `seed`.
    pub fn lengths(&self, n: usize, seed: u64) -> Vec<usize> {
        match self {
            LengthSpec::Fixed(l) => vec![*l; n],
            LengthSpec::PerSeq(v) => (0..n).map(|b| v[b % v.len()]).collect(),
            LengthSpec::Random { min, max, dist } => {
                let mut r = rng::stream(seed, "lengths", 0);
                (0..n)
                    .map(|_| match dist {
                        Dist::Uniform => r.gen_range(*min..=*max),
                        Dist::LogUniform => {
                            let (a, b) = ((*min as f64).max(1.0).ln(), (*max as f64).ln());
                            (r.gen_range(a..=b).exp().round() as usize).clamp(*min, *max)
                        }
                    })
                    .collect()
            }
        }
    }
}

fn int(v: &Value, what: &str) -> Result<usize, String> {
    match v {
        Value::Integer(i) if *i >= 0 => Ok(*i as usize),
        other => Err(format!(
            "{what}: expected a non-negative integer, got {}",
            describe(other)
        )),
    }
}

fn table_keys(t: &toml::Table) -> String {
    t.keys().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

/// Parses one axis element; a range expands into several.
fn element(v: &Value, key: &str) -> Result<Vec<LengthSpec>, String> {
    let t = match v {
        Value::Integer(_) => return Ok(vec![LengthSpec::Fixed(int(v, &format!("key `{key}`"))?)]),
        Value::Table(t) => t,
        other => {
            return Err(format!(
                "key `{key}`: expected an integer, {{ list = [...] }}, {{ range = {{ start, end, step }} }} or {{ random = {{ min, max, dist }} }}, got {}",
                describe(other)
            ))
        }
    };
    if t.len() != 1 {
        return Err(format!(
            "key `{key}`: a length table has exactly one of `list`, `range`, `random`; got {}",
            table_keys(t)
        ));
    }
    let (kind, body) = t.iter().next().expect("one entry");
    match (kind.as_str(), body) {
        ("list", Value::Array(a)) if !a.is_empty() => {
            let v = a
                .iter()
                .map(|x| int(x, &format!("key `{key}.list`")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![LengthSpec::PerSeq(v)])
        }
        ("list", _) => Err(format!("key `{key}.list`: expected a non-empty list of integers")),
        ("range", Value::Table(r)) => {
            let get = |k: &str| {
                r.get(k)
                    .ok_or_else(|| format!("key `{key}.range.{k}` is missing"))
                    .and_then(|x| int(x, &format!("key `{key}.range.{k}`")))
            };
            if let Some(bad) = r.keys().find(|k| !["start", "end", "step"].contains(&k.as_str())) {
                return Err(format!(
                    "key `{key}.range`: unknown key `{bad}` (expected start, end, step)"
                ));
            }
            let (start, end) = (get("start")?, get("end")?);
            let step = if r.contains_key("step") { get("step")? } else { 1 };
            if step == 0 || end < start {
                return Err(format!(
                    "key `{key}.range`: need step >= 1 and end >= start (got start {start}, end {end}, step {step})"
                ));
            }
            if (end - start) / step >= 256 {
                return Err(format!(
                    "key `{key}.range`: expands to more than 256 values; use a larger step or `random`"
                ));
            }
            Ok((start..=end).step_by(step).map(LengthSpec::Fixed).collect())
        }
        ("random", Value::Table(r)) => {
            if let Some(bad) = r.keys().find(|k| !["min", "max", "dist"].contains(&k.as_str())) {
                return Err(format!(
                    "key `{key}.random`: unknown key `{bad}` (expected min, max, dist)"
                ));
            }
            let get = |k: &str| {
                r.get(k)
                    .ok_or_else(|| format!("key `{key}.random.{k}` is missing"))
                    .and_then(|x| int(x, &format!("key `{key}.random.{k}`")))
            };
            let (min, max) = (get("min")?, get("max")?);
            if max < min {
                return Err(format!("key `{key}.random`: max {max} < min {min}"));
            }
            let dist = match r.get("dist").map(|d| d.as_str()) {
                None | Some(Some("uniform")) => Dist::Uniform,
                Some(Some("loguniform")) => Dist::LogUniform,
                Some(_) => {
                    return Err(format!(
                        "key `{key}.random.dist`: expected \"uniform\" or \"loguniform\""
                    ))
                }
            };
            Ok(vec![LengthSpec::Random { min, max, dist }])
        }
        (k, _) => Err(format!(
            "key `{key}`: unknown length kind `{k}` (expected list, range or random, each with its own table/list)"
        )),
    }
}

/// The whole axis: a single element or a list of them.
pub fn parse_axis(v: &Value, key: &str) -> Result<Vec<LengthSpec>, String> {
    let out: Vec<LengthSpec> = match v {
        Value::Array(a) if a.is_empty() => return Err(format!("key `{key}`: the list is empty")),
        Value::Array(a) => a
            .iter()
            .map(|x| element(x, key))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect(),
        x => element(x, key)?,
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<LengthSpec>, String> {
        let t: toml::Table = toml::from_str(&format!("context = {s}")).unwrap();
        parse_axis(&t["context"], "context")
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(parse("7").unwrap(), vec![LengthSpec::Fixed(7)]);
        assert_eq!(
            parse("[1, { list = [2, 3] }]").unwrap(),
            vec![LengthSpec::Fixed(1), LengthSpec::PerSeq(vec![2, 3])]
        );
        assert_eq!(
            parse("{ range = { start = 10, end = 30, step = 10 } }").unwrap(),
            vec![LengthSpec::Fixed(10), LengthSpec::Fixed(20), LengthSpec::Fixed(30)]
        );
        assert_eq!(
            parse("{ random = { min = 1, max = 9, dist = \"loguniform\" } }").unwrap(),
            vec![LengthSpec::Random {
                min: 1,
                max: 9,
                dist: Dist::LogUniform
            }]
        );
    }

    #[test]
    fn rejects_with_the_key_named() {
        for bad in [
            "\"x\"",
            "[]",
            "{ list = [] }",
            "{ random = { min = 5, max = 1 } }",
            "{ random = { min = 1, max = 2, mean = 3 } }",
            "{ foo = 1 }",
            "{ range = { start = 1, end = 100000 } }",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("context"), "{bad}: {e}");
        }
    }

    #[test]
    fn random_lengths_are_seeded_and_in_range() {
        let s = LengthSpec::Random {
            min: 3,
            max: 50,
            dist: Dist::LogUniform,
        };
        let a = s.lengths(100, 9);
        assert_eq!(a, s.lengths(100, 9));
        assert_ne!(a, s.lengths(100, 10));
        assert!(a.iter().all(|&x| (3..=50).contains(&x)));
        assert_eq!(LengthSpec::PerSeq(vec![4, 5]).lengths(3, 0), vec![4, 5, 4]);
    }
}
