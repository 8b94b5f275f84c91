//! The checks every variant's own ones are made of: one output tensor and
//! its LSE against a reference, and the informative fp8 quantization noise.

use crate::metrics::{self, Tolerances};
use crate::result::Check;

/// `o` and `lse` of a run (f32, `[rows, heads, d]` and `[rows, heads]`)
/// against their f64 references; `name` suffixes the tensors (`o.r3`).
pub fn pair(
    name: &str,
    out: &[f32],
    o_ref: &[f64],
    lse_out: &[f32],
    lse_ref: &[f64],
    d: usize,
    tol: &Tolerances,
) -> Vec<Check> {
    let mo = metrics::compare(out, o_ref, tol, Some(metrics::POISON_BITS));
    let ml = metrics::compare(lse_out, lse_ref, tol, Some(metrics::POISON_BITS));
    let mut o_why = metrics::judge_out(&mo, tol).err();
    if o_why.is_none() {
        o_why = metrics::empty_rows_zero(out, lse_ref, d).err();
    }
    let l_why = metrics::judge_lse(&ml, tol).err();
    let (oname, lname) = if name.is_empty() {
        ("o".to_string(), "lse".to_string())
    } else {
        (format!("o.{name}"), format!("lse.{name}"))
    };
    vec![
        Check {
            tensor: oname,
            level: "kernel".into(),
            pass: o_why.is_none(),
            why: o_why.unwrap_or_default(),
            metrics: mo,
        },
        Check {
            tensor: lname,
            level: "kernel".into(),
            pass: l_why.is_none(),
            why: l_why.unwrap_or_default(),
            metrics: ml,
        },
    ]
}

/// The first `h` heads of each of `rows` rows of `[rows, hr, d]` (references
/// computed at padded kernel heads).
pub fn ref_heads(x: &[f64], rows: usize, hr: usize, h: usize, d: usize) -> Vec<f64> {
    if hr == h {
        return x.to_vec();
    }
    (0..rows)
        .flat_map(|i| x[i * hr * d..(i * hr + h) * d].iter().copied())
        .collect()
}

/// How far fp8 quantization alone moves the answer: the reference on the
/// dequantized inputs against the one on unquantized inputs. Informative;
/// it never decides a row.
pub fn quant_noise(deq: &[f64], unq: &[f64]) -> Check {
    let d32: Vec<f32> = deq.iter().map(|&x| x as f32).collect();
    Check {
        tensor: "o".into(),
        level: "quant".into(),
        metrics: metrics::compare(&d32, unq, &Tolerances::FP8, None),
        pass: true,
        why: String::new(),
    }
}
