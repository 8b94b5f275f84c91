//! Kernel head widths and padding (SPEC §1 "Kernel head widths and padding",
//! SPEC §2 for V4). Kernels exist only for some head counts; the extra heads
//! are zero Q and are stripped from `o` and `lse` before anything merges them.

use serde::Serialize;
use std::fmt;
use thiserror::Error;

/// ps1 widths for a single-token decode.
pub const PS1_WIDTHS_SINGLE: &[usize] = &[16, 32, 64, 96, 128];
/// ps1 widths for `2 <= s_q <= 4`.
pub const PS1_WIDTHS_MTP4: &[usize] = &[16, 96];
/// ps1 widths for `5 <= s_q <= 8`.
pub const PS1_WIDTHS_MTP8: &[usize] = &[96];
/// Largest head count of page64 (any multiple of 16 up to it).
pub const PAGE64_MAX_HEADS: usize = 128;
/// V4 kernel widths; fewer heads pad to 16.
pub const V4_WIDTHS: &[usize] = &[16, 32, 64, 128];
/// Smallest width any kernel runs; fewer heads are padded up to it.
pub const MIN_WIDTH: usize = 16;

/// No kernel width fits a head count. The message says what was asked and
/// which widths exist, so the report row explains itself.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unsupported: {0}")]
pub struct Unsupported(pub String);

/// The ps1 widths a query length can use (empty: no ps1 kernel for it).
pub fn ps1_widths(s_q: usize) -> &'static [usize] {
    match s_q {
        1 => PS1_WIDTHS_SINGLE,
        2..=4 => PS1_WIDTHS_MTP4,
        5..=8 => PS1_WIDTHS_MTP8,
        _ => &[],
    }
}

fn list(widths: &[usize]) -> String {
    widths.iter().map(|w| w.to_string()).collect::<Vec<_>>().join(", ")
}

/// The ps1 width for `h` gathered heads at `s_q` query tokens: the smallest
/// supported width `>= max(h, 16)`. Never falls back silently.
pub fn kernel_heads(h: usize, s_q: usize) -> Result<usize, Unsupported> {
    if h == 0 || s_q == 0 {
        return Err(Unsupported(format!(
            "ps1 needs at least one head and one query token (H={h}, s_q={s_q})"
        )));
    }
    let widths = ps1_widths(s_q);
    if widths.is_empty() {
        return Err(Unsupported(format!(
            "ps1 has no kernel for s_q={s_q} (it takes s_q <= 8); H={h}"
        )));
    }
    widths.iter().copied().find(|&w| w >= h.max(MIN_WIDTH)).ok_or_else(|| {
        Unsupported(format!(
            "no ps1 width fits H={h} at s_q={s_q} (widths for this s_q: {})",
            list(widths)
        ))
    })
}

/// The page64 width: `max(h, 16)` rounded up to a multiple of 16, at most 128.
pub fn page64_heads(h: usize) -> Result<usize, Unsupported> {
    if h == 0 {
        return Err(Unsupported("page64 needs at least one head (H=0)".into()));
    }
    let w = h.max(MIN_WIDTH).div_ceil(16) * 16;
    if w > PAGE64_MAX_HEADS {
        return Err(Unsupported(format!(
            "page64 runs multiples of 16 up to {PAGE64_MAX_HEADS} heads; H={h} is more"
        )));
    }
    Ok(w)
}

/// The V4 width: heads in {16, 32, 64, 128}; fewer than 16 pad to 16.
pub fn v4_heads(h: usize) -> Result<usize, Unsupported> {
    match h {
        0 => Err(Unsupported("V4 decode needs at least one head (H=0)".into())),
        1..=15 => Ok(MIN_WIDTH),
        _ if V4_WIDTHS.contains(&h) => Ok(h),
        _ => Err(Unsupported(format!(
            "V4 decode runs {} heads (fewer pad to 16); H={h} is none of them",
            list(V4_WIDTHS)
        ))),
    }
}

/// A head count as the model has it and as the kernel runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PaddedHeads {
    pub real: usize,
    pub kernel: usize,
}

impl PaddedHeads {
    pub fn ps1(h: usize, s_q: usize) -> Result<Self, Unsupported> {
        Ok(PaddedHeads {
            real: h,
            kernel: kernel_heads(h, s_q)?,
        })
    }
    pub fn page64(h: usize) -> Result<Self, Unsupported> {
        Ok(PaddedHeads {
            real: h,
            kernel: page64_heads(h)?,
        })
    }
    pub fn v4(h: usize) -> Result<Self, Unsupported> {
        Ok(PaddedHeads {
            real: h,
            kernel: v4_heads(h)?,
        })
    }

    pub fn is_padded(&self) -> bool {
        self.kernel != self.real
    }

    /// `[rows, real, inner]` -> `[rows, kernel, inner]`, the new heads set to `fill`
    /// (zero Q, so padded heads attend uniformly and are thrown away).
    pub fn pad<T: Copy>(&self, x: &[T], inner: usize, fill: T) -> Vec<T> {
        let per_row = self.real * inner;
        assert!(
            per_row > 0 && x.len() % per_row == 0,
            "pad: {} elements are not [rows, {}, {inner}]",
            x.len(),
            self.real
        );
        let mut out = Vec::with_capacity(x.len() / self.real * self.kernel);
        for row in x.chunks_exact(per_row) {
            out.extend_from_slice(row);
            out.extend(std::iter::repeat(fill).take((self.kernel - self.real) * inner));
        }
        out
    }

    /// `[rows, kernel, inner]` -> `[rows, real, inner]`: drops the padded heads
    /// (`inner` = 512 for `o`, 1 for `lse`).
    pub fn strip<T: Copy>(&self, x: &[T], inner: usize) -> Vec<T> {
        let per_row = self.kernel * inner;
        assert!(
            per_row > 0 && x.len() % per_row == 0,
            "strip: {} elements are not [rows, {}, {inner}]",
            x.len(),
            self.kernel
        );
        x.chunks_exact(per_row)
            .flat_map(|row| row[..self.real * inner].iter().copied())
            .collect()
    }
}

/// `h96<-64` when padded, `h96` when not.
impl fmt::Display for PaddedHeads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_padded() {
            write!(f, "h{}<-{}", self.kernel, self.real)
        } else {
            write!(f, "h{}", self.kernel)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples_for_ps1() {
        assert_eq!(kernel_heads(96, 4), Ok(96), "Kimi-K3 target 12 x DCP8");
        assert_eq!(kernel_heads(64, 4), Ok(96), "DSpark draft 8 x 8 with s_q > 1");
        assert_eq!(kernel_heads(16, 2), Ok(16), "8 x 2");
        assert_eq!(kernel_heads(24, 3), Ok(96));
        assert_eq!(kernel_heads(8, 1), Ok(16));
        assert!(kernel_heads(200, 1).is_err());
        assert!(kernel_heads(64, 9).is_err());
    }

    #[test]
    fn ps1_width_table() {
        let single: Vec<_> = (1..=128).map(|h| kernel_heads(h, 1).unwrap()).collect();
        assert_eq!(single[0], 16);
        assert_eq!(single[16], 32, "17 heads");
        assert_eq!(single[32], 64, "33 heads");
        assert_eq!(single[64], 96, "65 heads");
        assert_eq!(single[96], 128, "97 heads");
        assert_eq!(kernel_heads(17, 4), Ok(96));
        assert_eq!(kernel_heads(96, 5), Ok(96));
        assert_eq!(kernel_heads(16, 8), Ok(96), "s_q 5..8 has only 96");
        assert!(kernel_heads(97, 2).is_err());
        assert!(kernel_heads(128, 2).is_err(), "128 is a single-token width only");
        assert!(kernel_heads(0, 1).is_err());
        assert!(kernel_heads(16, 0).is_err());
    }

    #[test]
    fn unsupported_messages_name_the_inputs() {
        let e = kernel_heads(200, 1).unwrap_err().to_string();
        assert!(
            e.contains("H=200") && e.contains("s_q=1") && e.contains("16, 32, 64, 96, 128"),
            "{e}"
        );
        let e = kernel_heads(64, 9).unwrap_err().to_string();
        assert!(e.contains("s_q=9") && e.contains("s_q <= 8"), "{e}");
        let e = kernel_heads(128, 3).unwrap_err().to_string();
        assert!(e.contains("16, 96"), "{e}");
    }

    #[test]
    fn page64_pads_to_multiples_of_16() {
        assert_eq!(page64_heads(1), Ok(16));
        assert_eq!(page64_heads(16), Ok(16));
        assert_eq!(page64_heads(24), Ok(32));
        assert_eq!(page64_heads(96), Ok(96));
        assert_eq!(page64_heads(113), Ok(128));
        assert!(page64_heads(129).is_err());
        assert!(page64_heads(0).is_err());
    }

    #[test]
    fn v4_widths() {
        assert_eq!(v4_heads(8), Ok(16));
        assert_eq!(v4_heads(16), Ok(16));
        assert_eq!(v4_heads(64), Ok(64));
        assert_eq!(v4_heads(128), Ok(128));
        assert!(v4_heads(96).is_err());
        assert!(v4_heads(256).is_err());
    }

    #[test]
    fn pad_then_strip_round_trips_and_fills() {
        let p = PaddedHeads::ps1(2, 3).unwrap();
        assert_eq!(p.kernel, 16);
        // [rows=2, heads=2, inner=3]
        let x: Vec<i32> = (0..12).collect();
        let padded = p.pad(&x, 3, -1);
        assert_eq!(padded.len(), 2 * 16 * 3);
        assert_eq!(&padded[..6], &[0, 1, 2, 3, 4, 5]);
        assert!(padded[6..48].iter().all(|&v| v == -1));
        assert_eq!(&padded[48..54], &[6, 7, 8, 9, 10, 11]);
        assert_eq!(p.strip(&padded, 3), x);
    }

    #[test]
    fn display_shows_padding() {
        assert_eq!(PaddedHeads::ps1(64, 4).unwrap().to_string(), "h96<-64");
        assert_eq!(PaddedHeads::ps1(96, 4).unwrap().to_string(), "h96");
    }
}
