//! f64 reference attention on the CPU (SPEC §3).
//!
//! MQA structure makes it cheap: all heads of a query row (and all rows of a
//! sequence) share K/V rows, so blocks of tokens are gathered once and fed to
//! f64 GEMMs with an online softmax; rayon spreads (sequence, span) tasks
//! over the cores.

pub mod combine;
mod engine;
mod gemm;
pub mod mla;
mod set;
pub mod v4;

pub use set::{build, total_rows, RefSet};

use rand::seq::index;
use std::time::Instant;
use thiserror::Error;

use crate::workload::rng;

/// Which values the reference computes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// The exact decoded values a kernel sees: MLA `q_vals * q_scale`,
    /// `kv_vals * kv_scale`; V4 `q_vals` / `pool_vals`. Decides pass/fail.
    Dequantized,
    /// The unquantized sources (MLA `q_src`/`kv_src`, V4 `q_src`/`pool_src`),
    /// for the quantization-noise level. A bf16 MLA workload has none
    /// ([`NoSource`]): its bf16 values are the inputs.
    Unquantized,
}

/// [`Inputs::Unquantized`] asked of a workload that keeps no source.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("a bf16 MLA workload keeps no unquantized source (its bf16 values are the inputs); the quantization-noise level applies to fp8 only")]
pub struct NoSource;

/// Reference outputs for a set of query rows.
#[derive(Clone, Debug)]
pub struct RefOut {
    /// Query rows, in the order of `o` and `lse`.
    pub rows: Vec<usize>,
    pub heads: usize,
    pub d_v: usize,
    /// `[rows.len(), heads, d_v]`.
    pub o: Vec<f64>,
    /// `[rows.len(), heads]`, natural log; `-inf` where a row sees no token
    /// (V4: the sink instead, as the sink is part of the LSE).
    pub lse: Vec<f64>,
    /// `2 * heads * (D_qk + D_v) * visible tokens` (SPEC §5).
    pub flops: f64,
}

impl RefOut {
    /// `o` of the `k`-th checked row: `[heads, d_v]`.
    pub fn o_row(&self, k: usize) -> &[f64] {
        let n = self.heads * self.d_v;
        &self.o[k * n..(k + 1) * n]
    }
    /// `lse` of the `k`-th checked row: `[heads]`.
    pub fn lse_row(&self, k: usize) -> &[f64] {
        &self.lse[k * self.heads..(k + 1) * self.heads]
    }
    /// GFLOP/s of this computation if it took `secs` (0 for a zero time).
    pub fn gflops(&self, secs: f64) -> f64 {
        if secs > 0.0 {
            self.flops / secs / 1e9
        } else {
            0.0
        }
    }
}

/// Seeded sorted sample of `n` distinct rows out of `total` (all rows if `n`
/// is `None` or `>= total`). The same `(total, n, seed)` gives the same rows
/// on every platform.
pub fn sample_rows(total: usize, n: Option<usize>, seed: u64) -> Vec<usize> {
    match n {
        Some(n) if n < total => {
            let mut rows = index::sample(&mut rng::stream(seed, "check_rows", 0), total, n).into_vec();
            rows.sort_unstable();
            rows
        }
        _ => (0..total).collect(),
    }
}

/// Runs `f` and returns its result with the wall-clock seconds it took, so a
/// runner can report the reference's speed ([`RefOut::gflops`]) next to the
/// kernels'.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t0 = Instant::now();
    let out = f();
    (out, t0.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_rows_is_seeded_sorted_and_distinct() {
        let a = sample_rows(1000, Some(64), 7);
        assert_eq!(a, sample_rows(1000, Some(64), 7));
        assert_ne!(a, sample_rows(1000, Some(64), 8));
        assert_eq!(a.len(), 64);
        assert!(a.windows(2).all(|p| p[0] < p[1]), "sorted and distinct");
        assert!(*a.last().unwrap() < 1000);
        // Not just a prefix or a stride.
        assert_ne!(a, (0..64).collect::<Vec<_>>());
        assert!(
            a.windows(2)
                .map(|p| p[1] - p[0])
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 5
        );
    }

    #[test]
    fn sample_rows_takes_everything_when_asked_for_as_many() {
        assert_eq!(sample_rows(5, None, 1), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_rows(5, Some(5), 1), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_rows(5, Some(9), 1), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_rows(5, Some(0), 1), Vec::<usize>::new());
        assert_eq!(sample_rows(0, Some(3), 1), Vec::<usize>::new());
    }

    #[test]
    fn gflops_is_flops_over_time() {
        let out = RefOut {
            rows: vec![0],
            heads: 2,
            d_v: 1,
            o: vec![1.0, 2.0],
            lse: vec![0.5, 0.25],
            flops: 3e9,
        };
        assert_eq!(out.gflops(1.5), 2.0);
        assert_eq!(out.gflops(0.0), 0.0);
        assert_eq!(out.o_row(0), &[1.0, 2.0]);
        assert_eq!(out.lse_row(0), &[0.5, 0.25]);
        let (v, secs) = timed(|| 41 + 1);
        assert_eq!(v, 42);
        assert!(secs >= 0.0);
    }
}
