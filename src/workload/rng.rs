//! Seeded random streams. Each (seed, tensor, chunk) gets its own stream so
//! chunks can be filled in parallel and still give the same bytes.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::case::stable_hash;

pub fn stream(seed: u64, tensor: &str, chunk: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(stable_hash(&[
        &seed.to_le_bytes(),
        tensor.as_bytes(),
        &chunk.to_le_bytes(),
    ]))
}

/// Standard normal samples (Box-Muller), enough for synthetic activations.
pub fn fill_normal(out: &mut [f32], seed: u64, tensor: &str, chunk: u64, std: f32) {
    use rand::Rng;
    let mut r = stream(seed, tensor, chunk);
    let mut i = 0;
    while i < out.len() {
        let u1: f32 = r.gen_range(f32::MIN_POSITIVE..1.0);
        let u2: f32 = r.gen();
        let rad = (-2.0 * u1.ln()).sqrt() * std;
        let th = std::f32::consts::TAU * u2;
        out[i] = rad * th.cos();
        if i + 1 < out.len() {
            out[i + 1] = rad * th.sin();
        }
        i += 2;
    }
}

/// Fills a large buffer in parallel, `chunk` elements per stream.
pub fn par_fill_normal(out: &mut [f32], seed: u64, tensor: &str, chunk: usize, std: f32) {
    use rayon::prelude::*;
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(i, c)| fill_normal(c, seed, tensor, i as u64, std));
}
