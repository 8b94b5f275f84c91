//! Number formats the kernels read: OCP fp8 e4m3 (fn), UE8M0 scales, bf16.

use half::bf16;

/// Largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;
/// e4m3fn has no infinity; 0x7F (and 0xFF) is NaN.
pub const E4M3_NAN: u8 = 0x7F;

/// Decodes one e4m3fn byte (bias 7, 3 mantissa bits, no inf).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// Lookup table of all 256 decodes; the hot paths use this.
pub fn e4m3_table() -> &'static [f32; 256] {
    use std::sync::OnceLock;
    static T: OnceLock<[f32; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0f32; 256];
        for (i, v) in t.iter_mut().enumerate() {
            *v = e4m3_to_f32(i as u8);
        }
        t
    })
}

/// Encodes with round-to-nearest-even, saturating to +-448 (as the
/// frameworks' `to(float8_e4m3fn)` after a clamp). NaN maps to NaN. Bit
/// arithmetic: large pools are encoded element by element.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let code = if a < 2f32.powi(-6) {
        // Subnormal codes are multiples of 2^-9; scaling by a power of two is exact.
        (a * 512.0).round_ties_even() as u32
    } else {
        let u = a.to_bits();
        let exp = (u >> 23) as i32 - 127;
        if exp > 8 {
            0x7E
        } else {
            let m = u & 0x7F_FFFF;
            let (q, rem) = (m >> 20, m & 0xF_FFFF);
            let up = rem > 0x8_0000 || (rem == 0x8_0000 && q & 1 == 1);
            // A carry out of the mantissa moves into the exponent, as it should.
            (((exp + 7) as u32) << 3) + q + up as u32
        }
    };
    sign | code.min(0x7E) as u8
}

/// UE8M0 scale byte for a tile with absolute maximum `amax` (SPEC §2).
pub fn ue8m0_for_amax(amax: f32) -> u8 {
    let r = (amax / E4M3_MAX).max(1e-4);
    let e = r.log2().ceil() as i32 + 127;
    e.clamp(0, 254) as u8
}

/// The power of two a UE8M0 byte stands for.
pub fn ue8m0_to_f32(e: u8) -> f32 {
    2f32.powi(e as i32 - 127)
}

pub fn bf16_bits(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

pub fn bf16_from_bits(b: u16) -> f32 {
    bf16::from_bits(b).to_f32()
}

pub const BF16_NAN: u16 = 0x7FC0;

/// Rounds to bf16 and back (what a bf16 tensor holds).
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoder by definition: the nearest code by binary search over
    /// the midpoints of neighbouring codes, ties to the even code.
    fn by_search(x: f32) -> u8 {
        if x.is_nan() {
            return E4M3_NAN;
        }
        let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        let t = e4m3_table();
        let mid: Vec<f32> = (0..126).map(|i| (t[i] + t[i + 1]) / 2.0).collect();
        let i = mid.partition_point(|&m| m < a);
        let code = if i < mid.len() && a == mid[i] && i % 2 == 1 {
            i + 1
        } else {
            i
        };
        sign | code as u8
    }

    #[test]
    fn bit_encoder_matches_the_nearest_code_search() {
        let t = e4m3_table();
        let mut probes: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-30,
            1e30,
        ];
        // Every code, every midpoint, and their neighbours one ulp away.
        for i in 0..126 {
            for v in [t[i], (t[i] + t[i + 1]) / 2.0] {
                for w in [
                    v,
                    f32::from_bits(v.to_bits() + 1),
                    f32::from_bits(v.to_bits().saturating_sub(1)),
                ] {
                    probes.push(w);
                    probes.push(-w);
                }
            }
        }
        // And a dense sweep over the f32 bit patterns of the e4m3 range and beyond.
        let (lo, hi) = (2f32.powi(-12).to_bits(), 1024f32.to_bits());
        probes.extend((lo..hi).step_by(97).map(f32::from_bits));
        for x in probes {
            assert_eq!(f32_to_e4m3(x), by_search(x), "x = {x:e} ({:#x})", x.to_bits());
        }
    }

    #[test]
    fn e4m3_roundtrips_every_finite_code() {
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                assert!(b & 0x7F == 0x7F, "only 0x7F/0xFF are NaN, got {b:#x}");
                continue;
            }
            let back = f32_to_e4m3(v);
            // +0 and -0 both decode to 0.
            if v == 0.0 {
                assert_eq!(back & 0x7F, 0);
            } else {
                assert_eq!(back, b, "code {b:#x} value {v}");
            }
        }
    }

    #[test]
    fn e4m3_known_values_and_saturation() {
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(f32_to_e4m3(1000.0), 0x7E);
        assert_eq!(f32_to_e4m3(-1000.0), 0xFE);
        assert_eq!(f32_to_e4m3(1.0), 0x38);
        // 1.0625 is halfway between 1.0 and 1.125: ties to even (1.0).
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        // 1.1875 is halfway between 1.125 and 1.25: ties to even (1.25).
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        assert!(e4m3_to_f32(f32_to_e4m3(f32::NAN)).is_nan());
    }

    #[test]
    fn e4m3_rounding_error_is_within_half_step() {
        let mut x = -500.0f32;
        while x < 500.0 {
            let q = e4m3_to_f32(f32_to_e4m3(x));
            let a = x.abs().min(448.0);
            let step = if a < 2f32.powi(-6) {
                2f32.powi(-9)
            } else {
                2f32.powi(a.log2().floor() as i32 - 3)
            };
            assert!((q.abs() - a).abs() <= step / 2.0 + 1e-6, "x={x} q={q}");
            x += 0.37;
        }
    }

    #[test]
    fn ue8m0_scale_covers_tile_amax() {
        for amax in [0.0f32, 1e-6, 0.01, 1.0, 3.5, 448.0, 449.0, 1e5] {
            let e = ue8m0_for_amax(amax);
            let s = ue8m0_to_f32(e);
            assert!(amax / s <= 448.0, "amax {amax} scale {s}");
            // The next smaller power of two would overflow (unless clamped at 1e-4).
            if amax / 448.0 > 1e-4 {
                assert!(amax / (s / 2.0) > 448.0);
            }
        }
        assert_eq!(ue8m0_for_amax(448.0), 127);
        assert_eq!(ue8m0_to_f32(127), 1.0);
    }
}
