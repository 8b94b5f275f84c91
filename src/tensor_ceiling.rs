//! Which dense tensor rate a row's %TC divides by. One mma.sync bf16
//! ceiling flatters wgmma kernels and holds fp8 kernels to a bf16 rate, so
//! the device measures one rate per instruction and each variant says which
//! instructions its FLOP run on. Pure: no device, no I/O.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A tensor-core instruction family with a measured dense rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MmaKind {
    /// `mma.sync.m16n8k16` bf16 -> f32, register operands.
    MmaSyncBf16,
    /// `wgmma.mma_async` bf16 -> f32.
    WgmmaBf16,
    /// `wgmma.mma_async` e4m3 -> f32.
    WgmmaE4m3,
}

impl MmaKind {
    pub const ALL: [MmaKind; 3] = [MmaKind::MmaSyncBf16, MmaKind::WgmmaBf16, MmaKind::WgmmaE4m3];

    pub fn label(self) -> &'static str {
        match self {
            MmaKind::MmaSyncBf16 => "mma.sync bf16",
            MmaKind::WgmmaBf16 => "wgmma bf16",
            MmaKind::WgmmaE4m3 => "wgmma e4m3",
        }
    }
}

impl fmt::Display for MmaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The measured dense rate of each kind, TFLOP/s (1e12); `None`: not
/// measured (no ceilings, or a target without the instruction).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorRates {
    /// Runs made before the wgmma probes wrote this rate as `tensor_tflops`.
    #[serde(default, alias = "tensor_tflops", with = "crate::serde_float::opt")]
    pub mma_sync_bf16_tflops: Option<f64>,
    #[serde(default, with = "crate::serde_float::opt")]
    pub wgmma_bf16_tflops: Option<f64>,
    #[serde(default, with = "crate::serde_float::opt")]
    pub wgmma_e4m3_tflops: Option<f64>,
}

impl TensorRates {
    pub fn get(&self, kind: MmaKind) -> Option<f64> {
        match kind {
            MmaKind::MmaSyncBf16 => self.mma_sync_bf16_tflops,
            MmaKind::WgmmaBf16 => self.wgmma_bf16_tflops,
            MmaKind::WgmmaE4m3 => self.wgmma_e4m3_tflops,
        }
    }

    pub fn set(&mut self, kind: MmaKind, tflops: Option<f64>) {
        *match kind {
            MmaKind::MmaSyncBf16 => &mut self.mma_sync_bf16_tflops,
            MmaKind::WgmmaBf16 => &mut self.wgmma_bf16_tflops,
            MmaKind::WgmmaE4m3 => &mut self.wgmma_e4m3_tflops,
        } = tflops;
    }
}

/// How a kernel's FLOP split over instruction kinds: `(kind, share)` with
/// shares summing to 1, largest first. A kernel whose Q.K runs on e4m3
/// wgmma and whose P.V runs on mma.sync is bound by both, so its ceiling is
/// the rate at which the tensor cores would finish that mix:
/// `1 / sum(share_i / C_i)`. An empty mix does no tensor work and has no
/// ceiling.
#[derive(Clone, Debug, PartialEq)]
pub struct MmaMix {
    parts: Vec<(MmaKind, f64)>,
}

impl MmaMix {
    /// All FLOP on one kind.
    pub fn one(kind: MmaKind) -> MmaMix {
        MmaMix {
            parts: vec![(kind, 1.0)],
        }
    }

    /// From FLOP (or any weights) per kind, e.g. `[(WgmmaE4m3, qk_flop),
    /// (MmaSyncBf16, pv_flop)]`: normalised to shares; a kind named twice
    /// is summed; zero weights are dropped (all zero: the empty mix).
    pub fn of(weights: &[(MmaKind, f64)]) -> MmaMix {
        debug_assert!(
            weights.iter().all(|&(_, w)| w.is_finite() && w >= 0.0),
            "FLOP weights must be finite and non-negative: {weights:?}"
        );
        let mut parts: Vec<(MmaKind, f64)> = Vec::new();
        for &(kind, w) in weights.iter().filter(|(_, w)| w.is_finite() && *w > 0.0) {
            match parts.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, sum)) => *sum += w,
                None => parts.push((kind, w)),
            }
        }
        let total: f64 = parts.iter().map(|(_, w)| w).sum();
        for (_, w) in &mut parts {
            *w /= total;
        }
        // Largest share first; ties in kind order, so a mix has one label.
        parts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        MmaMix { parts }
    }

    /// `(kind, share)`, largest share first.
    pub fn parts(&self) -> &[(MmaKind, f64)] {
        &self.parts
    }

    /// The effective ceiling, TFLOP/s: `None` for the empty mix or when a
    /// kind it uses has no measured rate (a %TC against some other rate
    /// would be the flattering number this replaces).
    pub fn ceiling(&self, rates: &TensorRates) -> Option<f64> {
        if self.parts.is_empty() {
            return None;
        }
        let mut time = 0.0;
        for &(kind, share) in &self.parts {
            let c = rates.get(kind).filter(|c| *c > 0.0)?;
            time += share / c;
        }
        Some(1.0 / time)
    }

    /// `wgmma e4m3` for one kind, else `wgmma e4m3 53% + mma.sync bf16 47%`.
    pub fn label(&self) -> String {
        match self.parts.as_slice() {
            [] => "no tensor work".to_string(),
            [(kind, _)] => kind.label().to_string(),
            parts => parts
                .iter()
                .map(|(k, s)| format!("{} {:.0}%", k.label(), 100.0 * s))
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MmaKind::*;

    fn rates() -> TensorRates {
        TensorRates {
            mma_sync_bf16_tflops: Some(600.0),
            wgmma_bf16_tflops: Some(800.0),
            wgmma_e4m3_tflops: Some(1600.0),
        }
    }

    #[test]
    fn labels_name_the_instruction() {
        assert_eq!(MmaSyncBf16.label(), "mma.sync bf16");
        assert_eq!(WgmmaBf16.label(), "wgmma bf16");
        assert_eq!(WgmmaE4m3.to_string(), "wgmma e4m3");
        assert_eq!(MmaMix::one(WgmmaBf16).label(), "wgmma bf16");
        let mix = MmaMix::of(&[(MmaSyncBf16, 47.0), (WgmmaE4m3, 53.0)]);
        assert_eq!(mix.label(), "wgmma e4m3 53% + mma.sync bf16 47%");
        assert_eq!(MmaMix::of(&[]).label(), "no tensor work");
    }

    #[test]
    fn one_kind_is_bound_by_its_own_rate() {
        for k in MmaKind::ALL {
            assert_eq!(MmaMix::one(k).ceiling(&rates()), rates().get(k));
        }
    }

    #[test]
    fn a_mix_is_bound_by_the_harmonic_combination() {
        // Half the FLOP at 1600 and half at 600: 0.5/1600 + 0.5/600 per TFLOP.
        let mix = MmaMix::of(&[(WgmmaE4m3, 2e9), (MmaSyncBf16, 2e9)]);
        let c = mix.ceiling(&rates()).unwrap();
        assert!((c - 1.0 / (0.5 / 1600.0 + 0.5 / 600.0)).abs() < 1e-9, "{c}");
        assert!(c > 600.0 && c < 1600.0);
        // Shares, not raw FLOP; a kind named twice is summed; zeros drop out.
        let same = MmaMix::of(&[(MmaSyncBf16, 1.0), (WgmmaE4m3, 0.5), (WgmmaE4m3, 0.5), (WgmmaBf16, 0.0)]);
        assert_eq!(same.parts(), mix.parts());
        assert_eq!(
            same.parts(),
            &[(MmaSyncBf16, 0.5), (WgmmaE4m3, 0.5)],
            "ties in kind order"
        );
    }

    #[test]
    fn a_missing_rate_or_no_tensor_work_has_no_ceiling() {
        let mut r = rates();
        r.set(WgmmaE4m3, None);
        assert_eq!(MmaMix::one(WgmmaE4m3).ceiling(&r), None);
        assert_eq!(MmaMix::of(&[(WgmmaE4m3, 1.0), (MmaSyncBf16, 1.0)]).ceiling(&r), None);
        assert_eq!(MmaMix::one(MmaSyncBf16).ceiling(&r), Some(600.0));
        assert_eq!(MmaMix::of(&[(WgmmaBf16, 0.0)]).ceiling(&rates()), None);
        assert_eq!(MmaMix::one(WgmmaBf16).ceiling(&TensorRates::default()), None);
    }

    #[test]
    fn rates_round_trip_and_old_runs_read_as_mma_sync() {
        let text = serde_json::to_string(&rates()).unwrap();
        assert_eq!(serde_json::from_str::<TensorRates>(&text).unwrap(), rates());
        let old: TensorRates = serde_json::from_str(r#"{"tensor_tflops": 650.8}"#).unwrap();
        assert_eq!(old.get(MmaSyncBf16), Some(650.8));
        assert_eq!((old.get(WgmmaBf16), old.get(WgmmaE4m3)), (None, None));
    }
}
