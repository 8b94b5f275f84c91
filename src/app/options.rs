//! The run's knobs, built and validated once from what the user typed (as
//! hyperfine's `Options` are): what to check, how to time, how to launch,
//! where outputs go. The repro command, the resume key, the run's meta and
//! its summary lines all derive from this one value, so a new knob is a
//! flag in cli.rs, a field here, and its one consumer.

use std::path::{Path, PathBuf};

use super::memory;
use crate::backend::{Backend, Exec, Handoff, TimingOptions};
use crate::case::{Case, Ps1Schedule, V4CoreChoice};
use crate::cli::{BackendChoice, Execution, RunArgs};
use crate::dcp::{Devices, Reduce};
use crate::error::InputError;
use crate::report::RunMeta;
use crate::runner::CaseOptions;
use crate::variants::{Fault, VariantId};

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub backend: BackendChoice,
    pub kernels_dir: PathBuf,
    /// A seeded sample of this many query rows per case; `None`: every row.
    pub check_rows: Option<usize>,
    /// Checked launches per case; `None`: the backend's default.
    pub repeat_checks: Option<usize>,
    pub timing: TimingOptions,
    pub handoff: Handoff,
    pub ps1_schedule: Ps1Schedule,
    pub v4_core: V4CoreChoice,
    /// Each DCP case also runs as a step on a group of GPUs, once per
    /// reduce-scatter type.
    pub dcp_devices: Option<Devices>,
    pub dcp_reduce: Vec<Reduce>,
    /// Variants run past a gate that rejects them.
    pub force: Vec<VariantId>,
    pub dump: Option<PathBuf>,
    pub junit: Option<PathBuf>,
    /// Host memory one case may use; `None`: what the machine has free.
    pub max_memory: Option<u64>,
    pub out: PathBuf,
    pub run_id: Option<String>,
    pub cpu_fault: Option<Fault>,
}

impl RunOptions {
    /// `mlabench run`'s options, refused before anything runs when they
    /// would check or time nothing, or lose an output.
    pub fn from_run(a: &RunArgs) -> Result<RunOptions, InputError> {
        let mut o = Self::from_exec(&a.exec, !a.no_timing, !a.warm_l2)?;
        o.ps1_schedule = a.ps1_schedule.parse().map_err(InputError::Usage)?;
        o.dcp_devices = a
            .dcp_devices
            .as_deref()
            .map(|d| {
                d.parse::<Devices>()
                    .map_err(|e| InputError::Usage(format!("--dcp-devices {e}")))
            })
            .transpose()?;
        o.dcp_reduce = a
            .dcp_reduce
            .split(',')
            .map(|r| {
                r.parse::<Reduce>()
                    .map_err(|e| InputError::Usage(format!("--dcp-reduce {e}")))
            })
            .collect::<Result<_, _>>()?;
        o.force = super::parse_variants(&a.force, "--force")?;
        o.dump = a.dump.clone();
        o.junit = a.junit.clone();
        o.cpu_fault = a
            .cpu_fault
            .as_deref()
            .map(|f| {
                f.parse::<Fault>()
                    .map_err(|m| InputError::Usage(format!("--cpu-fault: {m}")))
            })
            .transpose()?;
        if let Some(d) = &o.dump {
            writable_dir(d, "--dump")?;
        }
        if let Some(j) = &o.junit {
            let dir = j
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            writable_dir(dir, "--junit")?;
        }
        Ok(o)
    }

    /// What `run` and `splits` share: where to run, what to check, how to time.
    pub fn from_exec(e: &Execution, timed: bool, cold_l2: bool) -> Result<RunOptions, InputError> {
        let usage = |m: String| Err(InputError::Usage(m));
        if e.check_rows == Some(0) {
            return usage("--check-rows 0 checks no row, so every case would pass; give N >= 1, or leave the flag out to check every row".into());
        }
        if e.min_samples == 0 {
            return usage(
                "--min-samples 0 would report statistics of no sample; give at least 1 (the default is 10)".into(),
            );
        }
        if !(e.min_time_ms.is_finite() && e.min_time_ms >= 0.0) {
            return usage(format!(
                "--min-time-ms {}: give a time >= 0 in milliseconds",
                e.min_time_ms
            ));
        }
        if !(e.max_time_ms.is_finite() && e.max_time_ms > 0.0) {
            return usage(format!(
                "--max-time-ms {}: give a time > 0 in milliseconds",
                e.max_time_ms
            ));
        }
        let target_noise = parse_noise(&e.target_noise)?;
        if e.repeat_checks == Some(0) {
            return usage(
                "--repeat-checks 0 would run no checked launch; give at least 1 (2 compares two launches bit for bit)"
                    .into(),
            );
        }
        if !e.kernels_dir.is_dir() {
            return usage(format!(
                "--kernels-dir {}: no such directory; point it at the repository's kernels/ (or a copy of it)",
                e.kernels_dir.display()
            ));
        }
        Ok(RunOptions {
            backend: e.backend,
            kernels_dir: e.kernels_dir.clone(),
            check_rows: e.check_rows,
            repeat_checks: e.repeat_checks,
            timing: TimingOptions {
                enabled: timed,
                warmup: e.warmup,
                min_samples: e.min_samples,
                min_time_ms: e.min_time_ms,
                target_noise,
                max_time_ms: e.max_time_ms,
                cold_l2,
                graph: e.graph,
                sampling: e.sampling.parse().map_err(InputError::Usage)?,
            },
            handoff: e.handoff.parse().map_err(InputError::Usage)?,
            ps1_schedule: Ps1Schedule::default(),
            v4_core: e.v4_core.parse().map_err(InputError::Usage)?,
            dcp_devices: None,
            dcp_reduce: vec![Reduce::Bf16],
            force: vec![],
            dump: None,
            junit: None,
            max_memory: e.max_memory.as_deref().map(memory::parse_size).transpose()?,
            out: e.out.clone(),
            run_id: e.run_id.clone(),
            cpu_fault: None,
        })
    }

    /// The case-level knobs: forcing past a gate and the ps1 schedule change
    /// what a case's plan is, so the cases carry them.
    pub fn apply(&self, cases: &mut [Case]) {
        for c in cases {
            c.force |= self.force.contains(&c.variant);
            c.ps1_schedule = self.ps1_schedule;
            c.v4_core = self.v4_core;
        }
    }

    /// Adds the `-g<N>` twins `--dcp-devices` asks for. A flag that gives
    /// no case a twin would measure nothing it names: refused, with why.
    pub fn add_device_twins(&self, cases: &mut Vec<Case>) -> Result<Vec<String>, InputError> {
        let Some(d) = self.dcp_devices else {
            return Ok(vec![]);
        };
        let refused = crate::scenario::add_device_twins(cases, d, &self.dcp_reduce);
        if !cases.iter().any(|c| c.dcp_devices.is_some()) {
            let why = match refused.first() {
                Some(r) => format!(
                    "{r}{}",
                    if refused.len() > 1 {
                        format!(" (and {} more)", refused.len() - 1)
                    } else {
                        String::new()
                    }
                ),
                None => "no case runs ps1 or page64 (the decode kernels a DCP group runs)".into(),
            };
            return Err(InputError::Usage(format!(
                "--dcp-devices {d}: no case can run on those GPUs: {why}; give a count that divides the cases' dcp_world, or world"
            )));
        }
        Ok(refused
            .iter()
            .map(|r| format!("--dcp-devices {d}: {r}; that case runs on one GPU only"))
            .collect())
    }

    /// The `-g<N>` cases that need more GPUs than the `count` visible, with
    /// the reason their rows give. Asking for more GPUs than there are by
    /// `--dcp-devices N`, or leaving no group case that fits, is an error.
    pub fn fit_groups(
        &self,
        cases: &[Case],
        count: usize,
    ) -> Result<std::collections::HashMap<String, String>, InputError> {
        let short = |n: usize| {
            format!(
                "needs a DCP group of {} and this machine has {}",
                crate::backend::gpus(n),
                crate::backend::gpus(count)
            )
        };
        if let Some(Devices::Count(n)) = self.dcp_devices {
            if n > count {
                return Err(InputError::Environment(format!(
                    "--dcp-devices {n}: the run {}; give a count of at most {count} that divides W (check CUDA_VISIBLE_DEVICES)",
                    short(n)
                )));
            }
        }
        let skips: std::collections::HashMap<String, String> = cases
            .iter()
            .filter_map(|c| c.dcp_devices.filter(|&n| n > count).map(|n| (c.key(), short(n))))
            .collect();
        let fits = cases.iter().any(|c| c.dcp_devices.is_some_and(|n| n <= count));
        if !fits {
            let need = cases.iter().filter_map(|c| c.dcp_devices).min().unwrap_or(0);
            return Err(InputError::Environment(format!(
                "every DCP group case {}: run on a machine with more GPUs, or pick cases with a smaller W",
                short(need)
            )));
        }
        Ok(skips)
    }

    /// The kernels a run needs must be there on every backend: a CPU run that
    /// passes while pointing at no kernels says nothing about them.
    pub fn check_kernels(&self, cases: &[Case]) -> Result<(), InputError> {
        let mut missing: Vec<&str> = cases
            .iter()
            .map(|c| c.variant.info().kernel_file)
            .filter(|f| !f.is_empty())
            .filter(|f| !self.kernels_dir.join(f).is_file())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        Err(InputError::Usage(format!(
            "--kernels-dir {}: has no {} for the variants this run asks for; point it at a copy of the repository's kernels/",
            self.kernels_dir.display(),
            missing.join(", ")
        )))
    }

    /// Checked launches on `backend`: a GPU's launches can race, so two are
    /// compared there; the CPU emulation is deterministic by construction.
    pub fn repeats(&self, backend: &str) -> usize {
        self.repeat_checks.unwrap_or(default_repeats(backend))
    }

    /// The flags every row's repro command repeats: those that change what
    /// the row is (backend, sampling, hand-off, schedule, forcing).
    pub fn repro_flags(&self, backend: &str) -> String {
        let mut f = format!(" --backend {backend}");
        if let Some(n) = self.check_rows {
            f.push_str(&format!(" --check-rows {n}"));
        }
        if self.handoff != Handoff::default() {
            f.push_str(&format!(" --handoff {}", self.handoff));
        }
        if self.repeats(backend) != default_repeats(backend) {
            f.push_str(&format!(" --repeat-checks {}", self.repeats(backend)));
        }
        if self.ps1_schedule != Ps1Schedule::default() {
            f.push_str(&format!(" --ps1-schedule {}", self.ps1_schedule));
        }
        if self.v4_core != V4CoreChoice::default() {
            f.push_str(&format!(" --v4-core {}", self.v4_core));
        }
        for v in &self.force {
            f.push_str(&format!(" --force {v}"));
        }
        if let Some(d) = self.dcp_devices {
            f.push_str(&format!(" --dcp-devices {d}"));
            if self.dcp_reduce != [Reduce::Bf16] {
                let r: Vec<String> = self.dcp_reduce.iter().map(Reduce::to_string).collect();
                f.push_str(&format!(" --dcp-reduce {}", r.join(",")));
            }
        }
        f
    }

    /// What the runner needs, for this backend.
    pub fn case_options(&self, backend: &dyn Backend) -> CaseOptions {
        let name = backend.info().backend.as_str();
        CaseOptions {
            check_rows: self.check_rows,
            exec: Exec {
                timing: self.timing.clone(),
                repeats: self.repeats(name),
                handoff: self.handoff,
            },
            repro_flags: self.repro_flags(name),
        }
    }

    /// What a run was, for its directory (`prefix` + UTC stamp when unnamed).
    pub fn meta(&self, backend: &dyn Backend, scenarios: &[PathBuf], prefix: &str) -> RunMeta {
        RunMeta {
            run_id: self
                .run_id
                .clone()
                .unwrap_or_else(|| format!("{prefix}{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"))),
            started: chrono::Utc::now().to_rfc3339(),
            mlabench_version: env!("CARGO_PKG_VERSION").to_string(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            scenarios: scenarios.iter().map(|p| p.display().to_string()).collect(),
            backend: backend.info().backend.clone(),
            device: backend.info().clone(),
            check_rows: self.check_rows,
            reference_gflops: None,
            resumed: vec![],
            kernels: crate::provenance::stamp_kernels(&self.kernels_dir),
            ps1_schedule: self.ps1_schedule,
            v4_core: self.v4_core,
            handoff: self.handoff,
            planned: None,
            implementations: vec![],
        }
    }

    /// Why a run made under `old` cannot be continued by this one, if it
    /// cannot: its rows would not be one report. The resume key is every
    /// knob that changes what a row is.
    pub fn resume_conflict(old: &RunMeta, new: &RunMeta) -> Option<(String, String, String)> {
        let show_rows = |c: Option<usize>| c.map_or("all rows".to_string(), |n| format!("--check-rows {n}"));
        let pairs = [
            (
                "scenarios",
                old.scenarios.join(" "),
                new.scenarios.join(" "),
                same_files(&old.scenarios, &new.scenarios),
            ),
            (
                "backend",
                old.backend.clone(),
                new.backend.clone(),
                old.backend == new.backend,
            ),
            (
                "row sampling",
                show_rows(old.check_rows),
                show_rows(new.check_rows),
                old.check_rows == new.check_rows,
            ),
            (
                "ps1 schedule",
                format!("--ps1-schedule {}", old.ps1_schedule),
                format!("--ps1-schedule {}", new.ps1_schedule),
                old.ps1_schedule == new.ps1_schedule,
            ),
            (
                "V4 core",
                format!("--v4-core {}", old.v4_core),
                format!("--v4-core {}", new.v4_core),
                old.v4_core == new.v4_core,
            ),
            (
                "merge hand-off",
                format!("--handoff {}", old.handoff),
                format!("--handoff {}", new.handoff),
                old.handoff == new.handoff,
            ),
        ];
        if let Some((what, was, now, _)) = pairs.into_iter().find(|p| !p.3) {
            return Some((what.to_string(), was, now));
        }
        // A run stamped before stamps existed has none: nothing to hold it to.
        if let (Some(was), Some(now)) = (&old.kernels, &new.kernels) {
            if was.sha256 != now.sha256 {
                let show = |k: &crate::provenance::KernelsStamp| format!("sha256 {} ({})", k.short(), k.dir);
                return Some(("kernel sources".into(), show(was), show(now)));
            }
        }
        None
    }
}

fn default_repeats(backend: &str) -> usize {
    if backend == "cpu" {
        1
    } else {
        2
    }
}

/// A directory a flag will write into must take writes now, not fail at the end.
fn writable_dir(dir: &Path, flag: &str) -> Result<(), InputError> {
    let probe = dir.join(format!(".mlabench-write-test-{}", std::process::id()));
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b"ok"))
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| {
            InputError::Usage(format!(
                "{flag} {}: cannot write there ({e}); give a path in a directory you can write",
                dir.display()
            ))
        })
}

/// Whether two lists name the same scenario files, however the paths were
/// spelled (`./scenarios/x.toml` and `scenarios/x.toml` are one file).
fn same_files(a: &[String], b: &[String]) -> bool {
    let norm = |p: &String| std::fs::canonicalize(p).unwrap_or_else(|_| Path::new(p).components().collect::<PathBuf>());
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| norm(x) == norm(y))
}

/// `--target-noise`: percent, with or without `%`, or `off`.
fn parse_noise(s: &str) -> Result<Option<f64>, InputError> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    match t.trim_end_matches('%').trim().parse::<f64>() {
        Ok(p) if p.is_finite() && p > 0.0 && p < 100.0 => Ok(Some(p / 100.0)),
        _ => Err(InputError::Usage(format!(
            "--target-noise {s}: give a percentage above 0 and below 100 (0.5 or 0.5% is 0.5%), or off to stop on --min-samples and --min-time-ms alone"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn options(args: &[&str]) -> RunOptions {
        let mut argv = vec!["mlabench", "run"];
        argv.extend_from_slice(args);
        let crate::cli::Command::Run(a) = crate::cli::Cli::parse_from(argv).cmd else {
            panic!("a run")
        };
        RunOptions::from_run(&a).unwrap()
    }

    fn smoke_twins(o: &RunOptions) -> Vec<Case> {
        let sc = crate::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
        let mut cases = crate::scenario::expand(&sc).cases;
        o.add_device_twins(&mut cases).unwrap();
        cases
    }

    #[test]
    fn dcp_group_cases_past_the_visible_gpus_skip_and_an_explicit_count_past_them_is_refused() {
        let world = options(&["--dcp-devices", "world"]);
        let cases = smoke_twins(&world);
        let sizes: std::collections::BTreeSet<usize> = cases.iter().filter_map(|c| c.dcp_devices).collect();
        assert_eq!(sizes, [2, 4, 8].into_iter().collect());
        // Two GPUs: the W=2 twins run, the W=4 and W=8 ones skip, saying why.
        let skips = world.fit_groups(&cases, 2).unwrap();
        assert!(!skips.is_empty());
        for c in &cases {
            let skipped = skips.get(&c.key());
            assert_eq!(skipped.is_some(), c.dcp_devices.is_some_and(|n| n > 2), "{}", c.key());
            if let Some(why) = skipped {
                assert!(why.contains("and this machine has 2 GPUs"), "{why}");
            }
        }
        // One GPU holds none of them.
        let e = world.fit_groups(&cases, 1).unwrap_err().to_string();
        assert!(
            e.contains("needs a DCP group of 2 GPUs and this machine has 1 GPU"),
            "{e}"
        );
        // Asked for 8 by name on a 4-GPU machine: exit 2, not skips.
        let eight = options(&["--dcp-devices", "8"]);
        let cases = smoke_twins(&eight);
        let e = eight.fit_groups(&cases, 4).unwrap_err().to_string();
        assert!(
            e.starts_with("--dcp-devices 8: the run needs a DCP group of 8 GPUs"),
            "{e}"
        );
        assert!(eight.fit_groups(&cases, 8).unwrap().is_empty());
        assert!(eight.repro_flags("cuda").ends_with(" --dcp-devices 8"));
        let both = options(&["--dcp-devices", "8", "--dcp-reduce", "bf16,f32"]);
        let ids: Vec<String> = smoke_twins(&both)
            .into_iter()
            .filter(|c| c.dcp_devices.is_some())
            .map(|c| c.id)
            .collect();
        assert_eq!(
            ids.iter().filter(|i| i.contains("-g8-rs32@")).count() * 2,
            ids.len(),
            "{ids:?}"
        );
        assert!(both
            .repro_flags("cuda")
            .ends_with(" --dcp-devices 8 --dcp-reduce bf16,f32"));
    }
}
