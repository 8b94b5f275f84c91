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
            "split_merge_h4",
            "dcp_gather_q",
            "dcp_correct",
            "dcp_to_bf16",
        ],
    )
}

/// Heads a `split_merge_h4` block merges (`SPLIT_MERGE_HEADS`, merge.cu).
pub const SPLIT_MERGE_HEADS: usize = 4;

/// (row, head) pairs below which `split_merge` keeps a merge of one or two
/// splits: a grid of a few hundred 4-head blocks is one short wave, where
/// more blocks of one head finish sooner (4 rows x 64 / 128 heads took 3%
/// longer as a whole v4_split).
pub const H4_MIN_ROW_HEADS: usize = 2048;

/// The split merge's entry and grid for `rows` rows of `heads` heads and `n`
/// splits each. Up to two splits and at least [`H4_MIN_ROW_HEADS`] (row,
/// head) pairs, `split_merge_h4`: a block for a row's group of
/// [`SPLIT_MERGE_HEADS`] heads (the last may be short), one round trip for
/// all their partials (v4_split's CSA rows 4.5-9.1% faster, docs/kernels.md).
/// Otherwise `split_merge`, a block a (row, head): with four heads a block,
/// its heads' further parts wait for each other (n 4-12 took 18-118%
/// longer).
pub fn split_merge_launch(rows: usize, heads: usize, n: usize) -> (&'static str, (u32, u32, u32)) {
    if n <= 2 && rows * heads >= H4_MIN_ROW_HEADS {
        (
            "split_merge_h4",
            ((rows * heads.div_ceil(SPLIT_MERGE_HEADS)) as u32, 1, 1),
        )
    } else {
        ("split_merge", ((rows * heads) as u32, 1, 1))
    }
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
    fn many_rows_of_two_splits_or_fewer_merge_four_heads_a_block() {
        assert_eq!(split_merge_launch(256, 128, 1), ("split_merge_h4", (8192, 1, 1)));
        assert_eq!(split_merge_launch(128, 16, 2), ("split_merge_h4", (512, 1, 1)));
        assert_eq!(
            split_merge_launch(410, 5, 1),
            ("split_merge_h4", (820, 1, 1)),
            "a short last group"
        );
        assert_eq!(split_merge_launch(128, 128, 3), ("split_merge", (16384, 1, 1)));
        assert_eq!(
            split_merge_launch(4, 128, 1),
            ("split_merge", (512, 1, 1)),
            "one short wave"
        );
        let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/merge.cu")).unwrap();
        assert!(
            src.contains(&format!("constexpr int SPLIT_MERGE_HEADS = {SPLIT_MERGE_HEADS};")),
            "merge.cu's SPLIT_MERGE_HEADS is not the host's"
        );
    }

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
