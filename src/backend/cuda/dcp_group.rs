//! DCP on a group of GPUs (`--dcp-devices N`): one host thread and one
//! stream per GPU, GPU `g` holding ranks `g*k .. (g+1)*k` (`k = W / N`) with
//! their KV shards, and a decode step as the engine runs it:
//!
//! 1. all-gather Q over the group (each GPU sends its ranks' heads) and lay
//!    it out as the decode kernel reads it (`dcp_gather_q`);
//! 2. every rank's decode kernel (the variant's own program) on its GPU;
//! 3. the combine of vLLM's `cp_lse_ag_out_rs`: all-gather the LSEs, scale
//!    the local outputs (`dcp_correct`), sum reduce-scatter them (in bf16 as
//!    vLLM does, or in f32 and then to bf16), so each GPU ends with the
//!    merged `o` and LSE of its own heads.
//!
//! Every checked step starts from poisoned Q, outputs and send buffers; the
//! per-rank outputs and the merged ones are read back from the GPUs. Timed
//! steps start with a one-word all-reduce that lines the GPUs up, and
//! events between the phases time each (dcp_step.rs says what they mean).
//! A GPU that fails to set up stops the others before any collective; a
//! GPU that faults or hangs mid-step leaves its peers waiting in NCCL until
//! the hang limit, and the group is then torn down with ncclCommAbort.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, LaunchConfig};
use cudarc::nccl::sys::ncclDataType_t;

use super::exec::Loaded;
use super::nccl::{self, Comm, Nccl};
use super::{CudaBackend, DeviceBuffer, OpenOptions, RawArg};
use crate::backend::{add_phase, BackendError, Exec, RunOutput, Samples, TimingOptions};
use crate::case::MLA_D_V;
use crate::dcp_step::{self, BusBandwidth, DcpStep, GpuSample, StepShape, BANDWIDTH_PROBE_BYTES};
use crate::metrics::{POISON_BF16, POISON_BITS};
use crate::variants::heads::PaddedHeads;
use crate::variants::program::{Elem, Output, Program, RankIo};
use crate::variants::{merge, Job, OutTensor, Variant};

type R<T> = Result<T, BackendError>;

/// A GPU of the group: its own backend (device, compiler, modules, L2
/// flush) and its rank's communicator.
struct Member {
    // Dropped in this order: the communicator before its device's backend.
    comm: Comm,
    be: CudaBackend,
}

pub struct Group {
    members: Vec<Member>,
    nccl: &'static Nccl,
    bandwidth: Option<BusBandwidth>,
    /// A step failed: collectives may be half issued, so the communicators
    /// are aborted, not destroyed, and the group is not used again.
    broken: bool,
}

/// How the members' threads agree, after every phase that can fail, to go
/// on or to stop together: a member that returned while the others wait at
/// a barrier or in a collective would leave them there for good.
struct Agree {
    barrier: Barrier,
    failed: AtomicBool,
    stop: AtomicBool,
}

impl Agree {
    fn new(n: usize) -> Agree {
        Agree {
            barrier: Barrier::new(n),
            failed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    /// Whether every member's phase succeeded. The second barrier keeps a
    /// fast member's next failure from being read as this phase's.
    fn all_ok<T>(&self, r: &R<T>) -> bool {
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        let ok = !self.failed.load(Ordering::SeqCst);
        self.barrier.wait();
        ok
    }

    /// A phase's result once every member has finished it.
    fn settle<T>(&self, r: R<T>) -> R<T> {
        if self.all_ok(&r) {
            return r;
        }
        Err(r.err().unwrap_or_else(|| BackendError::Failed(PEER_FAILED.into())))
    }
}

const PEER_FAILED: &str = "another GPU of the DCP group failed (its error is on this row)";

impl Group {
    /// Devices `0 .. n`, each with a backend and a communicator, and NCCL's
    /// bus bandwidth over them.
    pub fn open(n: usize, be: &CudaBackend) -> R<Group> {
        let setup = |e: super::EnvError| BackendError::Failed(format!("setting up the DCP group of {n} GPUs: {e}"));
        let lib = nccl::load().map_err(setup)?;
        let mut backends = Vec::with_capacity(n);
        for g in 0..n {
            let opts = OpenOptions {
                ordinal: g,
                arch: Some(be.compiler.arch().to_string()),
                measure_ceilings: false,
                measure_launch: false,
            };
            backends.push(CudaBackend::open_with(be.compiler.kernels_dir(), &opts).map_err(setup)?);
        }
        let comms = lib.init_all(&(0..n).collect::<Vec<_>>())?;
        let members: Vec<Member> = backends
            .into_iter()
            .zip(comms)
            .map(|(be, comm)| Member { comm, be })
            .collect();
        let mut group = Group {
            members,
            nccl: lib,
            bandwidth: None,
            broken: false,
        };
        if n > 1 {
            match group.measure_bandwidth() {
                Ok(b) => group.bandwidth = Some(b),
                Err(e) => {
                    group.broken = true;
                    return Err(e);
                }
            }
        }
        Ok(group)
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// nccl-tests' busbw of an all-gather and a reduce-scatter of
    /// [`BANDWIDTH_PROBE_BYTES`] per GPU: the median of 10 after 3 warm-ups.
    fn measure_bandwidth(&mut self) -> R<BusBandwidth> {
        let n = self.size();
        let agree = Agree::new(n);
        let results: Vec<R<(f64, f64)>> = std::thread::scope(|s| {
            let hs: Vec<_> = self
                .members
                .iter_mut()
                .map(|m| {
                    let agree = &agree;
                    s.spawn(move || m.bandwidth(n, agree))
                })
                .collect();
            hs.into_iter().map(join).collect()
        });
        let (ag, rs) = first_error(results)?.into_iter().next().unwrap_or((f64::NAN, f64::NAN));
        let bus = |ms: f64| BANDWIDTH_PROBE_BYTES as f64 * (n - 1) as f64 / n as f64 / (ms * 1e6);
        Ok(BusBandwidth {
            allgather_gbps: bus(ag),
            reduce_scatter_gbps: bus(rs),
            message_bytes: BANDWIDTH_PROBE_BYTES as f64,
        })
    }

    /// One case as a DCP step on the group. After an error the group is
    /// spent: drop it and open another.
    pub fn run(&mut self, unit: &dyn Variant, job: &Job, exec: &Exec) -> R<RunOutput> {
        let r = self.step(unit, job, exec);
        self.broken |= r.is_err();
        r
    }

    fn step(&mut self, unit: &dyn Variant, job: &Job, exec: &Exec) -> R<RunOutput> {
        let t = Instant::now();
        let programs = unit.programs(job).map_err(BackendError::Failed)?;
        let p = job
            .case
            .mla()
            .ok_or_else(|| BackendError::Failed("a DCP group runs MLA decode cases only".into()))?;
        let wl = job
            .workload
            .mla()
            .ok_or_else(|| BackendError::Failed("a DCP group runs MLA workloads only".into()))?;
        let n = self.size();
        let ios: Vec<RankIo> = programs
            .iter()
            .map(|pr| pr.rank_io)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                BackendError::Failed(format!(
                    "{} gave a program without its rank's DCP buffers",
                    unit.info().id
                ))
            })?;
        if ios.len() != p.dcp.world || ios.iter().enumerate().any(|(r, io)| io.rank != r) {
            return Err(BackendError::Failed(format!(
                "{} gave {} rank programs for W={}",
                unit.info().id,
                ios.len(),
                p.dcp.world
            )));
        }
        let kernel_heads = heads_of(&programs[0], ios[0].o)?.kernel;
        let shape = StepShape {
            gpus: n,
            world: p.dcp.world,
            rows: p.total_q(),
            heads: p.heads(),
            kernel_heads,
            q_elem: wl.q.elem_bytes(),
            reduce_elem: job.case.dcp_reduce.bytes(),
        };
        shape.validate().map_err(BackendError::Failed)?;
        let k = shape.ranks_per_gpu();
        let q_host = wl.q.as_bytes();
        let built = t.elapsed().as_secs_f64();
        let agree = Agree::new(n);
        let results: Vec<R<MemberOut>> = std::thread::scope(|s| {
            let hs: Vec<_> = self
                .members
                .iter_mut()
                .enumerate()
                .map(|(g, m)| {
                    let (progs, ios, agree, shape) =
                        (&programs[g * k..(g + 1) * k], &ios[g * k..(g + 1) * k], &agree, &shape);
                    let q = shape.q_slice(q_host, g);
                    s.spawn(move || m.run(g, progs, ios, shape, q, exec, agree))
                })
                .collect();
            hs.into_iter().map(join).collect()
        });
        let outs = first_error(results)?;
        let mut out = RunOutput {
            repeats: vec![Vec::new(); exec.repeats.max(1) - 1],
            ..Default::default()
        };
        out.phases.push(("programs", built));
        for launch in 0..exec.repeats.max(1) {
            let into = if launch == 0 {
                &mut out.tensors
            } else {
                &mut out.repeats[launch - 1]
            };
            // Rank order, then the merged tensors from every GPU's heads.
            for o in &outs {
                into.extend(o.launches[launch].ranks.iter().cloned());
            }
            let merged = |f: fn(&Launch) -> &Vec<f32>, inner: usize| {
                let parts: Vec<Vec<f32>> = outs.iter().map(|o| f(&o.launches[launch]).clone()).collect();
                shape.assemble(&parts, inner)
            };
            into.push(OutTensor {
                name: "o.dcp".into(),
                row_len: shape.heads * MLA_D_V,
                data: merged(|l| &l.o, MLA_D_V),
            });
            into.push(OutTensor {
                name: "lse.dcp".into(),
                row_len: shape.heads,
                data: merged(|l| &l.lse, 1),
            });
        }
        for o in &outs {
            for &(name, secs) in &o.phases {
                // The members ran side by side: the slowest is the phase's time.
                match out.phases.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, s)) => *s = s.max(secs),
                    None => add_phase(&mut out.phases, name, secs),
                }
            }
            out.notes.extend(o.notes.iter().cloned());
        }
        if exec.timing.enabled {
            let samples: Vec<Vec<GpuSample>> = outs.iter().map(|o| o.samples.clone()).collect();
            let mut regions = dcp_step::regions(&samples);
            let take = |name: &str, r: &mut Vec<(String, Vec<f64>)>| {
                r.iter()
                    .position(|(n, _)| n == name)
                    .map(|i| r.remove(i).1)
                    .unwrap_or_default()
            };
            let variant_ms = take("variant", &mut regions);
            let kernel_ms = take("kernel", &mut regions);
            let median = |v: &[f64]| crate::stats::Summary::from_samples(v).median;
            let med = |name: &str| match name {
                "variant" => Some(median(&variant_ms)),
                "kernel" => Some(median(&kernel_ms)),
                _ => regions.iter().find(|(n, _)| n == name).map(|(_, v)| median(v)),
            };
            out.step = DcpStep::summarize(&shape, self.describe(), self.bandwidth, med);
            out.samples = Some(Samples {
                kernel_ms,
                variant_ms,
                clock: "cuda-events-nccl".into(),
                regions,
            });
        }
        Ok(out)
    }

    /// `NCCL 2.27.3 (loader search path (libnccl.so.2))`.
    fn describe(&self) -> String {
        format!("NCCL {} ({})", self.nccl.version, self.nccl.source)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // A group dropped after a failure may hold peers that never
        // arrived: abort rather than wait for them.
        if self.broken || self.members.iter().any(|m| m.be.dev.is_lost()) {
            for m in &mut self.members {
                m.comm.poison();
            }
        }
        // ncclCommDestroy finalizes, which may wait for the other ranks'
        // finalize: every member tears down at once, each on its own thread,
        // as the threads that used them.
        std::thread::scope(|s| {
            for m in self.members.drain(..) {
                s.spawn(move || drop(m));
            }
        });
    }
}

/// The padded heads of a program's output buffer.
fn heads_of(p: &Program, buf: crate::variants::program::BufId) -> R<PaddedHeads> {
    p.outputs
        .iter()
        .find(|o| o.buf == buf)
        .map(|o| o.heads)
        .ok_or_else(|| BackendError::Failed("the rank's o is not among its outputs".into()))
}

/// A member thread's result; its panic, as an error.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, R<T>>) -> R<T> {
    h.join().unwrap_or_else(|p| {
        let text = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(BackendError::Failed(format!("a DCP group thread panicked: {text}")))
    })
}

/// Every member's result, or one error that names each GPU's own failure
/// (not the echoes of a peer's): lost when any device is lost.
fn first_error<T>(results: Vec<R<T>>) -> R<Vec<T>> {
    let (mut oks, mut errs) = (Vec::new(), Vec::new());
    for (g, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => oks.push(v),
            Err(e) => errs.push((g, e)),
        }
    }
    if errs.is_empty() {
        return Ok(oks);
    }
    let lost = errs.iter().any(|(_, e)| matches!(e, BackendError::DeviceLost(_)));
    let msg = errs
        .iter()
        .map(|(g, e)| (g, e.to_string()))
        .filter(|(_, m)| !m.contains(PEER_FAILED))
        .map(|(g, m)| format!("GPU {g}: {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    Err(if lost {
        BackendError::DeviceLost(msg)
    } else {
        BackendError::Failed(msg)
    })
}

/// One checked launch's read-back on one GPU.
struct Launch {
    ranks: Vec<OutTensor>,
    /// `[rows, H/N, 512]` and `[rows, H/N]`: this GPU's heads, merged.
    o: Vec<f32>,
    lse: Vec<f32>,
}

struct MemberOut {
    launches: Vec<Launch>,
    samples: Vec<GpuSample>,
    phases: Vec<(&'static str, f64)>,
    notes: Vec<String>,
}

/// A member's device state for one case: its ranks' loaded programs and
/// the step's own buffers.
struct Step<'p, 'a> {
    progs: &'p [Program<'a>],
    ios: &'p [RankIo],
    loaded: Vec<Loaded>,
    q_send: DeviceBuffer<u8>,
    q_all: DeviceBuffer<u8>,
    lse_send: DeviceBuffer<u8>,
    lse_all: DeviceBuffer<u8>,
    /// The local ranks' `o` side by side, when there are several.
    o_loc: Option<DeviceBuffer<u8>>,
    /// `[N, rows, H/N, 512]` of the reduce-scatter's type.
    o_send: DeviceBuffer<u8>,
    /// The f32 reduce-scatter's result, before its conversion to bf16.
    o_sum32: Option<DeviceBuffer<u8>>,
    o_final: DeviceBuffer<u8>,
    lse_final: DeviceBuffer<u8>,
    align: DeviceBuffer<f32>,
}

impl Member {
    /// Makes this GPU's context current on the calling thread: NCCL and the
    /// raw copies act on the thread's current device.
    fn bind(&self) -> R<()> {
        let dev = &self.be.dev;
        dev.context()
            .bind_to_thread()
            .map_err(|e| dev.map_err("binding the context", e))
    }

    fn bandwidth(&mut self, n: usize, agree: &Agree) -> R<(f64, f64)> {
        let per = BANDWIDTH_PROBE_BYTES / n;
        let bufs = (|| -> R<_> {
            self.bind()?;
            Ok((
                self.be.dev.alloc_zeros::<u8>(BANDWIDTH_PROBE_BYTES)?,
                self.be.dev.alloc_zeros::<u8>(BANDWIDTH_PROBE_BYTES)?,
            ))
        })();
        let (a, b) = agree.settle(bufs)?;
        let (pa, pb) = (self.be.dev.addr(&a), self.be.dev.addr(&b));
        let stream = self.be.dev.stream().cu_stream();
        let time = |gather: bool| -> R<f64> {
            let (e0, e1) = (self.be.dev.event()?, self.be.dev.event()?);
            let mut ms = Vec::with_capacity(10);
            for i in 0..13 {
                self.be.dev.record(&e0)?;
                // SAFETY: `a` and `b` hold BANDWIDTH_PROBE_BYTES each on this
                // GPU: the all-gather sends `per` and receives `per * n`,
                // the reduce-scatter sends `per * n` and receives `per`.
                unsafe {
                    if gather {
                        self.comm.all_gather(pa, pb, per, ncclDataType_t::ncclUint8, stream)?;
                    } else {
                        self.comm
                            .reduce_scatter_sum(pa, pb, per / 2, ncclDataType_t::ncclBfloat16, stream)?;
                    }
                }
                self.be.dev.record(&e1)?;
                let t = self.be.dev.elapsed_ms(&e0, &e1)?;
                if i >= 3 {
                    ms.push(t);
                }
            }
            Ok(crate::stats::Summary::from_samples(&ms).median)
        };
        let ag = agree.settle(time(true))?;
        let rs = agree.settle(time(false))?;
        Ok((ag, rs))
    }

    #[allow(clippy::too_many_arguments)]
    fn run<'p, 'a>(
        &mut self,
        g: usize,
        progs: &'p [Program<'a>],
        ios: &'p [RankIo],
        shape: &StepShape,
        q: Vec<u8>,
        exec: &Exec,
        agree: &Agree,
    ) -> R<MemberOut> {
        let mut phases = Vec::new();
        let t = Instant::now();
        let setup = self.setup(progs, ios, shape, &q, exec);
        let mut st = agree.settle(setup)?;
        add_phase(&mut phases, "load", t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut launches = Vec::new();
        for _ in 0..exec.repeats.max(1) {
            let r = self.checked(g, &mut st, shape);
            launches.push(agree.settle(r)?);
        }
        add_phase(&mut phases, "launch", t.elapsed().as_secs_f64());
        let mut samples = Vec::new();
        if exec.timing.enabled {
            let t = Instant::now();
            let r = self.time(g, &st, shape, &exec.timing, agree, &mut samples);
            agree.settle(r)?;
            add_phase(&mut phases, "time", t.elapsed().as_secs_f64());
        }
        Ok(MemberOut {
            launches,
            samples,
            phases,
            notes: self.be.take_notes(),
        })
    }

    fn setup<'p, 'a>(
        &mut self,
        progs: &'p [Program<'a>],
        ios: &'p [RankIo],
        shape: &StepShape,
        q: &[u8],
        exec: &Exec,
    ) -> R<Step<'p, 'a>> {
        self.bind()?;
        self.be.module(&merge::spec())?;
        let mut loaded = Vec::with_capacity(progs.len());
        for p in progs {
            p.validate().map_err(BackendError::Failed)?;
            loaded.push(self.be.load(p, exec.handoff)?);
        }
        let dev = &self.be.dev;
        let b = shape.buffers();
        debug_assert_eq!(q.len(), b.q_send);
        let q_send = dev.upload(q)?;
        let zeros = |n: usize| dev.alloc_zeros::<u8>(n);
        Ok(Step {
            progs,
            ios,
            loaded,
            q_send,
            q_all: zeros(b.q_all)?,
            lse_send: zeros(b.lse_send)?,
            lse_all: zeros(b.lse_all)?,
            o_loc: b.o_loc.map(zeros).transpose()?,
            o_send: zeros(b.o_send)?,
            o_sum32: b.o_sum32.map(zeros).transpose()?,
            o_final: zeros(b.o_final)?,
            lse_final: zeros(b.lse_final)?,
            align: dev.alloc_zeros::<f32>(1)?,
        })
    }

    /// Poisons every output, the Q the kernels read and the send buffers,
    /// runs one step and reads back the ranks' and the merged outputs.
    fn checked(&mut self, g: usize, st: &mut Step, shape: &StepShape) -> R<Launch> {
        let dev = &self.be.dev;
        for (p, l) in st.progs.iter().zip(&st.loaded) {
            self.be.poison(p, l)?;
        }
        for (io, l) in st.ios.iter().zip(&st.loaded) {
            // bf16 NaN in every 16-bit word; as e4m3 bytes, 0x7f and 0xff are NaN too.
            dev.fill_u16_scratch(&l.bufs[io.q.0], POISON_BF16)?;
        }
        // A value nobody wrote reads as NaN in bf16 and in f32 alike.
        match shape.reduce_elem {
            4 => dev.fill_u32_scratch(&st.o_send, POISON_BITS)?,
            _ => dev.fill_u16_scratch(&st.o_send, POISON_BF16)?,
        }
        if let Some(b) = &st.o_sum32 {
            dev.fill_u32_scratch(b, POISON_BITS)?;
        }
        dev.fill_u16_scratch(&st.o_final, POISON_BF16)?;
        dev.fill_u32_scratch(&st.lse_final, POISON_BITS)?;
        self.queue(g, st, shape, None)?;
        dev.sync()?;
        let mut ranks = Vec::with_capacity(2 * st.progs.len());
        for (p, l) in st.progs.iter().zip(&st.loaded) {
            ranks.extend(self.be.outputs(p, l, "")?);
        }
        let hg = shape.heads_per_gpu();
        let own = |inner: usize, elem: Elem| Output {
            name: String::new(),
            buf: crate::variants::program::BufId(0),
            elem,
            heads: PaddedHeads { real: hg, kernel: hg },
            inner,
            scatter: None,
        };
        let o_raw: Vec<u8> = dev.download(&st.o_final)?;
        let lse_raw: Vec<u8> = dev.download(&st.lse_final.slice(0..shape.rows * hg * 4))?;
        Ok(Launch {
            ranks,
            o: own(MLA_D_V, Elem::Bf16).decode(&o_raw),
            lse: own(1, Elem::F32).decode(&lse_raw),
        })
    }

    /// Warm-up steps, then timed ones until GPU 0 says the samples suffice.
    fn time(
        &mut self,
        g: usize,
        st: &Step,
        shape: &StepShape,
        opts: &TimingOptions,
        agree: &Agree,
        samples: &mut Vec<GpuSample>,
    ) -> R<()> {
        let k = shape.ranks_per_gpu();
        let events: Vec<CudaEvent> = (0..6 + k).map(|_| self.be.dev.event()).collect::<R<_>>()?;
        for _ in 0..opts.warmup {
            let r = self.queue(g, st, shape, None).and_then(|_| self.be.dev.sync());
            agree.settle(r)?;
        }
        let t0 = Instant::now();
        let mut steps: Vec<f64> = Vec::new();
        loop {
            let r = self.sample(g, st, shape, opts, &events);
            let s = agree.settle(r)?;
            // Member 0 decides for all: each member's steps end together.
            if g == 0 {
                steps.push(s.total());
                let spent = t0.elapsed().as_secs_f64() * 1e3;
                let enough = steps.len() >= opts.min_samples
                    && spent >= opts.min_time_ms
                    && (spent >= opts.max_time_ms
                        || opts
                            .target_noise
                            .map_or(true, |t| crate::stats::median_noise(&steps) <= t));
                agree.stop.store(enough || steps.len() >= MAX_STEPS, Ordering::SeqCst);
            }
            samples.push(s);
            agree.all_ok::<()>(&Ok(()));
            if agree.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
        }
    }

    fn sample(
        &mut self,
        g: usize,
        st: &Step,
        shape: &StepShape,
        opts: &TimingOptions,
        ev: &[CudaEvent],
    ) -> R<GpuSample> {
        if opts.cold_l2 {
            self.be.flush.run(&self.be.dev, self.be.probe.l2_flush())?;
        }
        self.queue(g, st, shape, Some(ev))?;
        let k = shape.ranks_per_gpu();
        let dev = &self.be.dev;
        let d = |a: usize| dev.elapsed_ms(&ev[a], &ev[a + 1]);
        Ok(GpuSample {
            q_allgather: d(0)?,
            q_layout: d(1)?,
            kernels: (0..k).map(|j| d(2 + j)).collect::<R<_>>()?,
            lse_allgather: d(2 + k)?,
            correct: d(3 + k)?,
            reduce_scatter: d(4 + k)?,
        })
    }

    /// Queues one step; with `ev`, events 0 .. 6+k between its phases.
    fn queue(&self, g: usize, st: &Step, shape: &StepShape, ev: Option<&[CudaEvent]>) -> R<()> {
        let be = &self.be;
        let dev = &be.dev;
        let stream = dev.stream().cu_stream();
        let mark = |i: usize| ev.map_or(Ok(()), |e| dev.record(&e[i]));
        let (n, k, rows, hk) = (shape.gpus, shape.ranks_per_gpu(), shape.rows, shape.kernel_heads);
        let (h, hg) = (shape.heads, shape.heads_per_gpu());
        let plane = rows * hk;
        let merge = be.module_loaded(&merge::spec())?;
        let ptr = |b: &DeviceBuffer<u8>| dev.addr(b);
        // SAFETY: `align` holds one f32 on this GPU.
        unsafe {
            self.comm
                .all_reduce_sum(dev.addr(&st.align), 1, ncclDataType_t::ncclFloat32, stream)?
        };
        mark(0)?;
        // SAFETY: q_send holds rows*Hg heads of q_head_bytes, q_all N times as much.
        unsafe {
            self.comm.all_gather(
                ptr(&st.q_send),
                ptr(&st.q_all),
                rows * hg * shape.q_head_bytes(),
                ncclDataType_t::ncclUint8,
                stream,
            )?
        };
        mark(1)?;
        let units = (shape.q_head_bytes() / 16) as i32;
        for (io, l) in st.ios.iter().zip(&st.loaded) {
            let args = [
                RawArg::Ptr(ptr(&st.q_all)),
                RawArg::I32(n as i32),
                RawArg::I32(rows as i32),
                RawArg::I32(hg as i32),
                RawArg::I32(units),
                RawArg::I32(hk as i32),
                RawArg::Ptr(ptr(&l.bufs[io.q.0])),
            ];
            // SAFETY: dcp_gather_q's ABI (kernels/ABI.md): q_all is
            // [N, rows, Hg, U] 16-byte units, the rank's Q buffer
            // [rows, hk, U] (Rank::add sized it so).
            unsafe { dev.launch_raw(merge.kernel("dcp_gather_q")?, grid(rows * hk), false, &args)? };
        }
        mark(2)?;
        for (j, (p, l)) in st.progs.iter().zip(&st.loaded).enumerate() {
            be.launch(p, l, true)?;
            mark(3 + j)?;
        }
        for (j, (io, l)) in st.ios.iter().zip(&st.loaded).enumerate() {
            copy(
                be,
                ptr(&st.lse_send) + (j * plane * 4) as u64,
                ptr(&l.bufs[io.lse.0]),
                plane * 4,
            )?;
        }
        // SAFETY: lse_send holds k planes of f32, lse_all W of them.
        unsafe {
            self.comm.all_gather(
                ptr(&st.lse_send),
                ptr(&st.lse_all),
                k * plane,
                ncclDataType_t::ncclFloat32,
                stream,
            )?
        };
        mark(3 + k)?;
        let o_loc = match &st.o_loc {
            Some(buf) => {
                for (j, (io, l)) in st.ios.iter().zip(&st.loaded).enumerate() {
                    let bytes = plane * MLA_D_V * 2;
                    copy(be, ptr(buf) + (j * bytes) as u64, ptr(&l.bufs[io.o.0]), bytes)?;
                }
                ptr(buf)
            }
            None => ptr(&st.loaded[0].bufs[st.ios[0].o.0]),
        };
        let args = [
            RawArg::Ptr(o_loc),
            RawArg::Ptr(ptr(&st.lse_all)),
            RawArg::I32(shape.world as i32),
            RawArg::I32((g * k) as i32),
            RawArg::I32(k as i32),
            RawArg::I32(rows as i32),
            RawArg::I32(hk as i32),
            RawArg::I32(h as i32),
            RawArg::I32(n as i32),
            RawArg::I32(g as i32),
            RawArg::I32(st.o_sum32.is_some() as i32),
            RawArg::Ptr(ptr(&st.o_send)),
            RawArg::Ptr(ptr(&st.lse_final)),
        ];
        // SAFETY: dcp_correct's ABI: o_loc [k, rows, hk, 512] bf16, lse_all
        // [W, rows, hk], o_send [N, rows, H/N, 512] of the type send_f32
        // names (setup sized it so), lse_final [rows, H/N].
        unsafe { dev.launch_raw(merge.kernel("dcp_correct")?, grid(rows * h), false, &args)? };
        mark(4 + k)?;
        let count = rows * hg * MLA_D_V;
        match &st.o_sum32 {
            None => {
                // SAFETY: o_send holds N blocks of `count` bf16, o_final one.
                unsafe {
                    self.comm.reduce_scatter_sum(
                        ptr(&st.o_send),
                        ptr(&st.o_final),
                        count,
                        ncclDataType_t::ncclBfloat16,
                        stream,
                    )?
                };
            }
            Some(sum) => {
                // SAFETY: o_send holds N blocks of `count` f32, `sum` one.
                unsafe {
                    self.comm.reduce_scatter_sum(
                        ptr(&st.o_send),
                        ptr(sum),
                        count,
                        ncclDataType_t::ncclFloat32,
                        stream,
                    )?
                };
                let args = [
                    RawArg::Ptr(ptr(sum)),
                    RawArg::I64(count as i64),
                    RawArg::Ptr(ptr(&st.o_final)),
                ];
                let cfg = LaunchConfig {
                    grid_dim: (count.div_ceil(8 * 256).clamp(1, 4 * dev.props().sm_count) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: dcp_to_bf16's ABI: `sum` holds `count` f32 and
                // o_final `count` bf16; `count` is a multiple of 512.
                unsafe { dev.launch_raw(merge.kernel("dcp_to_bf16")?, cfg, false, &args)? };
            }
        }
        mark(5 + k)?;
        Ok(())
    }
}

/// Cap on timed steps, whatever the noise.
const MAX_STEPS: usize = 1000;

/// One 64-thread block per item.
fn grid(items: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (items.max(1) as u32, 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Queues a device-to-device copy of `bytes` between raw addresses.
fn copy(be: &CudaBackend, dst: u64, src: u64, bytes: usize) -> R<()> {
    let dev = &be.dev;
    dev.context()
        .bind_to_thread()
        .map_err(|e| dev.map_err("binding the context", e))?;
    // SAFETY: both ranges lie inside buffers of this GPU that the caller
    // sized for them, and the copy is ordered on the device's one stream.
    let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, dev.stream().cu_stream()) };
    r.result().map_err(|e| dev.map_err("cuMemcpyDtoDAsync", e))
}
