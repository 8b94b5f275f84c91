//! Seeded synthetic inputs: Q, paged KV pools, DCP shards and V4 row lists.
//!
//! Every tensor is kept twice: as the bytes a kernel reads, and as the f32
//! values those bytes decode to (what the reference computes from). fp8
//! tensors also keep the unquantized source, for the quantization-noise level.

pub mod codec;
pub mod mla;
pub mod rng;
pub mod v4;

pub use mla::{MlaShard, MlaWorkload};
pub use v4::V4Workload;

/// Raw element storage as a kernel reads it.
#[derive(Clone, Debug)]
pub enum Elems {
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
    /// fp8 e4m3fn bytes.
    Fp8(Vec<u8>),
}

impl Elems {
    pub fn len(&self) -> usize {
        match self {
            Elems::Bf16(v) => v.len(),
            Elems::Fp8(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Raw little-endian bytes (for uploads and dumps).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Elems::Bf16(v) => {
                // SAFETY: u16 has no padding and any byte pattern is a valid u8;
                // the slice covers exactly the vector's initialized elements.
                unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) }
            }
            Elems::Fp8(v) => v,
        }
    }
    /// A copy, made in parallel.
    pub fn par_clone(&self) -> Elems {
        match self {
            Elems::Bf16(v) => Elems::Bf16(par_copy(v)),
            Elems::Fp8(v) => Elems::Fp8(par_copy(v)),
        }
    }
    pub fn elem_bytes(&self) -> usize {
        match self {
            Elems::Bf16(_) => 2,
            Elems::Fp8(_) => 1,
        }
    }
}

/// `n` copies of `v`, written in parallel: the first write of a large
/// buffer takes its page faults, and one thread doing that for gigabytes
/// holds up the stages waiting on the inputs.
pub fn par_filled<T: Copy + Send + Sync>(n: usize, v: T) -> Vec<T> {
    use rayon::prelude::*;
    let mut out = Vec::with_capacity(n);
    out.par_extend(rayon::iter::repeat_n(v, n));
    out
}

/// A copy of `v`, made in parallel (see [`par_filled`]).
pub fn par_copy<T: Copy + Send + Sync>(v: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    let mut out = Vec::with_capacity(v.len());
    out.par_extend(v.par_iter().copied());
    out
}

/// A generated workload of either family.
#[derive(Debug)]
pub enum Workload {
    Mla(MlaWorkload),
    V4(V4Workload),
}

impl Workload {
    pub fn mla(&self) -> Option<&MlaWorkload> {
        match self {
            Workload::Mla(w) => Some(w),
            Workload::V4(_) => None,
        }
    }
    pub fn v4(&self) -> Option<&V4Workload> {
        match self {
            Workload::V4(w) => Some(w),
            Workload::Mla(_) => None,
        }
    }
}

/// Builds the workload of a case: a pure function of its params and seed.
pub fn build(case: &crate::case::Case) -> anyhow::Result<Workload> {
    match &case.params {
        crate::case::CaseParams::Mla(p) => Ok(Workload::Mla(mla::build(p, case.seed)?)),
        crate::case::CaseParams::V4(p) => Ok(Workload::V4(v4::build(p, case.seed)?)),
    }
}
