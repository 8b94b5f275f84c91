//! The ceilings reports divide by, measured on the device at hand (never
//! datasheet numbers, never cached across runs): device-to-device copy
//! bandwidth and the dense tensor rate of each instruction kind (mma.sync
//! bf16; wgmma bf16 and e4m3 on sm_90a). Also the read rate of KV rows
//! gathered in random order, the layout-bound limit of a page-size-1 cache,
//! reported beside them.

use cudarc::driver::LaunchConfig;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::device::CudaDevice;
use super::probe::Probe;
use super::report::{Ceilings, GatherCeiling, LaunchOverhead};
use super::timing::{median, queue_ahead, Aids, Timer};
use crate::backend::{BackendError, TimingOptions};
use crate::tensor_ceiling::{MmaKind, TensorRates};

/// Timed runs per median.
const SAMPLES: usize = 10;
/// Bytes of one copy's source (2 GiB), less on a device without room.
const COPY_BYTES: usize = 2 << 30;
/// mma.sync m16n8k16: 2 * 16 * 8 * 16 FLOP per warp.
const MMA_FLOP: f64 = 4096.0;
/// Accumulator chains per warp and threads per block of `mlab_mma_bf16`:
/// `MLAB_MMA_CHAINS` and `MLAB_MMA_THREADS` of probe.cu, which must match.
const MMA_CHAINS: f64 = 8.0;
const MMA_BLOCK: u32 = 256;
/// wgmma m64n256k16 (bf16) and m64n256k32 (e4m3) per warpgroup.
const WGMMA_BF16_FLOP: f64 = 2.0 * 64.0 * 256.0 * 16.0;
const WGMMA_E4M3_FLOP: f64 = 2.0 * 64.0 * 256.0 * 32.0;
/// Threads per block and wgmma per warpgroup per loop iteration of
/// `mlab_wgmma_*`: `MLAB_WGMMA_THREADS` and `MLAB_WGMMA_PER_GROUP` of
/// probe.cu, which must match.
const WGMMA_BLOCK: u32 = 384;
const WGMMA_PER_GROUP: f64 = 16.0;
/// GPU busy-wait before each timed probe run, so host launch latency is
/// not timed (see `timing::Aids::spin`).
const QUEUE_AHEAD_NS: u64 = 50_000;
/// Row sizes the gather probe reads: one MLA KV row (576 elements) in fp8
/// and in bf16.
const GATHER_ROW_BYTES: [usize; 2] = [576, 1152];

/// `wgmma`: the probes were compiled for a target with wgmma (sm_90a);
/// elsewhere only mma.sync is measured.
pub fn measure(dev: &CudaDevice, probe: &Probe, wgmma: bool) -> Result<Ceilings, BackendError> {
    let (memcpy_gbps, copy_kernel_gbps, copy_buffer_bytes) = copy_bandwidth(dev, probe)?;
    let mut tensor = TensorRates::default();
    for kind in MmaKind::ALL {
        if wgmma || kind == MmaKind::MmaSyncBf16 {
            tensor.set(kind, Some(tensor_rate(dev, probe, kind)?));
        }
    }
    let (read_gbps, gather) = gather_bandwidth(dev, probe, copy_buffer_bytes)?;
    let (copy_gbps, copy_method) = if memcpy_gbps >= copy_kernel_gbps {
        (memcpy_gbps, "cuMemcpyDtoD")
    } else {
        (copy_kernel_gbps, "16-byte copy kernel")
    };
    Ok(Ceilings {
        copy_gbps,
        copy_method: copy_method.into(),
        memcpy_gbps,
        copy_kernel_gbps,
        copy_buffer_bytes,
        tensor,
        read_gbps,
        gather,
        samples: SAMPLES,
    })
}

/// Median of SAMPLES timed runs (after one warm-up), each queued behind a
/// GPU busy-wait so host launch latency stays out.
fn median_ms(
    dev: &CudaDevice,
    probe: &Probe,
    run: &mut dyn FnMut() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    let (a, b) = (dev.event()?, dev.event()?);
    run()?;
    let mut ms = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        queue_ahead(dev, probe.spin(), QUEUE_AHEAD_NS)?;
        dev.record(&a)?;
        run()?;
        dev.record(&b)?;
        ms.push(dev.elapsed_ms(&a, &b)?);
    }
    Ok(median(&ms))
}

/// Read-only GB/s of probe.cu's row gather over a pool of `bytes`: rows in
/// order (576-byte rows), then every row once in a seeded random order for
/// each of GATHER_ROW_BYTES.
fn gather_bandwidth(dev: &CudaDevice, probe: &Probe, bytes: usize) -> Result<(f64, Vec<GatherCeiling>), BackendError> {
    let pool = dev.alloc_zeros::<u32>(bytes / 4)?;
    let sink = dev.alloc_zeros::<u32>(1)?;
    let k = probe.gather();
    let grid = dev.props().sm_count as u32 * k.occupancy(256, 0).map_err(|e| dev.map_err("occupancy", e))?.max(1);
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x6a7e);
    let mut read = |row_bytes: usize, shuffle: bool| -> Result<f64, BackendError> {
        let n_rows = bytes / row_bytes;
        let mut order: Vec<i32> = (0..n_rows as i32).collect();
        if shuffle {
            order.shuffle(&mut rng);
        }
        let idx = dev.upload(&order)?;
        let (n, words, magic) = (n_rows as u64, (row_bytes / 16) as i32, 1u32);
        let ms = median_ms(dev, probe, &mut || {
            // SAFETY: mlab_gather_rows(const uint4* pool, const int* idx, u64
            // n_rows, int row_words, unsigned magic, unsigned* sink): idx holds
            // n_rows indices below bytes / row_bytes, so every row read lies in
            // the pool; sink holds one word (never written for a zero pool).
            unsafe {
                dev.launch(k)
                    .arg(&pool)
                    .arg(&idx)
                    .arg(&n)
                    .arg(&words)
                    .arg(&magic)
                    .arg(&sink)
                    .launch(cfg)
            }
        })?;
        Ok((n_rows * row_bytes) as f64 / (ms * 1e-3) / 1e9)
    };
    let contiguous = read(GATHER_ROW_BYTES[0], false)?;
    let mut gather = Vec::with_capacity(GATHER_ROW_BYTES.len());
    for row_bytes in GATHER_ROW_BYTES {
        gather.push(GatherCeiling {
            row_bytes,
            gbps: read(row_bytes, true)?,
        });
    }
    Ok((contiguous, gather))
}

/// Median GB/s (read + write bytes) of cuMemcpyDtoD and of probe.cu's
/// 16-byte copy kernel, and the buffer size used.
fn copy_bandwidth(dev: &CudaDevice, probe: &Probe) -> Result<(f64, f64, usize), BackendError> {
    let (free, _) = dev.mem_info()?;
    // Two buffers in at most 40% of free memory, whole MiB.
    let bytes = COPY_BYTES.min(free / 5) & !((1 << 20) - 1);
    if bytes < 4 * dev.props().l2_bytes {
        return Err(BackendError::Failed(format!(
            "only {} MiB free: too little for a copy larger than the L2",
            free >> 20
        )));
    }
    let words = bytes / 4;
    let mut src = dev.alloc_zeros::<u32>(words)?;
    let mut dst = dev.alloc_zeros::<u32>(words)?;
    dev.fill_u32(&mut src, 0xa5c3_5a3c)?;
    let timed = |run: &mut dyn FnMut() -> Result<(), BackendError>| -> Result<f64, BackendError> {
        Ok(2.0 * bytes as f64 / (median_ms(dev, probe, run)? * 1e-3) / 1e9)
    };
    let memcpy = timed(&mut || dev.copy(&src, &mut dst))?;

    // The kernel must really copy every word: poison dst, copy, check
    // samples at the start, the middle and the end (the grid-stride tail).
    dev.fill_u32(&mut dst, 0xffff_ffff)?;
    let k = probe.copy();
    let n16 = (bytes / 16) as u64;
    let grid = dev.props().sm_count as u32 * k.occupancy(256, 0).map_err(|e| dev.map_err("occupancy", e))?.max(1);
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = timed(&mut || {
        // SAFETY: mlab_copy_u128(const uint4* src, uint4* dst, u64 n): both
        // buffers hold n 16-byte words.
        unsafe { dev.launch(k).arg(&src).arg(&mut dst).arg(&n16).launch(cfg) }
    })?;
    for at in [0, words / 2, words - 1024] {
        let got = dev.download(&dst.slice(at..at + 1024))?;
        if let Some(bad) = got.iter().position(|&w| w != 0xa5c3_5a3c) {
            return Err(BackendError::Failed(format!(
                "copy probe left word {} as {:#x}",
                at + bad,
                got[bad]
            )));
        }
    }
    Ok((memcpy, kernel, bytes))
}

/// Threads per block of a tensor probe and the FLOP one block does per
/// loop iteration.
fn tensor_shape(kind: MmaKind) -> (u32, f64) {
    match kind {
        MmaKind::MmaSyncBf16 => (MMA_BLOCK, (MMA_BLOCK / 32) as f64 * MMA_CHAINS * MMA_FLOP),
        MmaKind::WgmmaBf16 => (
            WGMMA_BLOCK,
            (WGMMA_BLOCK / 128) as f64 * WGMMA_PER_GROUP * WGMMA_BF16_FLOP,
        ),
        MmaKind::WgmmaE4m3 => (
            WGMMA_BLOCK,
            (WGMMA_BLOCK / 128) as f64 * WGMMA_PER_GROUP * WGMMA_E4M3_FLOP,
        ),
    }
}

/// Median TFLOP/s of probe.cu's dense loop of one tensor instruction over
/// every SM (grid = SMs x occupancy), each run calibrated to about 10 ms.
fn tensor_rate(dev: &CudaDevice, probe: &Probe, kind: MmaKind) -> Result<f64, BackendError> {
    let k = probe.tensor(kind);
    let (block, flop_per_iter) = tensor_shape(kind);
    let per_sm = k.occupancy(block, 0).map_err(|e| dev.map_err("occupancy", e))?.max(1);
    let grid = dev.props().sm_count as u32 * per_sm;
    let mut out = dev.alloc_zeros::<f32>((grid * block) as usize)?;
    let seed = 0x5eed_u32;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut run = |iters: i32| -> Result<f64, BackendError> {
        let (a, b) = (dev.event()?, dev.event()?);
        queue_ahead(dev, probe.spin(), QUEUE_AHEAD_NS)?;
        dev.record(&a)?;
        // SAFETY: mlab_mma_bf16 / mlab_wgmma_bf16 / mlab_wgmma_e4m3 (float*
        // out, int iters, unsigned seed): out holds one float per launched
        // thread; block is the size each kernel's __launch_bounds__ allows
        // and its shared memory is static.
        unsafe { dev.launch(k).arg(&mut out).arg(&iters).arg(&seed).launch(cfg)? };
        dev.record(&b)?;
        dev.elapsed_ms(&a, &b)
    };
    // Calibrate to about 10 ms per run, after a warm-up that lifts the clocks.
    let probe_iters = 512;
    run(probe_iters)?;
    let t = run(probe_iters)?.max(1e-3);
    let iters = ((probe_iters as f64 * 10.0 / t) as i64).clamp(probe_iters as i64, i32::MAX as i64) as i32;
    run(iters)?;
    let mut ms = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        ms.push(run(iters)?);
    }
    let sums = dev.download(&out)?;
    if sums.iter().any(|x| !x.is_finite()) || sums.iter().all(|&x| x == 0.0) {
        return Err(BackendError::Failed(format!(
            "{kind} probe produced non-finite or all-zero sums"
        )));
    }
    Ok(grid as f64 * iters as f64 * flop_per_iter / (median(&ms) * 1e-3) / 1e12)
}

/// Empty-kernel cost: between events (launch queued ahead, so this is the
/// device-side cost), and per launch in a replayed graph.
pub fn launch_overhead(dev: &CudaDevice, probe: &Probe, timer: &Timer) -> Result<LaunchOverhead, BackendError> {
    let k = probe.empty();
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let launch = |_: usize| {
        // SAFETY: mlab_empty takes no parameters and touches no memory.
        unsafe { dev.launch(k).launch(cfg) }
    };
    let opts = TimingOptions {
        enabled: true,
        warmup: 10,
        min_samples: 50,
        min_time_ms: 0.0,
        // Exactly the 50 samples: a probe, not a row.
        target_noise: None,
        max_time_ms: f64::INFINITY,
        cold_l2: false,
        graph: false,
        sampling: crate::backend::Sampling::Auto,
    };
    let aids = Aids {
        flush: None,
        spin: Some(probe.spin()),
    };
    let ev = timer.time_region(dev, &opts, aids, || Ok(()), launch)?;
    let graph = timer.time_region(dev, &TimingOptions { graph: true, ..opts }, aids, || Ok(()), launch)?;
    Ok(LaunchOverhead {
        events_us: median(&ev.ms) * 1e3,
        graph_us: median(&graph.ms) * 1e3,
    })
}
