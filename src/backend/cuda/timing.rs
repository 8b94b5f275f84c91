//! Timing a region of device work with events (SPEC §5): warm-up first,
//! then samples until the median is known to `target_noise` (and at least
//! `min_samples` and `min_time_ms` are in), or `max_time_ms` is spent; cold
//! L2 by default, and an optional graph-replay mode. Returns raw samples;
//! statistics live in `crate::stats`.

use std::time::{Duration, Instant};

use cudarc::driver::LaunchConfig;

use super::device::{CudaDevice, DeviceBuffer, Kernel};
use crate::backend::{BackendError, Sampling, TimingOptions};
use cudarc::driver::CudaEvent;

/// Reads a scratch buffer of twice the L2 between samples (outside the timed
/// region), so each sample starts with none of its inputs in L2. Reading
/// leaves clean lines; a memset would leave dirty ones that the timed kernel
/// would pay to write back.
pub struct L2Flush {
    buf: DeviceBuffer<u32>,
    sink: DeviceBuffer<u32>,
    words16: u64,
    grid: u32,
}

impl L2Flush {
    /// `kernel` is probe.cu's `mlab_l2_flush`.
    pub fn new(dev: &CudaDevice, kernel: &Kernel) -> Result<Self, BackendError> {
        let bytes = (2 * dev.props().l2_bytes).max(1 << 20).next_multiple_of(16);
        let grid = (dev.props().sm_count as u32 * kernel.occupancy(256, 0).unwrap_or(4).max(1)).max(1);
        Ok(L2Flush {
            buf: dev.alloc_zeros::<u32>(bytes / 4)?,
            sink: dev.alloc_zeros::<u32>(1)?,
            words16: (bytes / 16) as u64,
            grid,
        })
    }

    pub fn bytes(&self) -> usize {
        self.words16 as usize * 16
    }

    /// Queues the flush on the device's stream.
    pub fn run(&self, dev: &CudaDevice, kernel: &Kernel) -> Result<(), BackendError> {
        // The buffer is zeros, so the XOR of its words is 0 and never this.
        let magic = 1u32;
        let cfg = LaunchConfig {
            grid_dim: (self.grid, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: mlab_l2_flush(const uint4*, u64 n, unsigned magic, unsigned*
        // sink): buf holds n 16-byte words, sink one word.
        unsafe {
            dev.launch(kernel)
                .arg(&self.buf)
                .arg(&self.words16)
                .arg(&magic)
                .arg(&self.sink)
                .launch(cfg)
        }
    }
}

/// How each sample started cold (or did not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cold {
    /// The scratch-buffer flush ran before each sample.
    Flushed,
    /// The caller rotates input copies through the launch index.
    CallerRotates,
    /// `cold_l2` was off: warm-L2 numbers.
    Warm,
}

/// Raw samples of one timed region.
#[derive(Clone, Debug)]
pub struct RegionSamples {
    /// Milliseconds per launch of the region.
    pub ms: Vec<f64>,
    /// `cuda-events` or `cuda-graph`.
    pub clock: &'static str,
    /// Launches of the region behind each sample (1 with events).
    pub launches_per_sample: usize,
    pub cold: Cold,
}

/// Hard limits on sampling, beyond the options' `max_time_ms`
/// (`min_samples` is always honoured).
#[derive(Clone, Debug)]
pub struct Timer {
    /// Region launches captured per graph in graph mode.
    pub graph_launches: usize,
    pub max_samples: usize,
    pub max_wall: Duration,
    /// GPU busy-wait queued before the first sample of each batch (see
    /// [`Aids::spin`]).
    pub queue_ahead_ns: u64,
}

impl Default for Timer {
    fn default() -> Self {
        Timer {
            graph_launches: 20,
            max_samples: 10_000,
            max_wall: Duration::from_secs(10),
            queue_ahead_ns: 50_000,
        }
    }
}

/// Device work the timer queues outside the timed region.
#[derive(Clone, Copy, Default)]
pub struct Aids<'a> {
    /// The L2 flush and probe.cu's `mlab_l2_flush`.
    pub flush: Option<(&'a L2Flush, &'a Kernel)>,
    /// probe.cu's `mlab_spin`. Queued just before the start event, it keeps
    /// the GPU busy while the host enqueues the region, so the host's launch
    /// latency (about 3 us per sample on the H200 machine) is not timed.
    pub spin: Option<&'a Kernel>,
}

impl Timer {
    /// Times `launch(i)`, which queues one run of the region (`i` counts
    /// launches from 0 so callers can rotate input copies). `between` runs
    /// before each sample, outside the timed region (re-poison outputs, reset
    /// counters). With `opts.cold_l2` and a flush aid, the L2 is flushed before
    /// each sample; without one the caller is trusted to rotate inputs.
    ///
    /// Graph mode (`opts.graph`) captures `graph_launches` calls of `launch`
    /// into one graph and times its replays: a sample is one replay divided
    /// by the launches in it; only the first launch of a replay follows the
    /// flush, later ones are cold only if the caller rotates inputs.
    pub fn time_region(
        &self,
        dev: &CudaDevice,
        opts: &TimingOptions,
        aids: Aids<'_>,
        between: impl FnMut() -> Result<(), BackendError>,
        mut launch: impl FnMut(usize) -> Result<(), BackendError>,
    ) -> Result<RegionSamples, BackendError> {
        let mut v = self.time_regions(dev, opts, aids, 1, between, |_, i| launch(i))?;
        Ok(v.remove(0))
    }

    /// [`Timer::time_region`] for `regions` regions at once, `launch(r, i)`
    /// queuing launch `i` of region `r` (counted per region, so rotating
    /// inputs by `i` cycles each region through every copy). Their samples
    /// alternate (r0 r1 r0 r1 ...), so a drift of the device over the case (a second region has run 9-12%
    /// slower than an identical first one on the H200) lands on every region alike
    /// instead of on whichever ran last. Every region gets the same number of
    /// samples; sampling stops when every region meets the rule of
    /// [`Timer::more`].
    pub fn time_regions(
        &self,
        dev: &CudaDevice,
        opts: &TimingOptions,
        aids: Aids<'_>,
        regions: usize,
        mut between: impl FnMut() -> Result<(), BackendError>,
        mut launch: impl FnMut(usize, usize) -> Result<(), BackendError>,
    ) -> Result<Vec<RegionSamples>, BackendError> {
        let cold = match (opts.cold_l2, aids.flush.is_some()) {
            (false, _) => Cold::Warm,
            (true, true) => Cold::Flushed,
            (true, false) => Cold::CallerRotates,
        };
        let flush = if opts.cold_l2 { aids.flush } else { None };
        // The flush ahead of each sample is tens of µs of GPU work, longer
        // than the host takes to queue the sample behind it, so the host's
        // enqueue is hidden without a spin; the first sample of a batch
        // keeps one all the same. Warm samples have no flush to hide behind
        // and keep the spin.
        let before_sample = |first: bool| -> Result<(), BackendError> {
            if let Some((f, k)) = flush {
                f.run(dev, k)?;
            }
            if let (Some(k), true) = (aids.spin, first || flush.is_none()) {
                queue_ahead(dev, k, self.queue_ahead_ns)?;
            }
            Ok(())
        };
        let mut ms: Vec<Vec<f64>> = vec![Vec::new(); regions];
        let mut measured = vec![0.0f64; regions];
        let t0 = Instant::now();
        let (clock, per_sample) = if opts.graph {
            ("cuda-graph", self.graph_launches.max(1))
        } else {
            ("cuda-events", 1)
        };
        let graphs = if opts.graph {
            (0..regions)
                .map(|r| dev.capture(|| (0..per_sample).try_for_each(|i| launch(r, i))))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let mut i = vec![0usize; regions];
        // One sample of region r: a graph replay, or the next launch.
        let mut queue = |r: usize, launch: &mut dyn FnMut(usize, usize) -> Result<(), BackendError>| {
            if let Some(g) = graphs.get(r) {
                dev.replay(g)
            } else {
                launch(r, i[r])?;
                i[r] += 1;
                Ok(())
            }
        };
        for _ in 0..opts.warmup {
            for r in 0..regions {
                between()?;
                queue(r, &mut launch)?;
            }
        }
        dev.sync()?;
        // Samples are queued in batches, each sample between its own pair
        // of events, and read after one wait: the GPU never idles on the
        // host's reading of a sample, and the stopping rule is asked once a
        // batch.
        //
        // Regions shorter than SHORT_SAMPLE_MS are the exception: back to
        // back they run measurably slower than with the GPU idle between
        // samples (about +10% under 10 µs on the H200), so once the first
        // batch shows one, sampling starts over one sample at a time, each
        // read before the next is queued, as mlabench always did.
        let mut events: Vec<(CudaEvent, CudaEvent)> = Vec::new();
        let mut one_by_one = opts.sampling == Sampling::Serial;
        while self.more(opts, &ms, &measured, t0) {
            let n = ms[0].len();
            let batch = if one_by_one { 1 } else { batch_size(n, opts.min_samples) };
            while events.len() < batch * regions {
                events.push((dev.event()?, dev.event()?));
            }
            for b in 0..batch {
                for r in 0..regions {
                    let (start, end) = &events[b * regions + r];
                    between()?;
                    before_sample(!one_by_one && b == 0 && r == 0)?;
                    dev.record(start)?;
                    queue(r, &mut launch)?;
                    dev.record(end)?;
                }
            }
            for b in 0..batch {
                for r in 0..regions {
                    let (start, end) = &events[b * regions + r];
                    let t = dev.elapsed_ms(start, end)?;
                    measured[r] += t;
                    ms[r].push(t / per_sample as f64);
                }
            }
            if opts.sampling == Sampling::Auto
                && !one_by_one
                && !opts.graph
                && ms.iter().any(|v| median(v) < SHORT_SAMPLE_MS)
            {
                one_by_one = true;
                ms.iter_mut().for_each(Vec::clear);
                measured.iter_mut().for_each(|m| *m = 0.0);
            }
        }
        dev.sync()?;
        Ok(ms
            .into_iter()
            .map(|ms| RegionSamples {
                ms,
                clock,
                launches_per_sample: per_sample,
                cold,
            })
            .collect())
    }
}

impl Timer {
    /// Whether to take more samples: until `min_samples`, and then until
    /// every region has `min_time_ms` measured and (with a target) a median
    /// noise at or under it; never past `max_time_ms` of wall clock or
    /// `max_samples` once `min_samples` are in.
    fn more(&self, opts: &TimingOptions, ms: &[Vec<f64>], measured: &[f64], t0: Instant) -> bool {
        let n = ms.iter().map(Vec::len).min().unwrap_or(0);
        if n < opts.min_samples.max(1) {
            return true;
        }
        let wall = t0.elapsed();
        if n >= self.max_samples || wall >= self.max_wall || wall.as_secs_f64() * 1e3 >= opts.max_time_ms {
            return false;
        }
        let least = measured.iter().copied().fold(f64::INFINITY, f64::min);
        if least < opts.min_time_ms {
            return true;
        }
        match opts.target_noise {
            Some(t) => ms.iter().any(|v| crate::stats::median_noise(v) > t),
            None => false,
        }
    }
}

/// Samples (ms) under which a region is sampled one at a time.
pub const SHORT_SAMPLE_MS: f64 = 0.02;

/// Samples per batch: the minimum first, then a quarter of what is in
/// (so the rule overshoots its stopping point by at most a quarter), at
/// most 256.
fn batch_size(n: usize, min_samples: usize) -> usize {
    if n < min_samples {
        (min_samples - n).min(256)
    } else {
        (n / 4).clamp(1, 256)
    }
}

/// Queues probe.cu's `mlab_spin` for `ns` nanoseconds: work queued after it
/// is enqueued by the host before the GPU reaches it.
pub fn queue_ahead(dev: &CudaDevice, spin: &Kernel, ns: u64) -> Result<(), BackendError> {
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: mlab_spin(u64 ns) reads its argument only.
    unsafe { dev.launch(spin).arg(&ns).launch(cfg) }
}

/// Median of a non-empty sample (for the probes; reports use `crate::stats`).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_samples() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
