//! A decode step of DCP on a group of GPUs (`--dcp-devices`), as numbers:
//! where each GPU's heads and ranks sit, the bytes each collective moves, and
//! the per-sample phase times folded into the report's regions. No I/O: the
//! CUDA backend measures, this module says what the measurements mean.

use serde::{Deserialize, Serialize};

use crate::case::{MLA_D_QK, MLA_D_V};
use crate::dcp::Reduce;
use crate::variants::output::{find, OutTensor};
use crate::workload::codec::round_bf16;

/// Bytes each GPU receives per collective when the group measures NCCL's
/// bus bandwidth as it opens (two buffers of it): large enough for the
/// bandwidth, not the latency, to rule.
pub const BANDWIDTH_PROBE_BYTES: usize = 256 << 20;

/// The shape of one step: `world` ranks on `gpus` GPUs, consecutive ranks
/// together (GPU `g` holds ranks `g*k .. (g+1)*k`, `k = world / gpus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    pub gpus: usize,
    pub world: usize,
    /// Query rows (`B * s_q`).
    pub rows: usize,
    /// Real gathered heads `H = H_local * W`.
    pub heads: usize,
    /// Heads the decode kernel runs (padded, >= `heads`).
    pub kernel_heads: usize,
    /// Bytes of one Q element (1 for fp8, 2 for bf16).
    pub q_elem: usize,
    /// Bytes of one element of the outputs' reduce-scatter (2 or 4).
    pub reduce_elem: usize,
}

impl StepShape {
    pub fn ranks_per_gpu(&self) -> usize {
        self.world / self.gpus
    }
    /// Heads each GPU contributes to the Q all-gather and owns after the
    /// reduce-scatter: its ranks' local heads.
    pub fn heads_per_gpu(&self) -> usize {
        self.heads / self.gpus
    }
    pub fn q_head_bytes(&self) -> usize {
        MLA_D_QK * self.q_elem
    }
    /// Whether the shape splits evenly (a precondition of every collective).
    pub fn validate(&self) -> Result<(), String> {
        let ok = self.gpus > 0
            && self.world % self.gpus == 0
            && self.heads % self.gpus == 0
            && self.kernel_heads >= self.heads
            && self.q_head_bytes() % 16 == 0;
        if ok {
            Ok(())
        } else {
            Err(format!("a DCP step of {self:?} does not split evenly over its GPUs"))
        }
    }

    /// GPU `g`'s part of the all-gathered Q: heads `g*Hg .. (g+1)*Hg` of
    /// every row of `q` (`[rows, H, 576]`, as bytes).
    pub fn q_slice(&self, q: &[u8], g: usize) -> Vec<u8> {
        let (hb, hg) = (self.q_head_bytes(), self.heads_per_gpu());
        let row = self.heads * hb;
        (0..self.rows)
            .flat_map(|i| &q[i * row + g * hg * hb..i * row + (g + 1) * hg * hb])
            .copied()
            .collect()
    }

    /// The merged output from each GPU's part after the reduce-scatter
    /// (`[rows, H/N, inner]` each, f32) as `[rows, H, inner]`.
    pub fn assemble(&self, parts: &[Vec<f32>], inner: usize) -> Vec<f32> {
        let hg = self.heads_per_gpu();
        let mut out = Vec::with_capacity(self.rows * self.heads * inner);
        for i in 0..self.rows {
            for p in parts {
                out.extend_from_slice(&p[i * hg * inner..(i + 1) * hg * inner]);
            }
        }
        out
    }

    /// The step's own buffers on each GPU, beside its ranks' programs: what
    /// the CUDA group allocates and the run's memory budget counts.
    pub fn buffers(&self) -> StepBuffers {
        let (k, hg, qhb) = (self.ranks_per_gpu(), self.heads_per_gpu(), self.q_head_bytes());
        let plane = self.rows * self.kernel_heads;
        StepBuffers {
            q_send: self.rows * hg * qhb,
            q_all: self.gpus * self.rows * hg * qhb,
            lse_send: k * plane * 4,
            lse_all: self.world * plane * 4,
            o_loc: (k > 1).then_some(k * plane * MLA_D_V * 2),
            o_send: self.rows * self.heads * MLA_D_V * self.reduce_elem,
            o_sum32: (self.reduce_elem == 4).then_some(self.rows * hg * MLA_D_V * 4),
            o_final: self.rows * hg * MLA_D_V * 2,
            lse_final: (self.rows * hg * 4).max(4),
        }
    }

    /// Bytes each GPU receives per collective (NCCL's "algorithm bytes"
    /// times `(N-1)/N`, the bus bytes its bus bandwidth is quoted in).
    pub fn bus_bytes(&self) -> CommBytes {
        let share = (self.gpus - 1) as f64 / self.gpus as f64;
        let q = (self.rows * self.heads * self.q_head_bytes()) as f64;
        let lse = (self.world * self.rows * self.kernel_heads * 4) as f64;
        let o = (self.rows * self.heads * MLA_D_V * self.reduce_elem) as f64;
        CommBytes {
            q_allgather: q * share,
            lse_allgather: lse * share,
            reduce_scatter: o * share,
        }
    }
}

/// Bytes of each buffer a step holds on every GPU of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBuffers {
    /// This GPU's heads of Q, the all-gather's input.
    pub q_send: usize,
    /// Every GPU's heads of Q, gathered.
    pub q_all: usize,
    /// This GPU's ranks' LSEs, and every rank's after the all-gather.
    pub lse_send: usize,
    pub lse_all: usize,
    /// The local ranks' outputs staged for the correction (more than one rank).
    pub o_loc: Option<usize>,
    /// The corrected sum over every head, the reduce-scatter's input.
    pub o_send: usize,
    /// This GPU's heads summed in f32 (f32 reduce only).
    pub o_sum32: Option<usize>,
    pub o_final: usize,
    pub lse_final: usize,
}

impl StepBuffers {
    /// Each allocated buffer, named as the memory budget reports it.
    pub fn named(&self) -> Vec<(&'static str, usize)> {
        let mut v = vec![
            ("device: step Q, this GPU's heads", self.q_send),
            ("device: step Q, gathered", self.q_all),
            ("device: step LSE, this GPU's ranks", self.lse_send),
            ("device: step LSE, gathered", self.lse_all),
            ("device: step o, corrected sum", self.o_send),
            ("device: step o, this GPU's heads", self.o_final),
            ("device: step lse, this GPU's heads", self.lse_final),
        ];
        v.extend(self.o_loc.map(|n| ("device: step o, local ranks", n)));
        v.extend(self.o_sum32.map(|n| ("device: step o, f32 sum", n)));
        v
    }
}

/// NaN and `+inf` LSEs mean "this rank saw nothing" (SPEC §1).
fn lse_clean(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The step's merge as the GPUs compute it, on the host, in their order and
/// precision: `G` over every rank's LSE in f32 (`merge_lse`), each GPU's
/// ranks weighted by `exp(lse_r - G)` and summed in f32 (`dcp_correct`),
/// then summed over the GPUs around NCCL's ring, starting after the GPU
/// that owns the head and ending at it: in bf16 rounded at every hop, or
/// in f32 rounded once (`dcp_to_bf16`). `ranks[r]` is rank r's `o`
/// (`[rows, H, 512]`) and `lse` (`[rows, H]`), real heads. Returns the
/// merged `o` and `lse`.
pub fn device_merge(shape: &StepShape, ranks: &[(&[f32], &[f32])], reduce: Reduce) -> (Vec<f32>, Vec<f32>) {
    let (n, k, h, d) = (shape.gpus, shape.ranks_per_gpu(), shape.heads, MLA_D_V);
    let hc = shape.heads_per_gpu();
    let pairs = shape.rows * h;
    let mut o = vec![0f32; pairs * d];
    let mut lse = vec![f32::NEG_INFINITY; pairs];
    let mut parts = vec![0f32; n * d];
    for p in 0..pairs {
        let x: Vec<f32> = ranks.iter().map(|(_, l)| lse_clean(l[p])).collect();
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let g = if m == f32::NEG_INFINITY {
            m
        } else {
            x.iter()
                .filter(|&&v| v != f32::NEG_INFINITY)
                .map(|&v| (v - m).exp())
                .sum::<f32>()
                .ln()
                + m
        };
        lse[p] = g;
        parts.fill(0.0);
        for (r, (ro, _)) in ranks.iter().enumerate() {
            let w = if x[r] == f32::NEG_INFINITY || g == f32::NEG_INFINITY {
                0.0
            } else {
                (x[r] - g).exp()
            };
            if w == 0.0 {
                continue;
            }
            let gpu = r / k;
            for (a, v) in parts[gpu * d..(gpu + 1) * d].iter_mut().zip(&ro[p * d..(p + 1) * d]) {
                *a += w * v;
            }
        }
        let owner = (p % h) / hc;
        let out = &mut o[p * d..(p + 1) * d];
        for (e, y) in out.iter_mut().enumerate() {
            let hop = |i: usize| parts[((owner + 1 + i) % n) * d + e];
            *y = match reduce {
                Reduce::Bf16 => (1..n).fold(round_bf16(hop(0)), |acc, i| round_bf16(acc + round_bf16(hop(i)))),
                Reduce::F32 => round_bf16((1..n).fold(hop(0), |acc, i| acc + hop(i))),
            };
        }
    }
    (o, lse)
}

/// Appends `o.dcp` and `lse.dcp`, the [`device_merge`] of the ranks'
/// `o.rN` / `lse.rN` in `out`: the CPU backend's model of a step's merge.
pub fn append_device_merge(shape: &StepShape, reduce: Reduce, out: &mut Vec<OutTensor>) -> Result<(), String> {
    let (o, lse) = {
        let mut ranks = Vec::with_capacity(shape.world);
        for r in 0..shape.world {
            ranks.push((
                find(out, &format!("o.r{r}"))?.data.as_slice(),
                find(out, &format!("lse.r{r}"))?.data.as_slice(),
            ));
        }
        device_merge(shape, &ranks, reduce)
    };
    out.push(OutTensor {
        name: "o.dcp".into(),
        row_len: shape.heads * MLA_D_V,
        data: o,
    });
    out.push(OutTensor {
        name: "lse.dcp".into(),
        row_len: shape.heads,
        data: lse,
    });
    Ok(())
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommBytes {
    pub q_allgather: f64,
    pub lse_allgather: f64,
    pub reduce_scatter: f64,
}

impl CommBytes {
    pub fn total(&self) -> f64 {
        self.q_allgather + self.lse_allgather + self.reduce_scatter
    }
}

/// The phases of a step on one GPU, in stream order; `kernels` has one time
/// per local rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    pub q_allgather: f64,
    pub q_layout: f64,
    pub kernels: Vec<f64>,
    pub lse_allgather: f64,
    pub correct: f64,
    pub reduce_scatter: f64,
}

impl GpuSample {
    pub fn kernel(&self) -> f64 {
        self.kernels.iter().sum()
    }
    /// From the GPUs' aligned start to its last collective's end.
    pub fn total(&self) -> f64 {
        self.q_allgather + self.q_layout + self.kernel() + self.lse_allgather + self.correct + self.reduce_scatter
    }
}

/// Region names of a step's latencies in the report, beside `kernel` and
/// `variant`.
pub const Q_ALLGATHER: &str = "step.q_allgather";
pub const Q_LAYOUT: &str = "step.q_layout";
pub const LSE_ALLGATHER: &str = "step.lse_allgather";
pub const CORRECT: &str = "step.correct";
pub const REDUCE_SCATTER: &str = "step.reduce_scatter";

/// The report's regions from `samples[g][s]` (GPU g's sample s): `variant`
/// is the step (the last GPU to finish), `kernel` and the communication
/// phases are the GPU whose ranks' kernels took longest in that sample (the
/// one whose collectives wait for nobody), and `rank.rN` each rank's kernel.
pub fn regions(samples: &[Vec<GpuSample>]) -> Vec<(String, Vec<f64>)> {
    let n = samples.iter().map(Vec::len).min().unwrap_or(0);
    let k = samples.first().and_then(|s| s.first()).map_or(0, |s| s.kernels.len());
    let mut step = Vec::with_capacity(n);
    let mut kernel = Vec::with_capacity(n);
    let mut phases: [Vec<f64>; 5] = Default::default();
    let mut ranks: Vec<Vec<f64>> = vec![Vec::with_capacity(n); samples.len() * k];
    for s in 0..n {
        let at = |g: usize| &samples[g][s];
        step.push((0..samples.len()).map(|g| at(g).total()).fold(0.0, f64::max));
        let slow = (0..samples.len())
            .max_by(|&a, &b| at(a).kernel().total_cmp(&at(b).kernel()))
            .unwrap_or(0);
        let x = at(slow);
        kernel.push(x.kernel());
        for (v, p) in phases
            .iter_mut()
            .zip([x.q_allgather, x.q_layout, x.lse_allgather, x.correct, x.reduce_scatter])
        {
            v.push(p);
        }
        for g in 0..samples.len() {
            for (j, &t) in at(g).kernels.iter().enumerate() {
                ranks[g * k + j].push(t);
            }
        }
    }
    let mut out = vec![("variant".to_string(), step), ("kernel".to_string(), kernel)];
    for (name, v) in [Q_ALLGATHER, Q_LAYOUT, LSE_ALLGATHER, CORRECT, REDUCE_SCATTER]
        .iter()
        .zip(phases)
    {
        out.push((name.to_string(), v));
    }
    out.extend(ranks.into_iter().enumerate().map(|(r, v)| (format!("rank.r{r}"), v)));
    out
}

/// NCCL's measured bus bandwidth on the group, GB/s (nccl-tests' `busbw`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BusBandwidth {
    #[serde(with = "crate::serde_float")]
    pub allgather_gbps: f64,
    #[serde(with = "crate::serde_float")]
    pub reduce_scatter_gbps: f64,
    /// Bytes each GPU received per collective of the measurement.
    pub message_bytes: f64,
}

/// What a report row says of the step beside its latencies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DcpStep {
    pub gpus: usize,
    pub ranks_per_gpu: usize,
    /// The outputs' reduce-scatter: `bf16` (vLLM's) or `f32`.
    #[serde(default)]
    pub reduce: String,
    /// NCCL's version and where it was loaded from.
    pub nccl: String,
    pub bus_bytes: CommBytes,
    /// `None` on one GPU: nothing crosses a link.
    pub bandwidth: Option<BusBandwidth>,
    /// The rank whose kernel's median is the longest.
    pub slowest_rank: usize,
    /// Its GPU's kernel median over the step's median.
    #[serde(with = "crate::serde_float")]
    pub slowest_share: f64,
    /// The slowest rank's GPU's kernel median plus every collective at the
    /// measured bus bandwidth: what the step would take with free launches
    /// and no waiting.
    pub ideal_ms: f64,
}

impl DcpStep {
    /// The step's summary from its regions' medians (`median` of a region).
    pub fn summarize(
        shape: &StepShape,
        nccl: String,
        bandwidth: Option<BusBandwidth>,
        median: impl Fn(&str) -> Option<f64>,
    ) -> Option<DcpStep> {
        let step = median("variant")?;
        let (slowest_rank, slow) = (0..shape.world)
            .filter_map(|r| median(&format!("rank.r{r}")).map(|m| (r, m)))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        let bytes = shape.bus_bytes();
        let comm_ms = match bandwidth {
            None => 0.0,
            Some(b) => {
                (bytes.q_allgather + bytes.lse_allgather) / (b.allgather_gbps * 1e6)
                    + bytes.reduce_scatter / (b.reduce_scatter_gbps * 1e6)
            }
        };
        Some(DcpStep {
            gpus: shape.gpus,
            ranks_per_gpu: shape.ranks_per_gpu(),
            reduce: if shape.reduce_elem == 4 { "f32" } else { "bf16" }.into(),
            nccl,
            bus_bytes: bytes,
            bandwidth,
            slowest_rank,
            slowest_share: if step > 0.0 { median("kernel")? / step } else { f64::NAN },
            ideal_ms: median("kernel")?.max(slow) + comm_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(gpus: usize, world: usize) -> StepShape {
        StepShape {
            gpus,
            world,
            rows: 3,
            heads: 4 * world,
            kernel_heads: 16.max(4 * world),
            q_elem: 2,
            reduce_elem: 2,
        }
    }

    #[test]
    fn step_buffers_hold_what_the_collectives_move() {
        for (gpus, world, reduce_elem) in [(1, 1, 2), (2, 8, 2), (4, 8, 4), (8, 8, 4)] {
            let s = StepShape {
                reduce_elem,
                ..shape(gpus, world)
            };
            let b = s.buffers();
            let q = vec![0u8; s.rows * s.heads * s.q_head_bytes()];
            assert_eq!(b.q_send, s.q_slice(&q, 0).len());
            assert_eq!(b.q_all, q.len(), "the all-gathered Q is every head of every row");
            let share = |x: usize| x as f64 * (gpus - 1) as f64 / gpus as f64;
            let bus = s.bus_bytes();
            assert_eq!(share(b.q_all), bus.q_allgather);
            assert_eq!(share(b.lse_all), bus.lse_allgather);
            assert_eq!(share(b.o_send), bus.reduce_scatter);
            assert_eq!(b.o_loc.is_some(), world / gpus > 1);
            assert_eq!(b.o_sum32.is_some(), reduce_elem == 4);
            assert_eq!(
                b.named().len(),
                7 + usize::from(b.o_loc.is_some()) + usize::from(b.o_sum32.is_some())
            );
        }
    }

    #[test]
    fn q_slices_gathered_in_gpu_order_rebuild_each_row_with_the_gathered_head_index() {
        // What dcp_gather_q does on the device: GPU g's slice holds heads
        // g*Hg + h; laid out again, head index rank*H_local + h comes back.
        for (gpus, world) in [(1, 1), (1, 8), (2, 2), (2, 8), (4, 4), (8, 8)] {
            let s = shape(gpus, world);
            s.validate().unwrap();
            let hb = s.q_head_bytes();
            let q: Vec<u8> = (0..s.rows * s.heads * hb).map(|i| (i * 7 % 251) as u8).collect();
            let gathered: Vec<u8> = (0..gpus).flat_map(|g| s.q_slice(&q, g)).collect();
            let hg = s.heads_per_gpu();
            let mut back = vec![0u8; q.len()];
            for i in 0..s.rows {
                for h in 0..s.heads {
                    let src = (((h / hg) * s.rows + i) * hg + h % hg) * hb;
                    let dst = (i * s.heads + h) * hb;
                    back[dst..dst + hb].copy_from_slice(&gathered[src..src + hb]);
                }
            }
            assert_eq!(back, q, "gpus {gpus} world {world}");
        }
    }

    #[test]
    fn assembled_parts_put_each_gpus_heads_in_place() {
        let s = shape(4, 8);
        let inner = 2;
        let hg = s.heads_per_gpu();
        let parts: Vec<Vec<f32>> = (0..4)
            .map(|g| {
                (0..s.rows * hg * inner)
                    .map(|x| {
                        let (i, h, d) = (x / (hg * inner), (x / inner) % hg, x % inner);
                        (i * 1000 + (g * hg + h) * 10 + d) as f32
                    })
                    .collect()
            })
            .collect();
        let full = s.assemble(&parts, inner);
        for (x, v) in full.iter().enumerate() {
            let (i, h, d) = (x / (s.heads * inner), (x / inner) % s.heads, x % inner);
            assert_eq!(*v, (i * 1000 + h * 10 + d) as f32);
        }
    }

    #[test]
    fn bus_bytes_are_zero_on_one_gpu_and_scale_by_the_share_received() {
        assert_eq!(shape(1, 8).bus_bytes().total(), 0.0);
        let s = shape(8, 8);
        let b = s.bus_bytes();
        assert_eq!(b.q_allgather, (3 * 32 * 576 * 2) as f64 * 7.0 / 8.0);
        assert_eq!(b.reduce_scatter, (3 * 32 * 512 * 2) as f64 * 7.0 / 8.0);
        assert_eq!(b.lse_allgather, (8 * 3 * 32 * 4) as f64 * 7.0 / 8.0);
    }

    fn sample(k: &[f64], comm: f64) -> GpuSample {
        GpuSample {
            q_allgather: comm,
            q_layout: 0.01,
            kernels: k.to_vec(),
            lse_allgather: comm,
            correct: 0.02,
            reduce_scatter: comm,
        }
    }

    #[test]
    fn regions_take_the_step_from_the_last_gpu_and_the_phases_from_the_slowest_kernels() {
        // GPU 1's kernels are slower; GPU 0 waits longer in its LSE gather.
        let samples = vec![
            vec![sample(&[1.0, 1.0], 0.5), sample(&[1.0, 1.1], 0.5)],
            vec![sample(&[1.5, 1.2], 0.1), sample(&[1.4, 1.4], 0.1)],
        ];
        let r = regions(&samples);
        let get = |n: &str| r.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(get("kernel"), vec![2.7, 2.8]);
        assert_eq!(get(Q_ALLGATHER), vec![0.1, 0.1]);
        let step0 = (0.5 + 0.01 + 2.0 + 0.5 + 0.02 + 0.5f64).max(0.1 + 0.01 + 2.7 + 0.1 + 0.02 + 0.1);
        assert!((get("variant")[0] - step0).abs() < 1e-12);
        assert_eq!(get("rank.r2"), vec![1.5, 1.4]);
        assert_eq!(get("rank.r1"), vec![1.0, 1.1]);
        assert_eq!(r.len(), 2 + 5 + 4);
        let med = |n: &str| {
            let mut v = get(n);
            v.sort_by(f64::total_cmp);
            Some((v[0] + v[1]) / 2.0)
        };
        let bw = BusBandwidth {
            allgather_gbps: 100.0,
            reduce_scatter_gbps: 50.0,
            message_bytes: 1e8,
        };
        let s = shape(2, 4);
        let d = DcpStep::summarize(&s, "2.27.3".into(), Some(bw), med).unwrap();
        assert_eq!((d.slowest_rank, d.gpus, d.ranks_per_gpu), (2, 2, 2));
        let b = s.bus_bytes();
        let comm = (b.q_allgather + b.lse_allgather) / 100e6 + b.reduce_scatter / 50e6;
        assert!((d.ideal_ms - (2.75 + comm)).abs() < 1e-12, "{}", d.ideal_ms);
        assert!((d.slowest_share - 2.75 / med("variant").unwrap()).abs() < 1e-12);
    }

    /// [`device_merge`] of `world` ranks on as many GPUs, in bf16 and in
    /// f32, against the f64 combine of the ranks' exact outputs (which the
    /// unsharded reference equals), beside the ranks' bf16 outputs merged
    /// in f64 (the emulation's `o.merged`).
    fn ring_merge(world: usize, seed: u64) -> [crate::metrics::ErrorMetrics; 3] {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let shape = StepShape {
            gpus: world,
            world,
            rows: 64 / world,
            heads: world,
            kernel_heads: world.max(16),
            q_elem: 2,
            reduce_elem: 2,
        };
        let (pairs, d) = (shape.rows * shape.heads, MLA_D_V);
        // Independent zero-mean outputs ~0.05 in size, as averages of the
        // synthetic N(0, 1) value rows are.
        let o: Vec<Vec<f64>> = (0..world)
            .map(|_| (0..pairs * d).map(|_| rng.gen_range(-0.1..0.1)).collect())
            .collect();
        let lse: Vec<Vec<f64>> = (0..world)
            .map(|_| (0..pairs).map(|_| rng.gen_range(2.0..4.0)).collect())
            .collect();
        let parts: Vec<(&[f64], &[f64])> = o.iter().zip(&lse).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let (want, _) = crate::reference::combine::combine(&parts, d);
        let o16: Vec<Vec<f64>> = o
            .iter()
            .map(|v| v.iter().map(|&x| round_bf16(x as f32) as f64).collect())
            .collect();
        let parts16: Vec<(&[f64], &[f64])> = o16
            .iter()
            .zip(&lse)
            .map(|(a, b)| (a.as_slice(), b.as_slice()))
            .collect();
        let (f64_merged, _) = crate::reference::combine::combine(&parts16, d);
        let as32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let (o32, l32): (Vec<Vec<f32>>, Vec<Vec<f32>>) = o16.iter().zip(&lse).map(|(a, b)| (as32(a), as32(b))).unzip();
        let ranks: Vec<(&[f32], &[f32])> = o32
            .iter()
            .zip(&l32)
            .map(|(a, b)| (a.as_slice(), b.as_slice()))
            .collect();
        let tol = crate::metrics::Tolerances::BF16;
        let run = |r: Reduce| crate::metrics::compare(&device_merge(&shape, &ranks, r).0, &want, &tol, None);
        [
            run(Reduce::Bf16),
            run(Reduce::F32),
            crate::metrics::compare(&as32(&f64_merged), &want, &tol, None),
        ]
    }

    #[test]
    fn device_merge_follows_the_combine_rules_on_empty_and_poisoned_ranks() {
        // Rank 1 empty with a NaN o and each empty spelling of its LSE; the
        // merge is rank 0's o exactly, and an all-empty pair gives 0, -inf.
        let shape = StepShape {
            gpus: 2,
            world: 2,
            rows: 1,
            heads: 2,
            kernel_heads: 16,
            q_elem: 2,
            reduce_elem: 2,
        };
        let d = MLA_D_V;
        let o0: Vec<f32> = (0..2 * d).map(|i| round_bf16(i as f32 * 1e-3)).collect();
        for empty in [f32::NEG_INFINITY, f32::INFINITY, f32::NAN] {
            let o1 = vec![f32::NAN; 2 * d];
            let (l0, l1) = ([1.5, f32::NEG_INFINITY], [empty, empty]);
            let ranks: Vec<(&[f32], &[f32])> = vec![(&o0, &l0), (&o1, &l1)];
            for r in [Reduce::Bf16, Reduce::F32] {
                let (o, l) = device_merge(&shape, &ranks, r);
                assert_eq!(&o[..d], &o0[..d], "{empty} {r}");
                assert_eq!(l[0], 1.5);
                assert!(
                    o[d..].iter().all(|&x| x == 0.0) && l[1] == f32::NEG_INFINITY,
                    "{empty} {r}"
                );
            }
        }
    }

    #[test]
    fn a_bf16_reduce_scatter_over_eight_ranks_spends_most_of_the_bf16_tolerance_and_f32_little() {
        // Independent zero-mean rank outputs, as the synthetic workloads have:
        // the partial sums cancel, so every bf16 hop's rounding counts.
        let tol = crate::metrics::Tolerances::BF16;
        for seed in [1, 2, 3] {
            let [bf16, f32, f64_merged] = ring_merge(8, seed);
            crate::metrics::judge_out(&bf16, &tol).unwrap();
            assert!(
                bf16.cos_diff > 0.5 * tol.cos_diff,
                "vLLM's bf16 ring costs most of the budget: {}",
                bf16.cos_diff
            );
            // f32 keeps the ranks' own rounding and the output's one.
            assert!(
                f32.cos_diff < bf16.cos_diff / 3.0,
                "{} vs {}",
                f32.cos_diff,
                bf16.cos_diff
            );
            assert!(f32.cos_diff < 0.3 * tol.cos_diff, "{}", f32.cos_diff);
            assert!(
                f32.cos_diff > f64_merged.cos_diff,
                "{} vs {}",
                f32.cos_diff,
                f64_merged.cos_diff
            );
            assert_eq!((bf16.mismatch, f32.mismatch), (0.0, 0.0));
        }
        // Two ranks: one hop, far inside.
        let [bf16, _, _] = ring_merge(2, 4);
        assert!(bf16.cos_diff < 0.5 * tol.cos_diff, "{}", bf16.cos_diff);
    }
}
