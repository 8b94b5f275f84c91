//! merge.cu: the LSE merges (SPEC §1 combine, §2 sink) that dcp_combine and
//! split_merge run and v4_split launches as its second kernel, and the
//! empty parts their inputs carry.

use super::KernelSpec;

pub fn spec() -> KernelSpec {
    KernelSpec::new(
        "merge.cu",
        &[
            "dcp_combine",
            "split_merge",
            "dcp_gather_q",
            "dcp_correct",
            "dcp_to_bf16",
        ],
    )
}

/// What a kernel may leave in a part that saw no token, so a merge must not
/// trust it: SPEC §1 maps NaN and +inf LSEs to -inf and gives an empty part
/// weight 0 "even when o_r is NaN". Every empty (part, row, head) of a
/// merge's inputs therefore gets a NaN `o` and an LSE that cycles through
/// -inf, +inf and NaN; a merge without the rule turns them into NaN outputs.
/// Returns how many were poisoned.
pub fn poison_empty_parts<T: Copy>(o: &mut [T], lse: &mut [f32], d: usize, nan: T) -> usize {
    const EMPTY: [f32; 3] = [f32::NEG_INFINITY, f32::INFINITY, f32::NAN];
    let mut n = 0;
    for (i, l) in lse.iter_mut().enumerate() {
        if *l == f32::NEG_INFINITY {
            *l = EMPTY[n % EMPTY.len()];
            o[i * d..(i + 1) * d].fill(nan);
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_parts_get_nan_o_and_every_empty_lse_spelling() {
        let mut o = vec![1.0f32; 8];
        let mut lse = vec![0.5, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY];
        assert_eq!(poison_empty_parts(&mut o, &mut lse, 2, f32::NAN), 3);
        assert_eq!(&o[..2], &[1.0, 1.0], "a part that saw tokens keeps its o");
        assert!(o[2..].iter().all(|x| x.is_nan()));
        assert_eq!(lse[0], 0.5);
        assert_eq!((lse[1], lse[2]), (f32::NEG_INFINITY, f32::INFINITY));
        assert!(lse[3].is_nan());
    }
}
