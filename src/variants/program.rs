//! What a variant asks a GPU to do for one checked launch, as data: the
//! buffers (uploaded, zeroed, or poisoned before every launch), the kernel
//! calls with their grids and arguments, the outputs to download, counters
//! that must be back at zero after each launch, and replay steps for a
//! captured graph. The CUDA backend executes any program the same way
//! (upload, poison, launch, sync, download, time), so a variant gives data,
//! not code, and the device code is written once.

use std::borrow::Cow;

use super::heads::PaddedHeads;
use super::KernelSpec;
use crate::metrics::{POISON_BF16, POISON_BITS};
use crate::workload::codec::bf16_from_bits;

/// A buffer of a [`Program`], by its position in `buffers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufId(pub usize);

/// How a buffer starts.
#[derive(Clone, Debug)]
pub enum Init<'a> {
    /// These bytes, once, before the first launch (a shorter upload fills
    /// the buffer's start: replay steps may hold less).
    Upload(Cow<'a, [u8]>),
    /// Zeros, once (counters that a kernel keeps at zero at rest).
    Zero,
    /// This pattern before every checked launch and every replay: outputs, so
    /// an element nobody wrote shows, and scratch (partials, workspaces), so a
    /// read before the write shows.
    Poison(Fill),
}

/// A poison pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// bf16 outputs: [`crate::metrics::POISON_BF16`] in every 16-bit word.
    Bf16,
    /// f32 outputs and scratch: [`crate::metrics::POISON_BITS`].
    F32,
}

#[derive(Clone, Debug)]
pub struct Buffer<'a> {
    /// For error messages.
    pub name: &'static str,
    pub bytes: usize,
    pub init: Init<'a>,
}

/// A kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// The device address of a buffer.
    Buf(BufId),
    I32(i32),
    F32(f32),
    /// A null pointer (an optional input left out).
    Null,
    /// A TMA tensor map over a buffer, passed by value (128 bytes).
    TileMap(TileMap),
}

/// A buffer read as a 2-D array of bf16 rows and copied into shared memory
/// by the tensor-memory accelerator, `box_rows x box_cols` at a time, each
/// box row 128 bytes swizzled as wgmma reads it: one instruction moves a
/// whole tile where a warpgroup of cp.async issued thousands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileMap {
    pub buf: BufId,
    /// bf16 elements of a row that the map covers.
    pub row_elems: u32,
    /// Bytes from one row to the next (a multiple of 16).
    pub row_bytes: u32,
    /// A box of 64 columns (128 bytes, the swizzle's span) by `box_rows`.
    pub box_rows: u32,
}

impl TileMap {
    pub const BOX_COLS: u32 = 64;

    /// Rows of a buffer of `bytes` (a partial last row is left out).
    pub fn rows(&self, bytes: usize) -> u64 {
        (bytes / self.row_bytes as usize) as u64
    }
}

/// Dynamic shared memory of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smem {
    Fixed(u32),
    /// A merge that may start during its forward: launched as a
    /// programmatic dependent it asks for enough shared memory that at most
    /// `ceil(blocks / SMs)` of its grid's blocks share an SM (else they pile
    /// onto the few SMs the forward leaves idle); launched after it, none.
    DependentMerge,
}

/// One kernel launch.
#[derive(Clone, Debug)]
pub struct Call {
    pub kernel: KernelSpec,
    pub entry: &'static str,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: Smem,
    /// In the kernel's parameter order (kernels/ABI.md).
    pub args: Vec<Arg>,
    /// The second kernel of a two-kernel variant (ps1's reduce, page64's and
    /// v4_split's merge): left out of the timed `kernel` region.
    pub second: bool,
    /// Under `--handoff pdl`, launched as a programmatic dependent of the
    /// call before it (when its module waits for its forward, which
    /// `mlab_pdl_waits` says).
    pub dependent: bool,
}

/// How an output buffer reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Bf16,
    F32,
}

/// An output buffer to download after each checked launch.
#[derive(Clone, Debug)]
pub struct Output {
    /// Its name in the checks (`o.r0`, `lse`, ...); replays append `.stepN`.
    pub name: String,
    pub buf: BufId,
    pub elem: Elem,
    /// `[rows, heads.kernel, inner]` on the device; the padded heads are
    /// stripped on the way back.
    pub heads: PaddedHeads,
    pub inner: usize,
    /// The device holds only these rows, in order; they go back to their
    /// row ids in a tensor of `rows` rows, the rest poison.
    pub scatter: Option<Scatter>,
}

#[derive(Clone, Debug)]
pub struct Scatter {
    pub ids: Vec<usize>,
    pub rows: usize,
}

impl Output {
    /// The host tensor from the buffer's bytes, `[rows, heads.real, inner]`
    /// in f32: bf16 widened (its poison reads as the f32 poison), padded
    /// heads dropped, scattered rows put back, in one pass. Rows decode in
    /// parallel: a sweep reads back tens of GB, and this runs on the
    /// device's thread.
    pub fn decode(&self, raw: &[u8]) -> Vec<f32> {
        use rayon::prelude::*;
        use std::mem::MaybeUninit;
        let eb = match self.elem {
            Elem::Bf16 => 2,
            Elem::F32 => 4,
        };
        let row_len = self.heads.real * self.inner;
        let src_row = self.heads.kernel * self.inner * eb;
        assert!(
            src_row > 0 && raw.len() % src_row == 0,
            "output `{}`: {} bytes are not [rows, {}, {}] of {eb}-byte values",
            self.name,
            raw.len(),
            self.heads.kernel,
            self.inner
        );
        let held = raw.len() / src_row;
        // The source row of each output row, if the device holds it.
        let src: Vec<Option<usize>> = match &self.scatter {
            None => (0..held).map(Some).collect(),
            Some(s) => {
                let mut at = vec![None; s.rows];
                for (k, &i) in s.ids.iter().enumerate().take(held) {
                    at[i] = Some(k);
                }
                at
            }
        };
        let poison = f32::from_bits(POISON_BITS);
        let mut out: Vec<f32> = Vec::with_capacity(src.len() * row_len);
        if row_len == 0 {
            return out;
        }
        let take = row_len * eb;
        out.spare_capacity_mut()[..src.len() * row_len]
            .par_chunks_mut(row_len)
            .zip(src.par_iter())
            .for_each(|(dst, s)| {
                let Some(k) = *s else {
                    dst.fill(MaybeUninit::new(poison));
                    return;
                };
                let bytes = &raw[k * src_row..k * src_row + take];
                match self.elem {
                    Elem::Bf16 => {
                        for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                            let bits = u16::from_le_bytes([b[0], b[1]]);
                            d.write(if bits == POISON_BF16 {
                                poison
                            } else {
                                bf16_from_bits(bits)
                            });
                        }
                    }
                    Elem::F32 => {
                        for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                            d.write(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                        }
                    }
                }
            });
        // SAFETY: every chunk of the first `src.len() * row_len` slots was
        // written above (a held row writes row_len values: `take` bytes are
        // row_len values; an absent row is filled), and f32 has no drop.
        unsafe { out.set_len(src.len() * row_len) };
        out
    }
}

/// A replay of the captured calls over new contents of some buffers (what a
/// CUDA graph sees on a later decode step).
#[derive(Clone, Debug)]
pub struct Replay<'a> {
    pub uploads: Vec<(BufId, Cow<'a, [u8]>)>,
    /// Appended to every output's name, e.g. `.step1`.
    pub suffix: String,
}

/// One sequential pass of a variant run (an MLA variant makes one per DCP rank).
#[derive(Clone, Debug, Default)]
pub struct Program<'a> {
    pub buffers: Vec<Buffer<'a>>,
    pub calls: Vec<Call>,
    pub outputs: Vec<Output>,
    /// i32 buffers that must be all zero after every launch: each launch's
    /// check is recorded, and whatever is left is cleared for the next one.
    pub at_rest: Vec<BufId>,
    pub replays: Vec<Replay<'a>>,
    /// The pass that is timed (an MLA variant times rank 0, the rank with the
    /// most tokens under round-robin sharding).
    pub timed: bool,
    /// A DCP rank's gathered Q and its `o` / `lse`: what a multi-GPU DCP
    /// step fills from its all-gather and combines through NCCL.
    pub rank_io: Option<RankIo>,
}

/// The buffers of a DCP rank's program that the multi-GPU step touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankIo {
    pub rank: usize,
    /// `[rows, kernel heads, 576]` in the Q element type.
    pub q: BufId,
    /// `[rows, kernel heads, 512]` bf16.
    pub o: BufId,
    /// `[rows, kernel heads]` f32.
    pub lse: BufId,
}

impl<'a> Program<'a> {
    /// Adds a buffer; its id for arguments and outputs.
    pub fn buffer(&mut self, name: &'static str, bytes: usize, init: Init<'a>) -> BufId {
        self.buffers.push(Buffer { name, bytes, init });
        BufId(self.buffers.len() - 1)
    }

    /// A buffer holding `data` (any plain element type, as its bytes).
    pub fn upload<T: bytemuck::Pod>(&mut self, name: &'static str, data: &'a [T]) -> BufId {
        let bytes: &'a [u8] = bytemuck::cast_slice(data);
        self.buffer(name, bytes.len(), Init::Upload(Cow::Borrowed(bytes)))
    }

    /// A buffer holding an owned copy (padded or converted data).
    pub fn upload_owned<T: bytemuck::Pod>(&mut self, name: &'static str, data: Vec<T>) -> BufId {
        let bytes: Vec<u8> = bytemuck::cast_slice(&data).to_vec();
        self.buffer(name, bytes.len(), Init::Upload(Cow::Owned(bytes)))
    }

    /// A buffer poisoned with `fill` before every launch.
    pub fn poisoned(&mut self, name: &'static str, bytes: usize, fill: Fill) -> BufId {
        self.buffer(name, bytes, Init::Poison(fill))
    }

    /// Checks a program against itself before any device sees it: every
    /// argument and output names a buffer, poison patterns fit the sizes,
    /// replays upload no more than a buffer holds.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.buffers.len();
        let ok = |b: BufId, what: &str| {
            if b.0 < n {
                Ok(())
            } else {
                Err(format!("{what} names buffer {} of {n}", b.0))
            }
        };
        for c in &self.calls {
            // The spec's list is where entry names are declared (and checked
            // against the CUBIN); a call names one of them.
            if !c.kernel.entry_points.contains(&c.entry) {
                return Err(format!(
                    "a call launches `{}`, which {} does not declare ({})",
                    c.entry,
                    c.kernel.file,
                    c.kernel.entry_points.join(", ")
                ));
            }
            for a in &c.args {
                match a {
                    Arg::Buf(b) => ok(*b, c.entry)?,
                    Arg::TileMap(m) => {
                        ok(m.buf, c.entry)?;
                        if m.row_bytes % 16 != 0
                            || m.row_elems * 2 > m.row_bytes
                            || m.row_elems < TileMap::BOX_COLS
                            || !(1..=256).contains(&m.box_rows)
                        {
                            return Err(format!(
                                "{}: a tile map of {} bf16 a row over rows of {} bytes, boxes of {} rows (TMA needs 16-byte strides, {} columns a box, 1..=256 rows)",
                                c.entry,
                                m.row_elems,
                                m.row_bytes,
                                m.box_rows,
                                TileMap::BOX_COLS
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        for o in &self.outputs {
            ok(o.buf, &o.name)?;
        }
        for b in self.at_rest.iter().copied() {
            ok(b, "a counter")?;
        }
        if let Some(io) = &self.rank_io {
            for b in [io.q, io.o, io.lse] {
                ok(b, "the rank's DCP buffers")?;
            }
        }
        for b in &self.buffers {
            if let Init::Upload(d) = &b.init {
                if d.len() > b.bytes {
                    return Err(format!("{} uploads {} bytes into {}", b.name, d.len(), b.bytes));
                }
            }
            if matches!(b.init, Init::Poison(Fill::F32)) && b.bytes % 4 != 0 {
                return Err(format!("{}: {} bytes is no whole number of f32", b.name, b.bytes));
            }
        }
        for r in &self.replays {
            for (b, d) in &r.uploads {
                ok(*b, "a replay")?;
                if d.len() > self.buffers[b.0].bytes {
                    return Err(format!(
                        "replay {} uploads {} bytes into {} of {}",
                        r.suffix,
                        d.len(),
                        self.buffers[b.0].name,
                        self.buffers[b.0].bytes
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The plain three-pass path `decode` replaces: widen, strip, scatter.
    fn naive(o: &Output, raw: &[u8]) -> Vec<f32> {
        let data: Vec<f32> = match o.elem {
            Elem::Bf16 => raw
                .chunks_exact(2)
                .map(|b| {
                    let bits = u16::from_le_bytes([b[0], b[1]]);
                    if bits == POISON_BF16 {
                        f32::from_bits(POISON_BITS)
                    } else {
                        bf16_from_bits(bits)
                    }
                })
                .collect(),
            Elem::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        let data = o.heads.strip(&data, o.inner);
        let row_len = o.heads.real * o.inner;
        match &o.scatter {
            None => data,
            Some(s) => {
                let mut full = vec![f32::from_bits(POISON_BITS); s.rows * row_len];
                for (k, &i) in s.ids.iter().enumerate() {
                    full[i * row_len..(i + 1) * row_len].copy_from_slice(&data[k * row_len..(k + 1) * row_len]);
                }
                full
            }
        }
    }

    #[test]
    fn a_tile_map_names_a_buffer_and_a_shape_tma_can_copy() {
        let spec = KernelSpec::new("k.cu", &["f"]);
        let prog = |m: TileMap| {
            let mut p = Program::default();
            p.buffer("pool", 1152 * 64, Init::Zero);
            p.calls.push(Call {
                kernel: spec.clone(),
                entry: "f",
                grid: (1, 1, 1),
                block: 1,
                smem: Smem::Fixed(0),
                args: vec![Arg::TileMap(m)],
                second: false,
                dependent: false,
            });
            p.validate()
        };
        let good = TileMap {
            buf: BufId(0),
            row_elems: 576,
            row_bytes: 1152,
            box_rows: 64,
        };
        prog(good).unwrap();
        assert_eq!(good.rows(1152 * 64 + 100), 64);
        let bad = [
            TileMap { buf: BufId(1), ..good },
            TileMap {
                row_bytes: 1160,
                ..good
            },
            TileMap { row_elems: 600, ..good },
            TileMap {
                row_elems: 32,
                row_bytes: 64,
                ..good
            },
            TileMap { box_rows: 0, ..good },
            TileMap { box_rows: 257, ..good },
        ];
        for m in bad {
            assert!(prog(m).is_err(), "{m:?}");
        }
    }

    #[test]
    fn decode_equals_widen_strip_scatter_bit_for_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (elem, real, kernel, inner, scatter) in [
            (Elem::Bf16, 16, 16, 512, None),
            (Elem::Bf16, 8, 16, 512, None),
            (Elem::F32, 2, 16, 1, None),
            (Elem::Bf16, 3, 16, 8, Some(vec![4, 0, 2])),
            (Elem::F32, 5, 5, 1, Some(vec![1, 6])),
        ] {
            let rows = scatter.as_ref().map_or(9, |s: &Vec<usize>| s.len());
            let eb = if elem == Elem::Bf16 { 2 } else { 4 };
            let mut raw: Vec<u8> = (0..rows * kernel * inner * eb).map(|_| rng.gen()).collect();
            // Plant poison in the first value.
            if elem == Elem::Bf16 {
                raw[..2].copy_from_slice(&POISON_BF16.to_le_bytes());
            }
            let o = Output {
                name: "o".into(),
                buf: BufId(0),
                elem,
                heads: PaddedHeads { real, kernel },
                inner,
                scatter: scatter.map(|ids| Scatter { ids, rows: 7 }),
            };
            let (a, b) = (o.decode(&raw), naive(&o, &raw));
            assert_eq!(a.len(), b.len());
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
}
