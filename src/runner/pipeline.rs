//! Runs a run's cases as a pipeline: while the device runs case k, builder
//! threads make the workloads and f64 references of the next cases and
//! checker threads check the cases before it. Rows still reach the sink in
//! case order, one at a time, so a crash loses nothing the sink already
//! wrote.
//!
//! The device stays on the calling thread (a CUDA context and the worker
//! pipes belong to it). Memory is bounded by the channels: `ahead`
//! builders each hold one prepared case (of the next data ids, built side
//! by side), and at most `checkers` ran cases are being checked or wait
//! to be written.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{execute, finish, needs_inputs, plan_case, skipped_row, Caches, CaseOptions, CaseOutcome, Inputs, Stage};
use crate::variants::{self, Plan, PlanError};

/// A case's inputs and its plan, built ahead of the device.
type Prepared = (Result<Inputs, String>, Option<Result<Plan, PlanError>>);
use crate::backend::worker::WorkerPool;
use crate::backend::Backend;
use crate::case::Case;

/// How far the stages may run apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// One case at a time, on one thread (memory for one case only).
    Sequential,
    /// Cases prepared ahead of the device (at least 1), ran cases checked
    /// side by side (at least 1), and the threads the reference may use.
    Overlap {
        ahead: usize,
        checkers: usize,
        ref_threads: usize,
    },
}

impl Depth {
    /// From how many cases fit in host memory at once and the cores: the
    /// pipeline holds up to `ahead + 1 + checkers` cases' inputs (prepared,
    /// on the device, being checked). A builder per four cores, two to
    /// four: the builders share one pool, and more of them overlap the
    /// parts of a build that run on one thread. As many checkers, one to
    /// four: a case's checks run on one thread, and a GPU turns cases
    /// around faster than one thread checks wide DCP outputs. The
    /// reference leaves a core to the device thread and the checks when
    /// there is one to leave.
    pub fn for_machine(cases_that_fit: u64, cores: usize, device_is_cpu: bool) -> Depth {
        if cases_that_fit < 3 || cores < 2 {
            return Depth::Sequential;
        }
        let ahead = (cases_that_fit - 2).min((cores / 4).clamp(2, 4) as u64) as usize;
        let checkers = (cases_that_fit - 1 - ahead as u64).clamp(1, (cores / 4).clamp(1, 4) as u64) as usize;
        // The CPU backend's emulation is itself parallel: the stages share
        // every core. A GPU's thread mostly waits, the checks are light.
        let ref_threads = if device_is_cpu || cores <= 2 { cores } else { cores - 1 };
        Depth::Overlap {
            ahead,
            checkers,
            ref_threads,
        }
    }
}

/// Where a run's wall clock went, per stage (seconds). With the pipeline
/// the stages overlap, so their sum exceeds the wall clock; the waits
/// say which stage held the others up.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    /// Building workloads and references.
    pub inputs: f64,
    /// Plans, launches, transfers (or a worker's run).
    pub device: f64,
    /// The device thread waiting for the next case's inputs.
    pub device_waited_inputs: f64,
    /// The device thread waiting for the checks to take a case.
    pub device_waited_checks: f64,
    /// Checks, statistics and writing the rows.
    pub checks: f64,
    /// Reference FLOPs and seconds, for the GFLOP/s line.
    pub ref_flops: f64,
    pub ref_secs: f64,
    pub pipelined: bool,
    /// The device stage's time by phase (plan, programs, load, launch,
    /// download, time, ...), summed over the cases.
    pub device_phases: Vec<(&'static str, f64)>,
}

impl StageTimes {
    fn add_phases(&mut self, stage: &Stage) {
        let Stage::Ran(r) = stage else { return };
        for &(name, s) in &r.out.phases {
            crate::backend::add_phase(&mut self.device_phases, name, s);
        }
    }
}

impl std::fmt::Display for StageTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pipelined {
            write!(
                f,
                "stages (overlapped): inputs {:.1} s, device {:.1} s (waited {:.1} s for inputs, {:.1} s for checks), checks and rows {:.1} s",
                self.inputs, self.device, self.device_waited_inputs, self.device_waited_checks, self.checks
            )?;
        } else {
            write!(
                f,
                "stages (one case at a time): inputs {:.1} s, device {:.1} s, checks and rows {:.1} s",
                self.inputs, self.device, self.checks
            )?;
        }
        if !self.device_phases.is_empty() {
            let p: Vec<String> = self
                .device_phases
                .iter()
                .map(|(n, s)| format!("{n} {s:.1} s"))
                .collect();
            write!(f, "; device: {}", p.join(", "))?;
        }
        Ok(())
    }
}

/// What [`run_all`] hands the sink for each case, in order.
pub type Sink<'s> = dyn FnMut(&Case, CaseOutcome) -> anyhow::Result<bool> + Send + 's;

/// Runs every case and hands each outcome to `sink` in case order. `pre`
/// gives why a case is skipped without running (too big for the machine).
/// The sink returns whether to go on (false: stop after this row, e.g. the
/// device is lost). Returns where the time went.
#[allow(clippy::too_many_arguments)]
pub fn run_all(
    cases: &[Case],
    pre: &(dyn Fn(&Case) -> Option<String> + Sync),
    backend: &mut dyn Backend,
    workers: &mut WorkerPool,
    opts: &CaseOptions,
    depth: Depth,
    on_start: &(dyn Fn(&Case) + Sync),
    sink: &mut Sink<'_>,
) -> anyhow::Result<StageTimes> {
    let Depth::Overlap {
        ahead,
        checkers,
        ref_threads,
    } = depth
    else {
        return sequential(cases, pre, backend, workers, opts, on_start, sink);
    };
    let stop = AtomicBool::new(false);
    let info = backend.info().clone();
    let group = group_of(cases);
    let builders = ahead.min(group.last().map_or(1, |g| g + 1)).max(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(ref_threads).build().ok();
    std::thread::scope(|s| {
        // Cases come grouped by data id. Builder j prepares the groups
        // g with g % builders == j, in order, and hands each case over a
        // channel of its own: the device reads the channel of the group it
        // is at, so the cases still arrive in order while the next groups
        // are built side by side. A case that needs no inputs sends None.
        let stop = &stop;
        let pool = &pool;
        let group = &group;
        let mut prx = Vec::with_capacity(builders);
        let mut prepare = Vec::with_capacity(builders);
        for j in 0..builders {
            let (ptx, rx) = sync_channel::<Option<Prepared>>(0);
            prx.push(rx);
            prepare.push(s.spawn(move || {
                let mut caches = Caches::default();
                let mut busy = 0.0;
                for (k, c) in cases.iter().enumerate() {
                    if group[k] % builders != j {
                        continue;
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let t = Instant::now();
                    let decision = variants::decide(c);
                    let mut prepare = || {
                        let inputs = caches.get(c, opts.check_rows);
                        let plan = inputs.as_ref().ok().map(|i| {
                            catch_unwind(AssertUnwindSafe(|| plan_case(c, &decision, i))).unwrap_or_else(|p| {
                                Err(variants::PlanError::new(
                                    &c.id,
                                    format!("panic while planning: {}", super::panic_text(&p)),
                                ))
                            })
                        });
                        (inputs, plan)
                    };
                    let item = (pre(c).is_none() && decision.skip.is_none()).then(|| match pool {
                        Some(p) => p.install(prepare),
                        None => prepare(),
                    });
                    busy += t.elapsed().as_secs_f64();
                    if ptx.send(item).is_err() {
                        break;
                    }
                }
                (busy, caches.ref_flops, caches.ref_secs)
            }));
        }
        // Ran cases, in order, to be checked and written.
        let (ctx, crx) = sync_channel::<(usize, Stage)>(0);
        let info = &info;
        // Up to `checkers` cases are checked at once, each on a thread of
        // its own, and written in order as soon as each is done, so a
        // finished case neither holds its inputs nor keeps its row unwritten
        // while the device is busy.
        let check = s.spawn(move || -> anyhow::Result<f64> {
            std::thread::scope(|cs| {
                let mut busy = 0.0;
                let mut flight: VecDeque<(usize, ScopedJoinHandle<'_, (CaseOutcome, f64)>)> =
                    VecDeque::with_capacity(checkers);
                let mut open = true;
                while open || !flight.is_empty() {
                    // Write the oldest while it is done, or must be (all busy, or no more coming).
                    while let Some((_, h)) = flight.front() {
                        if !(h.is_finished() || flight.len() >= checkers || !open) {
                            break;
                        }
                        let (k, h) = flight.pop_front().expect("one in flight");
                        let (out, secs) = h.join().map_err(|p| {
                            anyhow::anyhow!("the checks of {} panicked: {}", cases[k].key(), super::panic_text(&p))
                        })?;
                        let t = Instant::now();
                        let go = sink(&cases[k], out);
                        busy += secs + t.elapsed().as_secs_f64();
                        match go {
                            Ok(true) => {}
                            Ok(false) => {
                                stop.store(true, Ordering::Relaxed);
                                return Ok(busy);
                            }
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    if !open {
                        continue;
                    }
                    let got = if flight.is_empty() {
                        crx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    } else {
                        crx.recv_timeout(Duration::from_millis(1))
                    };
                    match got {
                        Ok((k, stage)) => {
                            let h = cs.spawn(move || {
                                let t = Instant::now();
                                let out = match stage {
                                    Stage::Done(o) => *o,
                                    Stage::Ran(r) => finish(&cases[k], *r, info, opts),
                                };
                                (out, t.elapsed().as_secs_f64())
                            });
                            flight.push_back((k, h));
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => open = false,
                    }
                }
                Ok(busy)
            })
        });
        let mut times = StageTimes {
            pipelined: true,
            ..Default::default()
        };
        for (k, c) in cases.iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let t = Instant::now();
            let Ok(item) = prx[group[k] % builders].recv() else {
                break;
            };
            times.device_waited_inputs += t.elapsed().as_secs_f64();
            on_start(c);
            let t = Instant::now();
            let stage = match pre(c) {
                Some(why) => Stage::Done(Box::new(CaseOutcome::ended(skipped_row(c, &info.backend, opts, &why)))),
                None => {
                    let (inputs, plan) = item.unwrap_or_else(|| (Err("not needed".into()), None));
                    execute(c, inputs, plan, backend, workers, opts)
                }
            };
            times.device += t.elapsed().as_secs_f64();
            times.add_phases(&stage);
            let lost = matches!(&stage, Stage::Done(o) if o.device_lost);
            let t = Instant::now();
            let sent = ctx.send((k, stage));
            times.device_waited_checks += t.elapsed().as_secs_f64();
            if sent.is_err() || lost {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        drop(ctx);
        drop(prx);
        let checked = check
            .join()
            .map_err(|p| anyhow::anyhow!("the check thread panicked: {}", super::panic_text(&p)))?;
        for p in prepare {
            let (busy, flops, secs) = p
                .join()
                .map_err(|p| anyhow::anyhow!("an input thread panicked: {}", super::panic_text(&p)))?;
            times.inputs += busy;
            times.ref_flops += flops;
            times.ref_secs += secs;
        }
        times.checks = checked?;
        Ok(times)
    })
}

/// Each case's group: consecutive cases of one data id share a group.
fn group_of(cases: &[Case]) -> Vec<usize> {
    let mut g = Vec::with_capacity(cases.len());
    for (k, c) in cases.iter().enumerate() {
        let same = k > 0 && cases[k - 1].data_id == c.data_id;
        g.push(match g.last() {
            Some(&last) if same => last,
            Some(&last) => last + 1,
            None => 0,
        });
    }
    g
}

fn sequential(
    cases: &[Case],
    pre: &(dyn Fn(&Case) -> Option<String> + Sync),
    backend: &mut dyn Backend,
    workers: &mut WorkerPool,
    opts: &CaseOptions,
    on_start: &(dyn Fn(&Case) + Sync),
    sink: &mut Sink<'_>,
) -> anyhow::Result<StageTimes> {
    let mut caches = Caches::default();
    let mut times = StageTimes::default();
    for c in cases {
        on_start(c);
        let out = match pre(c) {
            Some(why) => CaseOutcome::ended(skipped_row(c, &backend.info().backend, opts, &why)),
            None => run_case_timed(c, &mut caches, backend, workers, opts, &mut times),
        };
        let t = Instant::now();
        let go = sink(c, out)?;
        times.checks += t.elapsed().as_secs_f64();
        if !go {
            break;
        }
    }
    times.ref_flops = caches.ref_flops;
    times.ref_secs = caches.ref_secs;
    Ok(times)
}

/// One case end to end on this thread, its stages' times added to `times`.
pub(super) fn run_case_timed(
    c: &Case,
    caches: &mut Caches,
    backend: &mut dyn Backend,
    workers: &mut WorkerPool,
    opts: &CaseOptions,
    times: &mut StageTimes,
) -> CaseOutcome {
    let t = Instant::now();
    let inputs = if needs_inputs(c) {
        caches.get(c, opts.check_rows)
    } else {
        Err("not needed".into())
    };
    times.inputs += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let stage = execute(c, inputs, None, backend, workers, opts);
    times.device += t.elapsed().as_secs_f64();
    times.add_phases(&stage);
    let t = Instant::now();
    let o = match stage {
        Stage::Done(o) => *o,
        Stage::Ran(r) => finish(c, *r, backend.info(), opts),
    };
    times.checks += t.elapsed().as_secs_f64();
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_follows_memory_and_cores() {
        assert_eq!(Depth::for_machine(2, 16, false), Depth::Sequential);
        assert_eq!(Depth::for_machine(100, 1, true), Depth::Sequential);
        let overlap = |ahead, checkers, ref_threads| Depth::Overlap {
            ahead,
            checkers,
            ref_threads,
        };
        assert_eq!(Depth::for_machine(3, 16, false), overlap(1, 1, 15));
        assert_eq!(Depth::for_machine(u64::MAX, 16, true), overlap(4, 4, 16));
        // Memory first: 5 cases fit, 3 builders, the device's, one checker.
        assert_eq!(Depth::for_machine(5, 64, false), overlap(3, 1, 63));
        assert_eq!(Depth::for_machine(50, 2, false), overlap(2, 1, 2));
    }
}
