//! The checks of a V4 variant: `o` and `lse` of the real rows against the
//! attention with sink, the same for every replay step of a captured graph,
//! and the pad rows, which a graph-sized v4_split writes as `o = 0, lse =
//! sink` and everything else leaves unwritten.

use crate::case::V4_D;
use crate::metrics;
use crate::reference::RefSet;
use crate::result::Check;
use crate::variants::checks::{pair, quant_noise, ref_heads};
use crate::variants::output::{find, OutTensor};
use crate::variants::Job;

use super::workload;

/// What the pad rows N..T must hold after a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadRows {
    /// `o = 0`, `lse = sink` (a graph-sized launch over all T rows).
    Written,
    /// Still poison (an eager launch over the N real rows, or hca_persist).
    Untouched,
}

/// `replays`: the first launch's outputs, with every replay step and the pad
/// rows (`pad`; `None` for split_merge, which sees no graph), and the fp8
/// noise beside them; a repeated launch's outputs hold neither.
pub fn decode(
    job: &Job,
    refs: &RefSet,
    out: &[OutTensor],
    replays: bool,
    pad: Option<PadRows>,
) -> Result<Vec<Check>, String> {
    let w = workload(job)?;
    let (tol, rows) = (&job.case.tol, &refs.rows);
    let h = w.p.heads;
    let n = rows.len();
    let head_refs = |o: &[f64], lse: &[f64], hr: usize| (ref_heads(o, n, hr, h, V4_D), ref_heads(lse, n, hr, h, 1));
    let o = find(out, "o")?.pick(rows, false);
    let l = find(out, "lse")?.pick(rows, false);
    let (ro, rl) = head_refs(&refs.full.o, &refs.full.lse, refs.full.heads);
    let mut cs = pair("", &o, &ro, &l, &rl, V4_D, tol);
    if let (true, Some(pad)) = (replays, pad) {
        for (k, r) in refs.steps.iter().enumerate() {
            let name = format!("step{}", k + 1);
            let o = find(out, &format!("o.{name}"))?.pick(rows, false);
            let l = find(out, &format!("lse.{name}"))?.pick(rows, false);
            let (ro, rl) = head_refs(&r.o, &r.lse, r.heads);
            cs.extend(pair(&name, &o, &ro, &l, &rl, V4_D, tol));
        }
        cs.push(pad_rows(job, pad, find(out, "o")?, find(out, "lse")?)?);
    }
    if let (true, Some(unq)) = (replays, &refs.unquantized) {
        cs.push(quant_noise(&ro, &ref_heads(&unq.o, n, unq.heads, h, V4_D)));
    }
    Ok(cs)
}

/// Rows N..T (CUDA-graph padding, length 0).
fn pad_rows(job: &Job, pad: PadRows, o: &OutTensor, lse: &OutTensor) -> Result<Check, String> {
    let w = workload(job)?;
    let (n, t, h) = (w.p.rows, w.t, w.p.heads);
    let poison = |x: f32| x.to_bits() == metrics::POISON_BITS;
    let mut bad = 0usize;
    for i in n..t {
        for hh in 0..h {
            let os = &o.data[(i * h + hh) * V4_D..(i * h + hh + 1) * V4_D];
            let l = lse.data[i * h + hh];
            let ok = match pad {
                PadRows::Written => os.iter().all(|&x| x == 0.0) && (l - w.sink[hh]).abs() <= 1e-6,
                PadRows::Untouched => os.iter().all(|&x| poison(x)) && poison(l),
            };
            bad += usize::from(!ok);
        }
    }
    let expect = match pad {
        PadRows::Written => "o = 0, lse = sink",
        PadRows::Untouched => "left unwritten",
    };
    Ok(Check {
        tensor: "pad_rows".into(),
        level: "kernel".into(),
        metrics: metrics::ErrorMetrics {
            n: (t - n) * h,
            ..Default::default()
        },
        pass: bad == 0,
        why: if bad == 0 {
            String::new()
        } else {
            format!("{bad} of {} pad (row, head) pairs are not {expect}", (t - n) * h)
        },
    })
}
