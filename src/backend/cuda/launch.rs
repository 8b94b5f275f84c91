//! Variant launches on the CUDA backend: upload a workload, launch the
//! plan's kernels, download and strip outputs, time kernel and variant.

use cudarc::driver::LaunchConfig;

use super::{CudaBackend, DeviceBuffer, RawArg, RegionSamples};
use crate::backend::{BackendError, DeviceCheck, OutTensor, RunOutput, RunRequest, Samples, TimingOptions};
use crate::case::{Dtype, Handoff, MLA_D_QK, MLA_D_V, V4_D};
use crate::metrics::POISON_BITS;
use crate::plan::heads::PaddedHeads;
use crate::plan::worklist::WorkList;
use crate::variants::{kernels, CombineInputs, SplitMergeInputs, VariantPlan};
use crate::workload::codec::bf16_from_bits;
use crate::workload::{MlaWorkload, V4Workload, Workload};

/// bf16 outputs are poisoned with this NaN; the download maps it to the f32 poison.
const BF16_POISON: u16 = crate::metrics::POISON_BF16;

type R<T> = Result<T, BackendError>;

fn cfg(grid: (u32, u32, u32), block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem,
    }
}

fn bf16_out(bits: &[u16]) -> Vec<f32> {
    bits.iter()
        .map(|&b| {
            if b == BF16_POISON {
                f32::from_bits(POISON_BITS)
            } else {
                bf16_from_bits(b)
            }
        })
        .collect()
}

/// A variant that is one kernel: its one timed region is both the kernel
/// and the variant time.
fn one_kernel(r: RegionSamples) -> Samples {
    Samples {
        kernel_ms: r.ms.clone(),
        variant_ms: r.ms,
        clock: r.clock.to_string(),
    }
}

/// Dynamic shared memory that lets at most `ceil(blocks / sms)` blocks of a
/// programmatically dependent merge onto one SM. Launched at the forward's
/// start, its blocks otherwise pile onto the few SMs the forward leaves idle
/// (up to 16 of 128 threads each) and merge there, one SM doing the work of
/// ten (branch s8-pdl, session 8: +12% at b8 c32768).
pub fn merge_smem_cap(blocks: usize, sms: usize, smem_per_sm: usize, reserved: usize, max_block: usize) -> u32 {
    let per_sm = blocks.div_ceil(sms.max(1)).clamp(1, 16);
    (smem_per_sm / per_sm).saturating_sub(reserved).min(max_block) as u32
}

/// Device buffers of one MLA rank.
struct MlaRank {
    q: DeviceBuffer<u8>,
    kv: DeviceBuffer<u8>,
    kv_indptr: DeviceBuffer<i32>,
    kv_indices: DeviceBuffer<i32>,
    last_page: DeviceBuffer<i32>,
    qo_indptr: DeviceBuffer<i32>,
    g_kv_indptr: DeviceBuffer<i32>,
    o: DeviceBuffer<u16>,
    lse: DeviceBuffer<f32>,
}

impl CudaBackend {
    fn mla_rank(&self, w: &MlaWorkload, r: usize, hk: usize) -> R<MlaRank> {
        let eb = w.q.elem_bytes();
        let sh = &w.shards[r];
        let n = w.p.total_q();
        let dev = &self.dev;
        let mut o = dev.alloc_zeros::<u16>(n * hk * MLA_D_V)?;
        let mut lse = dev.alloc_zeros::<f32>(n * hk)?;
        dev.fill_u16(&mut o, BF16_POISON)?;
        dev.fill_u32(&mut lse, POISON_BITS)?;
        Ok(MlaRank {
            q: dev.upload(
                &PaddedHeads {
                    real: w.heads(),
                    kernel: hk,
                }
                .pad(w.q.as_bytes(), MLA_D_QK * eb, 0u8),
            )?,
            kv: dev.upload(sh.pool.as_bytes())?,
            kv_indptr: dev.upload(&sh.kv_indptr)?,
            kv_indices: dev.upload(&sh.kv_indices)?,
            last_page: dev.upload(&sh.kv_last_page_len)?,
            qo_indptr: dev.upload(&w.qo_indptr)?,
            g_kv_indptr: dev.upload(&w.g_kv_indptr)?,
            o,
            lse,
        })
    }

    fn mla_outputs(&self, w: &MlaWorkload, r: usize, hk: usize, b: &MlaRank, out: &mut Vec<OutTensor>) -> R<()> {
        let h = w.heads();
        let o = bf16_out(&self.dev.download(&b.o)?);
        let lse = self.dev.download(&b.lse)?;
        out.push(OutTensor {
            name: format!("o.r{r}"),
            row_len: h * MLA_D_V,
            data: PaddedHeads { real: h, kernel: hk }.strip(&o, MLA_D_V),
        });
        out.push(OutTensor {
            name: format!("lse.r{r}"),
            row_len: h,
            data: PaddedHeads { real: h, kernel: hk }.strip(&lse, 1),
        });
        Ok(())
    }

    fn poison_mla(&self, b: &mut MlaRank) -> R<()> {
        self.dev.fill_u16(&mut b.o, BF16_POISON)?;
        self.dev.fill_u32(&mut b.lse, POISON_BITS)
    }

    /// Whether this run launches its second kernel as a programmatic
    /// dependent: asked for, and the module's merge kernels wait for their
    /// forward (`mlab_pdl_waits`, kernels/common/pdl.cuh). A kernels dir from
    /// before has merges that would read partials too early: those run in
    /// stream order, with a note.
    fn pdl_ok(&mut self, asked: Handoff, m: &super::LoadedModule) -> bool {
        if asked != Handoff::Pdl {
            return false;
        }
        if !m.pdl_waits() {
            self.notes.push(format!(
                "{} has no mlab_pdl_waits (a kernels dir from before --handoff): its merge ran in stream order",
                m.spec().label()
            ));
        }
        m.pdl_waits()
    }

    /// Dynamic shared memory of a dependent merge of `blocks` blocks.
    fn merge_smem(&self, blocks: usize) -> u32 {
        let p = self.dev.props();
        merge_smem_cap(
            blocks,
            p.sm_count,
            p.max_smem_per_sm,
            p.reserved_smem_per_block,
            p.max_smem_per_block_optin,
        )
    }

    fn run_ps1(
        &mut self,
        w: &MlaWorkload,
        hk: usize,
        ranks: &[WorkList],
        timing: &TimingOptions,
        repeats: usize,
    ) -> R<RunOutput> {
        let fp8 = w.p.dtype == Dtype::Fp8;
        let mt = kernels::mla_mt(hk, w.p.s_q);
        let m = self.module(&kernels::ps1(hk, fp8, mt))?;
        let (fwd, red) = (m.kernel("ps1_fwd")?, m.kernel("ps1_reduce")?);
        let pdl = self.pdl_ok(timing.handoff, &m);
        let shape = kernels::mla_shape(fp8, mt);
        let block = 32 * shape.warps as u32;
        let smem = kernels::mla_smem(fp8, mt, shape);
        let (ws, rs, ss) = (w.p.dcp_world as i32, 0i32, w.p.interleave as i32);
        let (qs, ks, sm) = (w.q_scale, w.kv_scale, w.p.sm_scale as f32);
        let mut tensors = Vec::new();
        let mut again = vec![Vec::new(); repeats.saturating_sub(1)];
        let mut timed = None;
        for (r, wl) in ranks.iter().enumerate() {
            let mut b = self.mla_rank(w, r, hk)?;
            let (items, reduce) = wl.to_i32();
            let work_indptr = self.dev.upload(&wl.work_indptr)?;
            let work_items = self.dev.upload(&items)?;
            let reduce_items = self
                .dev
                .upload(if reduce.is_empty() { &[0i32; 4][..] } else { &reduce })?;
            let parts = wl.num_partial_rows.max(1);
            let part_o = self.dev.alloc_zeros::<f32>(parts * hk * MLA_D_V)?;
            let part_lse = self.dev.alloc_zeros::<f32>(parts * hk)?;
            let rank = r as i32 + rs;
            let n_red = wl.reduce.len() as u32;
            let dev = &self.dev;
            let red_smem = if pdl { self.merge_smem(n_red as usize * hk) } else { 0 };
            let fwd_launch = |b: &mut MlaRank| -> R<()> {
                // SAFETY: argument list matches ps1_fwd in kernels/ABI.md; every buffer
                // is sized from the workload and work list the kernel indexes.
                unsafe {
                    dev.launch(fwd)
                        .arg(&b.q)
                        .arg(&b.kv)
                        .arg(&b.kv_indptr)
                        .arg(&b.kv_indices)
                        .arg(&b.qo_indptr)
                        .arg(&b.g_kv_indptr)
                        .arg(&work_indptr)
                        .arg(&work_items)
                        .arg(&qs)
                        .arg(&ks)
                        .arg(&sm)
                        .arg(&ws)
                        .arg(&rank)
                        .arg(&ss)
                        .arg(&mut b.o)
                        .arg(&mut b.lse)
                        .arg(&part_o)
                        .arg(&part_lse)
                        .launch(cfg((wl.num_ctas as u32, 1, 1), block, smem))
                }
            };
            let red_launch = |b: &mut MlaRank| -> R<()> {
                if n_red == 0 {
                    return Ok(());
                }
                let args = [
                    RawArg::Ptr(dev.addr(&part_o)),
                    RawArg::Ptr(dev.addr(&part_lse)),
                    RawArg::Ptr(dev.addr(&reduce_items)),
                    RawArg::Ptr(dev.addr(&b.o)),
                    RawArg::Ptr(dev.addr(&b.lse)),
                ];
                // SAFETY: matches ps1_reduce in kernels/ABI.md; reduce items index partial
                // rows below num_partial_rows and final rows below total_q; as a
                // dependent launch it waits for ps1_fwd before reading partials.
                unsafe { dev.launch_raw(red, cfg((n_red, hk as u32, 1), 128, red_smem), pdl, &args) }
            };
            for k in 0..repeats.max(1) {
                // Outputs and partials start as poison: an element nobody
                // wrote, or a partial read before its forward wrote it, shows.
                self.poison_mla(&mut b)?;
                self.dev.fill_u32_scratch(&part_o, POISON_BITS)?;
                self.dev.fill_u32_scratch(&part_lse, POISON_BITS)?;
                fwd_launch(&mut b)?;
                red_launch(&mut b)?;
                self.dev.sync()?;
                let into = if k == 0 { &mut tensors } else { &mut again[k - 1] };
                self.mla_outputs(w, r, hk, &b, into)?;
            }
            if r == 0 && timing.enabled {
                timed = Some(self.kernel_and_variant(timing, |variant| {
                    fwd_launch(&mut b).and_then(|_| if variant { red_launch(&mut b) } else { Ok(()) })
                })?);
            }
        }
        Ok(RunOutput {
            tensors,
            repeats: again,
            samples: timed,
            notes: self.take_notes(),
            ..Default::default()
        })
    }

    fn run_page64(
        &mut self,
        w: &MlaWorkload,
        hk: usize,
        splits: &[usize],
        timing: &TimingOptions,
        repeats: usize,
    ) -> R<RunOutput> {
        let fp8 = w.p.dtype == Dtype::Fp8;
        let mt = kernels::mla_mt(hk, w.p.s_q);
        let m = self.module(&kernels::page64(hk, fp8, mt))?;
        let (fwd, mrg) = (m.kernel("page64_fwd")?, m.kernel("page64_merge")?);
        let pdl = self.pdl_ok(timing.handoff, &m);
        let shape = kernels::mla_shape(fp8, mt);
        let block = 32 * shape.warps as u32;
        let smem = kernels::mla_smem(fp8, mt, shape);
        let (qs, ks, sm) = (w.q_scale, w.kv_scale, w.p.sm_scale as f32);
        let n = w.p.total_q();
        let mut tensors = Vec::new();
        let mut again = vec![Vec::new(); repeats.saturating_sub(1)];
        let mut timed = None;
        for (r, &ns) in splits.iter().enumerate() {
            let mut b = self.mla_rank(w, r, hk)?;
            let parts = if ns > 1 { n * ns } else { 1 };
            let part_o = self.dev.alloc_zeros::<f32>(parts * hk * MLA_D_V)?;
            let part_lse = self.dev.alloc_zeros::<f32>(parts * hk)?;
            let ns_i = ns as i32;
            let dev = &self.dev;
            let mrg_smem = if pdl { self.merge_smem(n * hk) } else { 0 };
            let grid = ((hk / 16) as u32, ns as u32, w.p.batch as u32);
            let fwd_launch = |b: &mut MlaRank| -> R<()> {
                // SAFETY: matches page64_fwd in kernels/ABI.md; the pool, page table and
                // partials are sized from this rank's shard and split count.
                unsafe {
                    dev.launch(fwd)
                        .arg(&b.q)
                        .arg(&b.kv)
                        .arg(&b.kv_indptr)
                        .arg(&b.kv_indices)
                        .arg(&b.last_page)
                        .arg(&b.qo_indptr)
                        .arg(&qs)
                        .arg(&ks)
                        .arg(&sm)
                        .arg(&ns_i)
                        .arg(&mut b.o)
                        .arg(&mut b.lse)
                        .arg(&part_o)
                        .arg(&part_lse)
                        .launch(cfg(grid, block, smem))
                }
            };
            let mrg_launch = |b: &mut MlaRank| -> R<()> {
                if ns == 1 {
                    return Ok(());
                }
                let args = [
                    RawArg::Ptr(dev.addr(&part_o)),
                    RawArg::Ptr(dev.addr(&part_lse)),
                    RawArg::I32(ns_i),
                    RawArg::Ptr(dev.addr(&b.o)),
                    RawArg::Ptr(dev.addr(&b.lse)),
                ];
                // SAFETY: matches page64_merge in kernels/ABI.md: [total_q, n, HK] partials;
                // as a dependent launch it waits for page64_fwd before reading them.
                unsafe { dev.launch_raw(mrg, cfg((n as u32, hk as u32, 1), 128, mrg_smem), pdl, &args) }
            };
            for k in 0..repeats.max(1) {
                self.poison_mla(&mut b)?;
                self.dev.fill_u32_scratch(&part_o, POISON_BITS)?;
                self.dev.fill_u32_scratch(&part_lse, POISON_BITS)?;
                fwd_launch(&mut b)?;
                mrg_launch(&mut b)?;
                self.dev.sync()?;
                let into = if k == 0 { &mut tensors } else { &mut again[k - 1] };
                self.mla_outputs(w, r, hk, &b, into)?;
            }
            if r == 0 && timing.enabled {
                timed = Some(self.kernel_and_variant(timing, |variant| {
                    fwd_launch(&mut b).and_then(|_| if variant { mrg_launch(&mut b) } else { Ok(()) })
                })?);
            }
        }
        Ok(RunOutput {
            tensors,
            repeats: again,
            samples: timed,
            notes: self.take_notes(),
            ..Default::default()
        })
    }

    fn run_combine(&mut self, c: &CombineInputs, timing: &TimingOptions, repeats: usize) -> R<RunOutput> {
        let m = self.module(&kernels::merge())?;
        let k = m.kernel("dcp_combine")?;
        let (rows, h) = (c.rows.len(), c.heads);
        let o_r = self.dev.upload(&c.o)?;
        let lse_r = self.dev.upload(&c.lse)?;
        let mut o = self.dev.alloc_zeros::<u16>(rows * h * MLA_D_V)?;
        let mut lse = self.dev.alloc_zeros::<f32>(rows * h)?;
        let (wi, ri, hi) = (c.world as i32, rows as i32, h as i32);
        let dev = &self.dev;
        let launch = |o: &mut DeviceBuffer<u16>, lse: &mut DeviceBuffer<f32>| -> R<()> {
            // SAFETY: matches dcp_combine in kernels/ABI.md: [W, rows, H, 512] in, [rows, H, 512] out.
            unsafe {
                dev.launch(k)
                    .arg(&o_r)
                    .arg(&lse_r)
                    .arg(&wi)
                    .arg(&ri)
                    .arg(&hi)
                    .arg(o)
                    .arg(lse)
                    .launch(cfg(((rows * h) as u32, 1, 1), 64, 0))
            }
        };
        let mut runs = Vec::with_capacity(repeats.max(1));
        for _ in 0..repeats.max(1) {
            self.dev.fill_u16(&mut o, BF16_POISON)?;
            self.dev.fill_u32(&mut lse, POISON_BITS)?;
            launch(&mut o, &mut lse)?;
            self.dev.sync()?;
            runs.push(vec![
                OutTensor {
                    name: "o".into(),
                    row_len: h * MLA_D_V,
                    data: bf16_out(&self.dev.download(&o)?),
                },
                OutTensor {
                    name: "lse".into(),
                    row_len: h,
                    data: self.dev.download(&lse)?,
                },
            ]);
        }
        let timed = if timing.enabled {
            Some(one_kernel(self.time_region(
                timing,
                || Ok(()),
                |_| launch(&mut o, &mut lse),
            )?))
        } else {
            None
        };
        let tensors = runs.remove(0);
        Ok(RunOutput {
            tensors,
            repeats: runs,
            samples: timed,
            notes: self.take_notes(),
            ..Default::default()
        })
    }
}

/// Device copies of a V4 workload's inputs.
struct V4Inputs {
    q: DeviceBuffer<u8>,
    q_rope: DeviceBuffer<u16>,
    pool: DeviceBuffer<u8>,
    pool_rope: DeviceBuffer<u16>,
    kv_indptr: DeviceBuffer<i32>,
    kv_indices: DeviceBuffer<i32>,
    sink: DeviceBuffer<f32>,
}

impl CudaBackend {
    /// Buffers sized for the workload and every replay step, holding step 0.
    fn v4_inputs(&self, w: &V4Workload) -> R<V4Inputs> {
        let all: Vec<&V4Workload> = std::iter::once(w).chain(w.steps.iter()).collect();
        let cap = |f: &dyn Fn(&V4Workload) -> usize| all.iter().map(|x| f(x)).max().unwrap_or(0).max(1);
        let d = &self.dev;
        let mut inp = V4Inputs {
            q: d.alloc_zeros(cap(&|x| x.q_packed.len()))?,
            q_rope: d.alloc_zeros(cap(&|x| x.q_rope.len()))?,
            pool: d.alloc_zeros(cap(&|x| x.pool_packed.len()))?,
            pool_rope: d.alloc_zeros(cap(&|x| x.pool_rope.len()))?,
            kv_indptr: d.alloc_zeros(cap(&|x| x.kv_indptr.len()))?,
            kv_indices: d.alloc_zeros(cap(&|x| x.kv_indices.len()))?,
            sink: d.upload(&w.sink)?,
        };
        self.fill_v4(&mut inp, w)?;
        Ok(inp)
    }

    /// New contents in the same buffers: what a captured graph sees on replay.
    fn fill_v4(&self, inp: &mut V4Inputs, w: &V4Workload) -> R<()> {
        let d = &self.dev;
        d.upload_into(&w.q_packed, &mut inp.q)?;
        d.upload_into(&w.q_rope, &mut inp.q_rope)?;
        d.upload_into(&w.pool_packed, &mut inp.pool)?;
        d.upload_into(&w.pool_rope, &mut inp.pool_rope)?;
        d.upload_into(&w.kv_indptr, &mut inp.kv_indptr)?;
        d.upload_into(&w.kv_indices, &mut inp.kv_indices)
    }

    fn v4_outputs(
        &self,
        w: &V4Workload,
        o: &DeviceBuffer<u16>,
        lse: &DeviceBuffer<f32>,
        suffix: &str,
    ) -> R<Vec<OutTensor>> {
        let (hk, h) = (w.heads, w.p.heads);
        let o = bf16_out(&self.dev.download(o)?);
        let lse = self.dev.download(lse)?;
        Ok(vec![
            OutTensor {
                name: format!("o{suffix}"),
                row_len: h * V4_D,
                data: PaddedHeads { real: h, kernel: hk }.strip(&o, V4_D),
            },
            OutTensor {
                name: format!("lse{suffix}"),
                row_len: h,
                data: PaddedHeads { real: h, kernel: hk }.strip(&lse, 1),
            },
        ])
    }

    fn poison(&self, o: &mut DeviceBuffer<u16>, lse: &mut DeviceBuffer<f32>) -> R<()> {
        self.dev.fill_u16(o, BF16_POISON)?;
        self.dev.fill_u32(lse, POISON_BITS)
    }

    fn poisoned_out(&self, rows: usize, hk: usize) -> R<(DeviceBuffer<u16>, DeviceBuffer<f32>)> {
        let mut o = self.dev.alloc_zeros::<u16>(rows * hk * V4_D)?;
        let mut lse = self.dev.alloc_zeros::<f32>(rows * hk)?;
        self.poison(&mut o, &mut lse)?;
        Ok((o, lse))
    }

    /// v4_split + split_merge. With replay steps, the pair is captured once
    /// into a graph and replayed over each step's new buffer contents.
    fn run_v4_split(
        &mut self,
        w: &V4Workload,
        split_indptr: &[i32],
        n: usize,
        eager: bool,
        timing: &TimingOptions,
        repeats: usize,
    ) -> R<RunOutput> {
        let hk = w.heads;
        let ms = self.module(&kernels::v4_split(hk))?;
        let mm = self.module(&kernels::merge())?;
        let (ks, km) = (ms.kernel("v4_split")?, mm.kernel("split_merge")?);
        let mut inp = self.v4_inputs(w)?;
        let plan = self.dev.upload(split_indptr)?;
        let slots = split_indptr[w.t] as usize;
        let part_o = self.dev.alloc_zeros::<f32>(slots.max(1) * hk * V4_D)?;
        let part_lse = self.dev.alloc_zeros::<f32>(slots.max(1) * hk)?;
        let (mut o, mut lse) = self.poisoned_out(w.t, hk)?;
        // An eager call covers the N real rows; a graph-sized one all T.
        let launch_rows = if eager { w.p.rows } else { w.t };
        let (rows, hki, sm) = (launch_rows as i32, hk as i32, w.p.sm_scale as f32);
        let grid = (kernels::v4_groups(hk), launch_rows as u32, n as u32);
        let smem = kernels::v4_smem(hk);
        let dev = &self.dev;
        let inp_ref = &inp;
        let split = || -> R<()> {
            // SAFETY: matches v4_split in kernels/ABI.md; partials hold split_indptr[T] slots.
            unsafe {
                dev.launch(ks)
                    .arg(&inp_ref.q)
                    .arg(&inp_ref.q_rope)
                    .arg(&inp_ref.pool)
                    .arg(&inp_ref.pool_rope)
                    .arg(&inp_ref.kv_indptr)
                    .arg(&inp_ref.kv_indices)
                    .arg(&plan)
                    .arg(&sm)
                    .arg(&rows)
                    .arg(&part_o)
                    .arg(&part_lse)
                    .launch(cfg(grid, 256, smem))
            }
        };
        let merge = |o: &mut DeviceBuffer<u16>, lse: &mut DeviceBuffer<f32>| -> R<()> {
            // SAFETY: matches split_merge in kernels/ABI.md: slots from the same split CSR.
            unsafe {
                dev.launch(km)
                    .arg(&part_o)
                    .arg(&part_lse)
                    .arg(&plan)
                    .arg(&inp_ref.sink)
                    .arg(&rows)
                    .arg(&hki)
                    .arg(o)
                    .arg(lse)
                    .launch(cfg((launch_rows as u32 * hk as u32, 1, 1), 128, 0))
            }
        };
        let scratch = || -> R<()> {
            dev.fill_u32_scratch(&part_o, POISON_BITS)?;
            dev.fill_u32_scratch(&part_lse, POISON_BITS)
        };
        let mut runs = Vec::with_capacity(repeats.max(1));
        for _ in 0..repeats.max(1) {
            self.poison(&mut o, &mut lse)?;
            scratch()?;
            split()?;
            merge(&mut o, &mut lse)?;
            self.dev.sync()?;
            runs.push(self.v4_outputs(w, &o, &lse, "")?);
        }
        let mut tensors = runs.remove(0);
        let timed = if timing.enabled {
            Some(self.kernel_and_variant(timing, |variant| {
                split().and_then(|_| if variant { merge(&mut o, &mut lse) } else { Ok(()) })
            })?)
        } else {
            None
        };
        if !w.steps.is_empty() {
            let graph = self.dev.capture(|| split().and_then(|_| merge(&mut o, &mut lse)))?;
            for (s, ws) in w.steps.iter().enumerate() {
                self.fill_v4(&mut inp, ws)?;
                self.poison(&mut o, &mut lse)?;
                scratch()?;
                self.dev.replay(&graph)?;
                self.dev.sync()?;
                tensors.extend(self.v4_outputs(ws, &o, &lse, &format!(".step{}", s + 1))?);
            }
        }
        Ok(RunOutput {
            tensors,
            repeats: runs,
            samples: timed,
            notes: self.take_notes(),
            ..Default::default()
        })
    }

    /// hca_persist. Its counters must be back at zero after every launch (the
    /// last finisher resets them): each launch's check is recorded, counters
    /// left behind are cleared, and the next launch or replay step still runs,
    /// so the report shows which ones fail.
    fn run_hca(&mut self, w: &V4Workload, parts: usize, timing: &TimingOptions, repeats: usize) -> R<RunOutput> {
        let hk = w.heads;
        let m = self.module(&kernels::hca_persist(hk))?;
        let k = m.kernel("hca_persist")?;
        let mut inp = self.v4_inputs(w)?;
        // The workspace: allocated once, before any launch or capture; counters zero at rest.
        let o_acc = self.dev.alloc_zeros::<f32>(2 * parts * hk * V4_D)?;
        let lse_acc = self.dev.alloc_zeros::<f32>(2 * parts * hk)?;
        let mut counters = self.dev.alloc_zeros::<i32>(w.t.max(1))?;
        let (mut o, mut lse) = self.poisoned_out(w.t, hk)?;
        let (n_rows, pi, sm) = (w.p.rows as i32, parts as i32, w.p.sm_scale as f32);
        let grid = (kernels::v4_groups(hk), parts as u32, 1);
        let smem = kernels::v4_smem(hk);
        let dev = &self.dev;
        let inp_ref = &inp;
        let launch =
            |counters: &mut DeviceBuffer<i32>, o: &mut DeviceBuffer<u16>, lse: &mut DeviceBuffer<f32>| -> R<()> {
                // SAFETY: matches hca_persist in kernels/ABI.md; the workspace holds 2P slots
                // and a counter per row.
                unsafe {
                    dev.launch(k)
                        .arg(&inp_ref.q)
                        .arg(&inp_ref.q_rope)
                        .arg(&inp_ref.pool)
                        .arg(&inp_ref.pool_rope)
                        .arg(&inp_ref.kv_indptr)
                        .arg(&inp_ref.kv_indices)
                        .arg(&inp_ref.sink)
                        .arg(&sm)
                        .arg(&n_rows)
                        .arg(&pi)
                        .arg(&o_acc)
                        .arg(&lse_acc)
                        .arg(counters)
                        .arg(o)
                        .arg(lse)
                        .launch(cfg(grid, 256, smem))
                }
            };
        // Workspace slots start as poison, so a merge that reads a piece
        // before it was written shows; the counters must be zero already.
        let scratch = || -> R<()> {
            dev.fill_u32_scratch(&o_acc, POISON_BITS)?;
            dev.fill_u32_scratch(&lse_acc, POISON_BITS)
        };
        let mut checks = Vec::new();
        let mut runs = Vec::with_capacity(repeats.max(1));
        for r in 0..repeats.max(1) {
            self.poison(&mut o, &mut lse)?;
            scratch()?;
            launch(&mut counters, &mut o, &mut lse)?;
            self.dev.sync()?;
            let name = if r == 0 {
                "counters".to_string()
            } else {
                format!("counters.launch{}", r + 1)
            };
            checks.push(counters_at_rest(&self.dev, &mut counters, name)?);
            runs.push(self.v4_outputs(w, &o, &lse, "")?);
        }
        let mut tensors = runs.remove(0);
        let timed = if timing.enabled {
            let s = self.time_region(timing, || Ok(()), |_| launch(&mut counters, &mut o, &mut lse))?;
            checks.push(counters_at_rest(&self.dev, &mut counters, "counters.timed".into())?);
            Some(one_kernel(s))
        } else {
            None
        };
        if !w.steps.is_empty() {
            let graph = self.dev.capture(|| launch(&mut counters, &mut o, &mut lse))?;
            for (s, ws) in w.steps.iter().enumerate() {
                self.fill_v4(&mut inp, ws)?;
                self.poison(&mut o, &mut lse)?;
                scratch()?;
                self.dev.replay(&graph)?;
                self.dev.sync()?;
                checks.push(counters_at_rest(
                    &self.dev,
                    &mut counters,
                    format!("counters.step{}", s + 1),
                )?);
                tensors.extend(self.v4_outputs(ws, &o, &lse, &format!(".step{}", s + 1))?);
            }
        }
        Ok(RunOutput {
            tensors,
            repeats: runs,
            device_checks: checks,
            samples: timed,
            notes: self.take_notes(),
        })
    }

    fn run_split_merge(
        &mut self,
        w: &V4Workload,
        s: &SplitMergeInputs,
        timing: &TimingOptions,
        repeats: usize,
    ) -> R<RunOutput> {
        let m = self.module(&kernels::merge())?;
        let k = m.kernel("split_merge")?;
        let (rows, h, d) = (s.rows.len(), s.heads, V4_D);
        let indptr: Vec<i32> = (0..=rows).map(|i| (i * s.n) as i32).collect();
        let (po, pl, ip, sink) = (
            self.dev.upload(&s.o)?,
            self.dev.upload(&s.lse)?,
            self.dev.upload(&indptr)?,
            self.dev.upload(&s.sink)?,
        );
        let (mut o, mut lse) = self.poisoned_out(rows, h)?;
        let (ri, hi) = (rows as i32, h as i32);
        let dev = &self.dev;
        let launch = |o: &mut DeviceBuffer<u16>, lse: &mut DeviceBuffer<f32>| -> R<()> {
            // SAFETY: matches split_merge in kernels/ABI.md: rows*n slots of [H, 512].
            unsafe {
                dev.launch(k)
                    .arg(&po)
                    .arg(&pl)
                    .arg(&ip)
                    .arg(&sink)
                    .arg(&ri)
                    .arg(&hi)
                    .arg(o)
                    .arg(lse)
                    .launch(cfg(((rows * h) as u32, 1, 1), 128, 0))
            }
        };
        let mut runs = Vec::with_capacity(repeats.max(1));
        for _ in 0..repeats.max(1) {
            self.poison(&mut o, &mut lse)?;
            launch(&mut o, &mut lse)?;
            self.dev.sync()?;
            // Scatter the compact rows back to their row ids, like the other V4 outputs.
            let oc = bf16_out(&self.dev.download(&o)?);
            let lc = self.dev.download(&lse)?;
            let mut of = vec![f32::from_bits(POISON_BITS); w.t * h * d];
            let mut lf = vec![f32::from_bits(POISON_BITS); w.t * h];
            for (k, &i) in s.rows.iter().enumerate() {
                of[i * h * d..(i + 1) * h * d].copy_from_slice(&oc[k * h * d..(k + 1) * h * d]);
                lf[i * h..(i + 1) * h].copy_from_slice(&lc[k * h..(k + 1) * h]);
            }
            runs.push(vec![
                OutTensor {
                    name: "o".into(),
                    row_len: h * d,
                    data: of,
                },
                OutTensor {
                    name: "lse".into(),
                    row_len: h,
                    data: lf,
                },
            ]);
        }
        let timed = if timing.enabled {
            Some(one_kernel(self.time_region(
                timing,
                || Ok(()),
                |_| launch(&mut o, &mut lse),
            )?))
        } else {
            None
        };
        let tensors = runs.remove(0);
        Ok(RunOutput {
            tensors,
            repeats: runs,
            samples: timed,
            notes: self.take_notes(),
            ..Default::default()
        })
    }

    /// Dispatches one variant run.
    pub(super) fn run_request(&mut self, req: &RunRequest) -> R<RunOutput> {
        let n = req.repeats.max(1);
        match (req.workload, req.plan) {
            (Workload::Mla(w), VariantPlan::Ps1 { kernel_heads, ranks }) => {
                self.run_ps1(w, *kernel_heads, ranks, req.timing, n)
            }
            (Workload::Mla(w), VariantPlan::Page64 { kernel_heads, splits }) => {
                self.run_page64(w, *kernel_heads, splits, req.timing, n)
            }
            (Workload::Mla(_), VariantPlan::DcpCombine(c)) => self.run_combine(c, req.timing, n),
            (Workload::V4(w), VariantPlan::V4Split(s)) => {
                self.run_v4_split(w, &s.split_indptr, s.n, req.case.v4.eager, req.timing, n)
            }
            (Workload::V4(w), VariantPlan::HcaPersist { partitions, .. }) => {
                self.run_hca(w, *partitions, req.timing, n)
            }
            (Workload::V4(w), VariantPlan::SplitMerge(s)) => self.run_split_merge(w, s, req.timing, n),
            _ => Err(BackendError::Unsupported(
                "plan does not match the workload family".into(),
            )),
        }
    }
}

/// Whether hca_persist's row counters are back at zero after a launch; any
/// left over are cleared so the next launch starts from rest.
fn counters_at_rest(dev: &super::CudaDevice, counters: &mut DeviceBuffer<i32>, name: String) -> R<DeviceCheck> {
    let left = dev.download(counters)?.iter().filter(|&&c| c != 0).count();
    if left > 0 {
        dev.fill_u32(counters, 0)?;
    }
    Ok(DeviceCheck {
        name,
        pass: left == 0,
        why: if left == 0 {
            String::new()
        } else {
            format!("{left} row counters non-zero after the launch; the last finisher must reset them (cleared for the next launch)")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::merge_smem_cap;

    const SM: usize = 233_472;
    const RES: usize = 1024;
    const MAX: usize = 232_448;

    /// Blocks of a launch with `smem` dynamic bytes that fit on one SM by
    /// shared memory alone.
    fn fit(smem: u32) -> usize {
        SM / (smem as usize + RES)
    }

    #[test]
    fn merge_blocks_per_sm_follow_the_grid() {
        // b8 c32768: 128 blocks, at most one per SM (all 128 in one wave)
        let one = merge_smem_cap(128, 132, SM, RES, MAX);
        assert_eq!(one as usize, MAX);
        assert_eq!(fit(one), 1);
        // b64 c4096: 64 reduce items x 16 heads = 1024 blocks, 8 per SM
        let eight = merge_smem_cap(1024, 132, SM, RES, MAX);
        assert_eq!(fit(eight), 8);
        assert!(1024 <= 132 * fit(eight));
        // past 16 per SM the thread limit (2048 / 128) decides anyway
        assert_eq!(fit(merge_smem_cap(100_000, 132, SM, RES, MAX)), 16);
        assert_eq!(fit(merge_smem_cap(0, 132, SM, RES, MAX)), 1);
    }
}
