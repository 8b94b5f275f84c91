//! `mlabench selftest`: plants each bug of the catalog alone, runs the rows
//! that must catch it in a child `mlabench run`, and judges them against a
//! control run without it. A child process per run: a planted kernel may
//! fault and take its CUDA context down, which must not end the selftest.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli::{BackendChoice, Cli, SelftestArgs};
use crate::error::{exit, InputError};
use crate::judge::selftest::{self, Bug, Caught, Form};
use crate::report;
use crate::result::{Row, Status};

/// One bug's outcome.
struct Outcome<'a> {
    bug: &'a Bug,
    caught: Caught,
    /// Why the bug could not be judged (patch did not apply, did not compile).
    broken: Option<String>,
}

pub fn selftest(args: &SelftestArgs) -> Result<u8> {
    let text = std::fs::read_to_string(&args.bugs).map_err(|e| InputError::Scenario {
        file: args.bugs.display().to_string(),
        msg: format!("cannot read the bug catalog: {e}"),
    })?;
    let catalog = selftest::parse(&text).map_err(|msg| InputError::Scenario {
        file: args.bugs.display().to_string(),
        msg,
    })?;
    if let Some(n) = args.only.iter().find(|n| !catalog.bugs.iter().any(|b| &b.name == *n)) {
        let names: Vec<&str> = catalog.bugs.iter().map(|b| b.name.as_str()).collect();
        return Err(InputError::Usage(format!("--bug {n}: no such bug; the catalog has {}", names.join(", "))).into());
    }
    if args.min_rows == 0 {
        return Err(InputError::Usage("--min-rows 0 would call every bug caught; give at least 1".into()).into());
    }
    let chosen: Vec<&Bug> = catalog
        .bugs
        .iter()
        .filter(|b| args.only.is_empty() || args.only.contains(&b.name))
        .collect();
    if args.compile_only {
        return compile_only(args, &chosen);
    }
    let work = unique_dir(&args.out, "selftest")?;
    let form = match args.backend {
        BackendChoice::Cpu => Form::Cpu,
        BackendChoice::Cuda => Form::Gpu,
        BackendChoice::Auto if gpu_present(&args.kernels_dir) => Form::Gpu,
        BackendChoice::Auto => {
            println!("notice: no usable GPU; planting the CPU form of each bug (faults in the emulation)");
            Form::Cpu
        }
    };
    let bugs: Vec<&Bug> = chosen.into_iter().filter(|b| b.has(form)).collect();
    if bugs.is_empty() {
        return Err(InputError::Usage(format!("no chosen bug has a {form:?} form in {}", args.bugs.display())).into());
    }
    let child = Child {
        exe: std::env::current_exe().context("locating the mlabench binary")?,
        backend: if form == Form::Gpu { "cuda" } else { "cpu" },
        kernels_dir: args.kernels_dir.clone(),
        runs: work.join("runs"),
    };
    // The control: every run once with nothing planted; it must pass, or a
    // caught row would prove nothing.
    let mut control: BTreeMap<&[String], Vec<Row>> = BTreeMap::new();
    for (k, run) in bugs.iter().flat_map(|b| &b.runs).enumerate() {
        if control.contains_key(run.as_slice()) {
            continue;
        }
        let rows = child
            .run(run, &[], &format!("control-{k}"))
            .map_err(|e| InputError::Environment(format!("the control run `{}` failed to run: {e}", run.join(" "))))?;
        let bad: Vec<String> = rows
            .iter()
            .filter(|r| matches!(r.status, Status::Fail | Status::Error))
            .map(|r| format!("{}/{}: {}", r.case_id, r.variant, r.reason))
            .collect();
        if !bad.is_empty() {
            println!(
                "the control run `{}` fails without any planted bug, so nothing can be judged:\n  {}",
                run.join(" "),
                bad.join("\n  ")
            );
            return Ok(exit::CHECK_FAILED);
        }
        control.insert(run, rows);
    }
    let mut outcomes = Vec::new();
    for bug in &bugs {
        println!("planting {} ...", bug.name);
        outcomes.push(plant(bug, form, &child, &control, &args.out));
    }
    let md = render(&outcomes, form, args.min_rows);
    println!("\n{md}");
    std::fs::write(work.join("selftest.md"), &md).with_context(|| format!("writing {}", work.display()))?;
    let json: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "bug": o.bug.name, "class": o.bug.class, "form": form,
                "caught_rows": o.caught.rows, "of": o.caught.of, "by": o.caught.by,
                "broken": o.broken,
            })
        })
        .collect();
    std::fs::write(work.join("selftest.json"), serde_json::to_string_pretty(&json)?)?;
    println!("results: {}", work.display());
    let escaped = outcomes
        .iter()
        .any(|o| o.broken.is_some() || o.caught.rows < args.min_rows);
    Ok(if escaped { exit::CHECK_FAILED } else { exit::OK })
}

/// Plants one bug and runs its rows.
fn plant<'a>(
    bug: &'a Bug,
    form: Form,
    child: &Child,
    control: &BTreeMap<&[String], Vec<Row>>,
    out_root: &Path,
) -> Outcome<'a> {
    let mut out = Outcome {
        bug,
        caught: Caught::default(),
        broken: None,
    };
    let extra: Vec<String> = match form {
        Form::Gpu => match planted_copy(&child.kernels_dir, bug, &planted_dir(out_root, bug)) {
            Ok(dir) => vec!["--kernels-dir".into(), dir.display().to_string()],
            Err(e) => {
                out.broken = Some(e);
                return out;
            }
        },
        Form::Cpu => vec!["--cpu-fault".into(), bug.cpu_fault.clone().unwrap_or_default()],
    };
    for (k, run) in bug.runs.iter().enumerate() {
        match child.run(run, &extra, &format!("{}-{k}", bug.name)) {
            Ok(rows) => {
                if let Some(r) = rows.iter().find(|r| r.reason.contains("NVRTC failed")) {
                    out.broken = Some(format!("the planted kernel does not compile: {}", r.reason));
                    return out;
                }
                let c = selftest::judge(&control[run.as_slice()], &rows);
                out.caught.rows += c.rows;
                out.caught.of += c.of;
                for (m, n) in c.by {
                    *out.caught.by.entry(m).or_insert(0) += n;
                }
            }
            Err(e) => {
                out.broken = Some(e);
                return out;
            }
        }
    }
    out
}

/// How child runs are made.
struct Child {
    exe: PathBuf,
    backend: &'static str,
    kernels_dir: PathBuf,
    runs: PathBuf,
}

impl Child {
    /// `mlabench run ARGS`, checked twice per case (a race shows as a bit
    /// difference), untimed; its rows. Exit 0 and 1 are verdicts; 2 is not.
    fn run(&self, args: &[String], extra: &[String], id: &str) -> Result<Vec<Row>, String> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("run")
            .args(args)
            .args(["--backend", self.backend, "--no-timing", "-q", "--repeat-checks", "2"])
            .arg("--out")
            .arg(&self.runs)
            .args(["--run-id", id]);
        if !extra.iter().any(|a| a == "--kernels-dir") {
            cmd.arg("--kernels-dir").arg(&self.kernels_dir);
        }
        cmd.args(extra);
        let o = cmd
            .output()
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))?;
        let dir = self.runs.join(id);
        let rows_json = dir.join("rows.json");
        if !matches!(o.status.code(), Some(0 | 1)) || !rows_json.is_file() {
            let err = String::from_utf8_lossy(&o.stderr);
            let tail: Vec<&str> = err.lines().rev().take(6).collect();
            return Err(format!(
                "`mlabench run {}` ended with {} : {}",
                args.join(" "),
                o.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
        let text = std::fs::read_to_string(&rows_json).map_err(|e| format!("{}: {e}", rows_json.display()))?;
        report::json::parse(&text)
            .map(|(_, rows)| rows)
            .map_err(|e| format!("{}: {e}", rows_json.display()))
    }
}

/// Where a bug's planted kernels go: the same path every time, so kernels
/// compiled by `--compile-only` with a cache are found there again.
fn planted_dir(out: &Path, bug: &Bug) -> PathBuf {
    out.join("planted").join(&bug.name)
}

/// A fresh copy of the kernels dir with the bug's patches applied.
fn planted_copy(kernels: &Path, bug: &Bug, to: &Path) -> Result<PathBuf, String> {
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| format!("clearing {}: {e}", to.display()))?;
    }
    copy_tree(kernels, to).map_err(|e| format!("copying {} to {}: {e}", kernels.display(), to.display()))?;
    for p in &bug.patch {
        let path = to.join(&p.file);
        let src = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let out = selftest::apply(&src, p)?;
        std::fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(to.to_path_buf())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// `--compile-only`: every patch applies and every kernel configuration the
/// bug's runs launch compiles with NVRTC (no GPU needed; CI runs it). With
/// a kernel cache set, the planted kernels land in it, ready for a GPU
/// machine without NVRTC time to spare.
fn compile_only(args: &SelftestArgs, bugs: &[&Bug]) -> Result<u8> {
    let arch = args.arch.clone().unwrap_or_else(|| "sm_90a".into());
    let mut failed = 0;
    for bug in bugs.iter().filter(|b| b.has(Form::Gpu)) {
        let dir = match planted_copy(&args.kernels_dir, bug, &planted_dir(&args.out, bug)) {
            Ok(d) => d,
            Err(e) => {
                failed += 1;
                println!("FAIL  {}: {e}", bug.name);
                continue;
            }
        };
        let mut specs = Vec::new();
        for run in &bug.runs {
            for s in run_specs(run)? {
                if !specs.contains(&s) {
                    specs.push(s);
                }
            }
        }
        let results = crate::backend::cuda::check_all(&dir, &specs, &arch)
            .map_err(|e| InputError::Environment(format!("{e}")))?;
        let bad: Vec<String> = results
            .iter()
            .filter_map(|(s, r)| r.as_ref().err().map(|e| format!("{}: {e}", s.label())))
            .collect();
        if bad.is_empty() {
            println!("ok    {} ({} configurations)", bug.name, results.len());
        } else {
            failed += 1;
            println!("FAIL  {}\n{}", bug.name, bad.join("\n"));
        }
    }
    println!("{failed} planted bugs failed to apply or compile for {arch}");
    Ok(if failed > 0 { exit::CHECK_FAILED } else { exit::OK })
}

/// The kernel configurations the cases of `mlabench run ARGS` launch.
fn run_specs(run: &[String]) -> Result<Vec<crate::variants::KernelSpec>, InputError> {
    use clap::Parser;
    let argv = ["mlabench", "run"]
        .into_iter()
        .map(String::from)
        .chain(run.iter().cloned());
    let cli =
        Cli::try_parse_from(argv).map_err(|e| InputError::Usage(format!("selftest run `{}`: {e}", run.join(" "))))?;
    let crate::cli::Command::Run(r) = cli.cmd else {
        unreachable!("parsed as run");
    };
    let variants = super::parse_variants(&r.variants, "--variant")?;
    let (cases, _) = super::resolve_cases(&r.scenarios, &r.cases, &variants, &[])?;
    let mut specs = Vec::new();
    for c in &cases {
        for s in c.variant.unit().kernels(c, &crate::variants::decide(c)) {
            if !specs.contains(&s) {
                specs.push(s);
            }
        }
    }
    Ok(specs)
}

fn gpu_present(kernels: &Path) -> bool {
    let opts = crate::backend::cuda::OpenOptions {
        measure_ceilings: false,
        ..Default::default()
    };
    crate::backend::cuda::CudaBackend::open_with(kernels, &opts).is_ok()
}

/// `root/<prefix>-<UTC stamp>`, made new.
fn unique_dir(root: &Path, prefix: &str) -> Result<PathBuf> {
    let base = format!("{prefix}-{}", chrono::Utc::now().format("%Y%m%d-%H%M%S"));
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    for n in 1..1000 {
        let p = root.join(if n == 1 { base.clone() } else { format!("{base}-{n}") });
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", p.display())),
        }
    }
    anyhow::bail!("no free selftest directory under {}", root.display())
}

/// The table: bug, class, caught, by how many rows, which metric tripped.
fn render(outcomes: &[Outcome], form: Form, min_rows: usize) -> String {
    let mut s = String::new();
    let form_words = match form {
        Form::Gpu => "kernel patches on the GPU",
        Form::Cpu => "faults in the CPU emulation",
    };
    let _ = writeln!(s, "## mlabench selftest ({form_words})\n");
    let _ = writeln!(
        s,
        "A bug is caught when at least {min_rows} rows that pass without it fail with it.\n"
    );
    let _ = writeln!(s, "| bug | class | caught | rows | tripped |");
    let _ = writeln!(s, "|---|---|---|---:|---|");
    for o in outcomes {
        let (word, rows, by) = match &o.broken {
            Some(why) => ("BROKEN".to_string(), "-".to_string(), why.replace('|', "\\|")),
            None => (
                if o.caught.rows >= min_rows { "yes" } else { "**NO**" }.to_string(),
                format!("{} of {}", o.caught.rows, o.caught.of),
                o.caught.metrics(),
            ),
        };
        let _ = writeln!(s, "| {} | {} | {word} | {rows} | {by} |", o.bug.name, o.bug.class);
    }
    let caught = outcomes
        .iter()
        .filter(|o| o.broken.is_none() && o.caught.rows >= min_rows)
        .count();
    let _ = writeln!(s, "\n**{caught} of {} planted bugs caught.**", outcomes.len());
    s
}
