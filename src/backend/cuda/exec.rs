//! The one sequence every variant runs on the GPU, written once: upload a
//! program's buffers, poison its outputs and scratch, launch its calls,
//! sync, check its counters, download its outputs; repeat for the further
//! checked launches; time the kernel and the whole variant; replay a
//! captured graph over each replay step's new contents.

use cudarc::driver::LaunchConfig;
use std::sync::Arc;
use std::time::Instant;

use super::{CudaBackend, DeviceBuffer, Kernel, LoadedModule, RawArg};
use crate::backend::{BackendError, Exec, Handoff, RunOutput, Samples};
use crate::metrics::{POISON_BF16, POISON_BITS};
use crate::variants::program::{Arg, BufId, Fill, Init, Output, Program, Smem};
use crate::variants::{DeviceCheck, OutTensor};

type R<T> = Result<T, BackendError>;

/// Dynamic shared memory that lets at most `ceil(blocks / sms)` blocks of a
/// programmatically dependent merge onto one SM. Launched at the forward's
/// start, its blocks otherwise pile onto the few SMs the forward leaves idle
/// (up to 16 of 128 threads each) and merge there, one SM doing the work of
/// ten (measured: +12% at 8 sequences of 32k tokens).
pub fn merge_smem_cap(blocks: usize, sms: usize, smem_per_sm: usize, reserved: usize, max_block: usize) -> u32 {
    let per_sm = blocks.div_ceil(sms.max(1)).clamp(1, 16);
    (smem_per_sm / per_sm).saturating_sub(reserved).min(max_block) as u32
}

/// A program on the device: its buffers, and each call's kernel and launch form.
pub(super) struct Loaded {
    pub(super) bufs: Vec<DeviceBuffer<u8>>,
    /// Per call: its kernel's module, and whether it launches as a
    /// programmatic dependent.
    calls: Vec<(Arc<LoadedModule>, bool)>,
}

/// Adds the time since `t` to the output's phase `name`.
fn phase(out: &mut RunOutput, name: &'static str, t: Instant) {
    crate::backend::add_phase(&mut out.phases, name, t.elapsed().as_secs_f64());
}

impl CudaBackend {
    /// Runs a variant's programs (one per sequential pass) as [`Exec`] says.
    pub(super) fn execute(&mut self, programs: &[Program], exec: &Exec) -> R<RunOutput> {
        let repeats = exec.repeats.max(1);
        let mut out = RunOutput {
            repeats: vec![Vec::new(); repeats - 1],
            ..Default::default()
        };
        for prog in programs {
            prog.validate().map_err(BackendError::Failed)?;
            let t = Instant::now();
            let mut l = self.load(prog, exec.handoff)?;
            self.dev.sync()?;
            phase(&mut out, "load", t);
            for k in 0..repeats {
                let t = Instant::now();
                self.poison(prog, &l)?;
                self.launch(prog, &l, true)?;
                self.dev.sync()?;
                phase(&mut out, "launch", t);
                let t = Instant::now();
                let name = if k == 0 {
                    "counters".to_string()
                } else {
                    format!("counters.launch{}", k + 1)
                };
                self.at_rest(prog, &mut l, name, &mut out.device_checks)?;
                let into = if k == 0 {
                    &mut out.tensors
                } else {
                    &mut out.repeats[k - 1]
                };
                into.extend(self.outputs(prog, &l, "")?);
                phase(&mut out, "download", t);
            }
            if prog.timed && exec.timing.enabled {
                let t = Instant::now();
                let two = prog.calls.iter().any(|c| c.second);
                out.samples = Some(if two {
                    self.kernel_and_variant(&exec.timing, |variant| self.launch(prog, &l, variant))?
                } else {
                    let s = self.time_region(&exec.timing, || Ok(()), |_| self.launch(prog, &l, true))?;
                    Samples {
                        kernel_ms: s.ms.clone(),
                        variant_ms: s.ms,
                        clock: s.clock.to_string(),
                        regions: Vec::new(),
                    }
                });
                if !prog.at_rest.is_empty() {
                    self.at_rest(prog, &mut l, "counters.timed".into(), &mut out.device_checks)?;
                }
                phase(&mut out, "time", t);
            }
            if !prog.replays.is_empty() {
                let t = Instant::now();
                let graph = self.dev.capture(|| self.launch(prog, &l, true))?;
                for r in &prog.replays {
                    for (b, data) in &r.uploads {
                        self.dev.upload_into(data, &mut l.bufs[b.0])?;
                    }
                    self.poison(prog, &l)?;
                    self.dev.replay(&graph)?;
                    self.dev.sync()?;
                    self.at_rest(prog, &mut l, format!("counters{}", r.suffix), &mut out.device_checks)?;
                    out.tensors.extend(self.outputs(prog, &l, &r.suffix)?);
                }
                phase(&mut out, "replays", t);
            }
            let t = Instant::now();
            drop(l);
            phase(&mut out, "free", t);
        }
        out.notes = self.take_notes();
        Ok(out)
    }

    /// Compiles (or takes from the cache) each call's kernel, allocates every
    /// buffer and uploads the inputs.
    pub(super) fn load(&mut self, prog: &Program, handoff: Handoff) -> R<Loaded> {
        let mut calls = Vec::with_capacity(prog.calls.len());
        for c in &prog.calls {
            let m = self.module(&c.kernel)?;
            m.kernel(c.entry)?;
            let pdl = c.dependent && handoff == Handoff::Pdl && self.pdl_ok(&m);
            calls.push((m, pdl));
        }
        let mut bufs = Vec::with_capacity(prog.buffers.len());
        for b in &prog.buffers {
            // Whole words, at least one, so every fill pattern covers it.
            let mut d = self.dev.alloc_zeros::<u8>(b.bytes.max(4).next_multiple_of(4))?;
            if let Init::Upload(data) = &b.init {
                self.dev.upload_into(data, &mut d)?;
            }
            bufs.push(d);
        }
        Ok(Loaded { bufs, calls })
    }

    /// Whether a module's second kernels wait for their forward
    /// (`mlab_pdl_waits`, kernels/common/pdl.cuh). A kernels dir from before
    /// has merges that would read partials too early: those run in stream
    /// order, with a note.
    fn pdl_ok(&mut self, m: &LoadedModule) -> bool {
        if !m.pdl_waits() {
            self.notes.push(format!(
                "{} has no mlab_pdl_waits (a kernels dir from before --handoff): its merge ran in stream order",
                m.spec().label()
            ));
        }
        m.pdl_waits()
    }

    /// Fills every poisoned buffer with its pattern.
    pub(super) fn poison(&self, prog: &Program, l: &Loaded) -> R<()> {
        for (b, d) in prog.buffers.iter().zip(&l.bufs) {
            match b.init {
                Init::Poison(Fill::Bf16) => self.dev.fill_u16_scratch(d, POISON_BF16)?,
                Init::Poison(Fill::F32) => self.dev.fill_u32_scratch(d, POISON_BITS)?,
                Init::Upload(_) | Init::Zero => {}
            }
        }
        Ok(())
    }

    /// Queues the program's calls (`second`: the second kernels too).
    pub(super) fn launch(&self, prog: &Program, l: &Loaded, second: bool) -> R<()> {
        for (c, (m, pdl)) in prog.calls.iter().zip(&l.calls) {
            if c.second && !second {
                continue;
            }
            let kernel: &Kernel = m.kernel(c.entry)?;
            let args: Vec<RawArg> = c.args.iter().map(|a| self.raw(a, l)).collect::<R<_>>()?;
            let smem = match c.smem {
                Smem::Fixed(b) => b,
                Smem::DependentMerge if *pdl => {
                    let (x, y, z) = c.grid;
                    self.merge_smem(x as usize * y as usize * z as usize)
                }
                Smem::DependentMerge => 0,
            };
            let cfg = LaunchConfig {
                grid_dim: c.grid,
                block_dim: (c.block, 1, 1),
                shared_mem_bytes: smem,
            };
            // SAFETY: the variant's program gives the arguments in the
            // kernel's parameter order (kernels/ABI.md) over buffers it sized
            // from the workload and plan the kernel indexes; `validate` checked
            // that every buffer argument names one of them. As a dependent
            // launch, the second kernel waits for its forward on the device.
            unsafe { self.dev.launch_raw(kernel, cfg, *pdl, &args)? };
        }
        Ok(())
    }

    fn raw(&self, a: &Arg, l: &Loaded) -> R<RawArg> {
        Ok(match *a {
            Arg::Buf(BufId(i)) => RawArg::Ptr(self.dev.addr(&l.bufs[i])),
            Arg::I32(v) => RawArg::I32(v),
            Arg::F32(v) => RawArg::F32(v),
            Arg::Null => RawArg::Ptr(0),
            Arg::TileMap(m) => {
                let b = &l.bufs[m.buf.0];
                match m.rows(b.len()) {
                    // Nothing to copy: the kernel copies only rows in range.
                    0 => RawArg::TensorMap([0; 16]),
                    rows => RawArg::TensorMap(self.dev.tile_map(
                        self.dev.addr(b),
                        rows,
                        m.row_elems,
                        m.row_bytes,
                        m.box_rows,
                    )?),
                }
            }
        })
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

    /// Records whether the program's counters are back at zero, and clears
    /// what is left so the next launch starts from rest.
    fn at_rest(&self, prog: &Program, l: &mut Loaded, name: String, checks: &mut Vec<DeviceCheck>) -> R<()> {
        for b in &prog.at_rest {
            let n = prog.buffers[b.0].bytes / 4;
            let words: Vec<u8> = self.dev.download(&l.bufs[b.0].slice(0..n * 4))?;
            let left = words.chunks_exact(4).filter(|w| w.iter().any(|&x| x != 0)).count();
            if left > 0 {
                self.dev.fill_u32(&mut l.bufs[b.0], 0)?;
            }
            checks.push(DeviceCheck::counters(name.clone(), left));
        }
        Ok(())
    }

    /// Downloads the program's outputs, real heads only, names suffixed.
    pub(super) fn outputs(&self, prog: &Program, l: &Loaded, suffix: &str) -> R<Vec<OutTensor>> {
        prog.outputs.iter().map(|o| self.output(prog, l, o, suffix)).collect()
    }

    fn output(&self, prog: &Program, l: &Loaded, o: &Output, suffix: &str) -> R<OutTensor> {
        let bytes = prog.buffers[o.buf.0].bytes;
        let raw: Vec<u8> = self.dev.download(&l.bufs[o.buf.0].slice(0..bytes))?;
        Ok(OutTensor {
            name: format!("{}{suffix}", o.name),
            row_len: o.heads.real * o.inner,
            data: o.decode(&raw),
        })
    }
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
        // 8 sequences of 32k tokens: 128 blocks, at most one per SM (all in one wave)
        let one = merge_smem_cap(128, 132, SM, RES, MAX);
        assert_eq!(one as usize, MAX);
        assert_eq!(fit(one), 1);
        // 64 sequences of 4k: 64 reduce items x 16 heads = 1024 blocks, 8 per SM
        let eight = merge_smem_cap(1024, 132, SM, RES, MAX);
        assert_eq!(fit(eight), 8);
        assert!(1024 <= 132 * fit(eight));
        // past 16 per SM the thread limit (2048 / 128) decides anyway
        assert_eq!(fit(merge_smem_cap(100_000, 132, SM, RES, MAX)), 16);
        assert_eq!(fit(merge_smem_cap(0, 132, SM, RES, MAX)), 1);
    }
}
