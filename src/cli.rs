//! Command-line surface (clap derive only).

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "mlabench",
    version,
    about = "Validate and benchmark MLA decode attention kernels against an f64 reference"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run scenarios: check every case against the reference and time it.
    Run(Box<RunArgs>),
    /// List the variants, their contracts, and the shipped scenarios.
    List(ListArgs),
    /// Show per case: shards, local lengths, padded heads, gate decisions, split plans, work lists.
    Plan(PlanArgs),
    /// Describe the GPU and measure its copy-bandwidth and tensor-core ceilings.
    Device(DeviceArgs),
    /// Compile kernels with NVRTC (no GPU needed with --check).
    Kernels(KernelsArgs),
    /// Time v4_split at every n in 1..=16, the heuristic's pick and hca_persist.
    Splits(Box<SplitsArgs>),
    /// Compare a run with a baseline: speed and check status per (case, variant); exit 1 on a regression.
    Compare(CompareArgs),
    /// A/B two kernel builds from runs alternated in one session: medians over
    /// the rounds, judged against each side's own drift; exit 1 on a regression.
    Ab(AbArgs),
    /// Render a run's summary.md, rows.csv and peers.svg again from its
    /// rows.json (after an upgrade, or to add the implementations' contracts).
    Report(ReportArgs),
    /// Test the harness's own checks: plant each bug of selftest/bugs.toml
    /// alone and show which rows catch it; exit 1 if any escapes.
    Selftest(SelftestArgs),
}

#[derive(Args, Debug)]
pub struct SelftestArgs {
    /// cuda: patch a copy of the kernels and run them on the GPU; cpu: plant
    /// the same mistakes in the CPU emulation; auto: cuda when a GPU is there.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// The catalog of planted bugs.
    #[arg(long, default_value = "selftest/bugs.toml")]
    pub bugs: PathBuf,
    /// Only this bug (repeatable).
    #[arg(long = "bug", value_name = "NAME")]
    pub only: Vec<String>,
    /// Rows that must catch a bug for it to count as caught.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub min_rows: usize,
    /// Root for the selftest's runs and table (selftest.md, selftest.json).
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// The kernels the bugs are planted into.
    #[arg(long, default_value = "kernels")]
    pub kernels_dir: PathBuf,
    /// Apply every patch and compile the kernels each bug's runs launch with
    /// NVRTC, and stop (no GPU needed).
    #[arg(long)]
    pub compile_only: bool,
    /// NVRTC target for --compile-only [default: sm_90a].
    #[arg(long)]
    pub arch: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// CUDA when a usable GPU is there, else the CPU (with a one-line notice).
    Auto,
    Cpu,
    Cuda,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub exec: Execution,
    /// Scenario files [default: scenarios/smoke.toml]
    pub scenarios: Vec<PathBuf>,
    /// Only cases whose id contains this text (repeatable; exact ids work too).
    #[arg(long = "case", value_name = "ID")]
    pub cases: Vec<String>,
    /// Only these variants (repeatable).
    #[arg(long = "variant", value_name = "NAME")]
    pub variants: Vec<String>,
    /// Run this variant even where its dispatch gate rejects it (repeatable);
    /// same as the scenario's `force` list.
    #[arg(long = "force", value_name = "NAME")]
    pub force: Vec<String>,
    /// Write each case's inputs, outputs and reference as .safetensors into DIR.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Check only; do not time.
    #[arg(long)]
    pub no_timing: bool,
    /// Let samples hit a warm L2 (default: cold, inputs rotated / L2 flushed).
    #[arg(long)]
    pub warm_l2: bool,
    /// Print only the final summary line.
    #[arg(long, short)]
    pub quiet: bool,
    /// Continue a run that was cut short (deadline, crash) in its directory:
    /// (case, variant) rows it has are kept, the rest (and errors) run.
    #[arg(long, value_name = "RUN_DIR", conflicts_with = "run_id")]
    pub resume: Option<PathBuf>,
    /// How ps1 work lists are cut: balanced (the default) or payload; the
    /// case ids stay the same, so `mlabench ab` can compare the two.
    #[arg(long, default_value = "balanced", value_parser = ps1_schedules())]
    pub ps1_schedule: String,
    /// Also run each DCP case's ranks on N GPUs (1, 2, 4 or 8, dividing W;
    /// `world`: one GPU per rank): Q all-gathered and the LSE combine done
    /// through NCCL, timed as a whole decode step. Each such case gets a
    /// `-g<N>` twin beside its one-GPU emulation.
    #[arg(long, value_name = "N|world")]
    pub dcp_devices: Option<String>,
    /// The element type(s) of that step's reduce-scatter of the outputs:
    /// bf16 (vLLM's cp_lse_ag_out_rs, the default), f32, or bf16,f32 for a
    /// twin of each.
    #[arg(long, value_name = "LIST", default_value = "bf16", requires = "dcp_devices")]
    pub dcp_reduce: String,
    /// Compare with this baseline (a run directory or its rows.csv) and exit 1
    /// on a regression; the comparison is also written to the run's compare.md.
    #[arg(long, value_name = "RUN")]
    pub baseline: Option<PathBuf>,
    /// Also write the rows as JUnit XML (one test case per case and variant).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// A bug planted in the CPU emulation (`mlabench selftest --backend cpu`
    /// uses it); needs --backend cpu.
    #[arg(long, value_name = "FAULT", hide = true)]
    pub cpu_fault: Option<String>,
    /// One case at a time on one thread: no building of the next case's
    /// inputs or checking of the last one's while the device runs (for
    /// debugging; the rows are the same).
    #[arg(long)]
    pub no_pipeline: bool,
    #[command(flatten)]
    pub regression: RegressionGate,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Run directories (each holds a rows.json).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Declarations of the external implementations in the runs, so rows
    /// made before rows named their contract get it (repeatable).
    #[arg(long = "impl", value_name = "FILE")]
    pub impls: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Baseline: a run directory or its rows.csv (e.g. results/h200/mla-bandwidth).
    pub baseline: PathBuf,
    /// Candidate: a run directory or its rows.csv.
    pub candidate: PathBuf,
    #[command(flatten)]
    pub regression: RegressionGate,
}

#[derive(Args, Debug)]
pub struct AbArgs {
    /// A control run (a run directory or its rows.csv); repeat it, one per round.
    #[arg(long = "control", value_name = "RUN", required = true)]
    pub control: Vec<PathBuf>,
    /// A candidate run; repeat it, one per round.
    #[arg(long = "candidate", value_name = "RUN", required = true)]
    pub candidate: Vec<PathBuf>,
    /// A time change counts past this many percent and past both sides'
    /// round-to-round drift.
    #[arg(long, default_value_t = 2.0, value_name = "PCT")]
    pub threshold: f64,
    /// Compare a control and a candidate timed with different clocks, such
    /// as eager runs against `--graph` runs (each side keeps one clock).
    #[arg(long)]
    pub mixed_clocks: bool,
    #[command(flatten)]
    pub view: CompareView,
}

/// When a comparison with a baseline fails.
#[derive(Args, Debug)]
pub struct RegressionGate {
    /// A time change counts past this many percent, and only outside the
    /// baseline's p10..p90.
    #[arg(long, default_value_t = 5.0, value_name = "PCT")]
    pub threshold: f64,
    /// Judge a candidate run that was cut short (its missing rows are listed
    /// as missing); without it an incomplete candidate is refused.
    #[arg(long)]
    pub allow_incomplete: bool,
    #[command(flatten)]
    pub view: CompareView,
}

/// What `compare`, `run --baseline` and `ab` compare and where it goes.
#[derive(Args, Debug)]
pub struct CompareView {
    /// Timed region to compare: variant (kernel + merge/reduce) or kernel.
    #[arg(long, default_value = "variant")]
    pub region: String,
    /// Also write the comparison as Markdown to FILE (a pull-request comment).
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Rows listed in the terminal table.
    #[arg(long, default_value_t = 40, value_name = "N")]
    pub show: usize,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Folder of scenarios to list.
    #[arg(long, default_value = "scenarios")]
    pub scenarios_dir: PathBuf,
    /// Folder of implementation adapters whose declarations to list.
    #[arg(long, default_value = "adapters")]
    pub adapters_dir: PathBuf,
    /// An implementation to run beside the built-in kernels: a declaration
    /// file (docs/protocol.md) whose name scenarios and --variant can use
    /// (repeatable).
    #[arg(long = "impl", value_name = "FILE")]
    pub impls: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    pub scenario: PathBuf,
    /// An implementation to run beside the built-in kernels: a declaration
    /// file (docs/protocol.md) whose name scenarios and --variant can use
    /// (repeatable).
    #[arg(long = "impl", value_name = "FILE")]
    pub impls: Vec<PathBuf>,

    /// Only cases whose id contains this text (repeatable).
    #[arg(long = "case", value_name = "ID")]
    pub cases: Vec<String>,
    /// Print every work item (default: a per-rank digest).
    #[arg(long)]
    pub items: bool,
    /// How ps1 work lists are cut: balanced (the default) or payload.
    #[arg(long, default_value = "balanced", value_parser = ps1_schedules())]
    pub ps1_schedule: String,
    /// The V4 kernels' core: auto, mma or wg (as `run --v4-core`).
    #[arg(long, default_value = "auto", value_parser = v4_cores())]
    pub v4_core: String,
}

#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// Skip the ceiling measurements.
    #[arg(long)]
    pub no_ceilings: bool,
    #[arg(long, default_value = "kernels")]
    pub kernels_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Compile every kernel configuration without a GPU; exit 1 on any error.
    #[arg(long)]
    pub check: bool,
    /// Compile every configuration and print ptxas's registers, spills,
    /// stack and static shared memory per entry point (no GPU needed).
    #[arg(long, conflicts_with = "check")]
    pub resources: bool,
    /// With --check: write each configuration's cubin to DIR
    /// (`file.cu_-DNAME=VALUE....cubin`), to compare two kernels dirs'
    /// SASS with scripts/sass-diff.py.
    #[arg(long, value_name = "DIR", requires = "check")]
    pub cubins: Option<PathBuf>,
    /// Target architecture [default: sm_90a].
    #[arg(long)]
    pub arch: Option<String>,
    #[arg(long, default_value = "kernels")]
    pub kernels_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct SplitsArgs {
    /// Scenario with [[v4]] blocks (the [[mla]] blocks are ignored).
    pub scenario: PathBuf,
    #[command(flatten)]
    pub exec: Execution,
    /// Only workloads whose id contains this text (repeatable).
    #[arg(long = "case", value_name = "ID")]
    pub cases: Vec<String>,
    /// Re-score a measured splits.csv with the current heuristic (no GPU,
    /// nothing is run): the regret of today's pick on that run's timings.
    #[arg(long, value_name = "CSV")]
    pub from: Option<PathBuf>,
}

/// What `run` and `splits` share: where to run, what to check, how to time,
/// where results go.
#[derive(Args, Debug)]
pub struct Execution {
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// An implementation to run beside the built-in kernels: a declaration
    /// file (docs/protocol.md) whose name scenarios and --variant can use
    /// (repeatable).
    #[arg(long = "impl", value_name = "FILE")]
    pub impls: Vec<PathBuf>,

    /// Check a seeded sample of N query rows per case instead of all of them.
    #[arg(long, value_name = "N")]
    pub check_rows: Option<usize>,
    /// Root for run outputs; each run writes <out>/<run-id>/.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Name of the run directory [default: UTC time stamp].
    #[arg(long)]
    pub run_id: Option<String>,
    /// Time CUDA-graph replays instead of individual launches.
    #[arg(long)]
    pub graph: bool,
    /// How ps1's reduce and page64's and v4_split's merges follow their
    /// forward: pdl (programmatic dependent launch: launched at the forward's
    /// start, they wait for it on the device) or stream (launched after it).
    #[arg(long, default_value = "pdl", value_parser = handoffs())]
    pub handoff: String,
    /// Untimed launches before the samples.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Fewest timed samples.
    #[arg(long, default_value_t = 10)]
    pub min_samples: usize,
    /// Keep sampling until this much time was measured (with
    /// `--target-noise off`, `--min-time-ms 50` is the rule of earlier
    /// versions).
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    pub min_time_ms: f64,
    /// Stop sampling a case once the median's 95% confidence interval is
    /// within this many percent either side (e.g. 0.5 or 0.5%); `off`: stop
    /// on the minimums alone.
    #[arg(long, default_value = "0.5", value_name = "PCT")]
    pub target_noise: String,
    /// Wall-clock limit on sampling one case; a case that reaches it before
    /// the target says `noise-capped` and the noise it reached.
    #[arg(long, alias = "max-time", default_value_t = 1000.0, value_name = "MS")]
    pub max_time_ms: f64,
    /// How samples are queued: auto (in batches, back to back; one at a
    /// time under 20 us, where back to back runs slower), batched, or serial
    /// (each read before the next is queued, as earlier versions did).
    #[arg(long, default_value = "auto", value_parser = samplings())]
    pub sampling: String,
    /// Checked launches per case; every one is checked, and a variant that is
    /// deterministic must give the same bits each time (a race shows up even
    /// when it stays within tolerance) [default: 2 on a GPU, 1 on the CPU].
    #[arg(long, value_name = "N")]
    pub repeat_checks: Option<usize>,
    /// Host memory one case may use (e.g. 16G, 512M); cases that need more are
    /// skipped, saying what would fit [default: the memory the machine has free].
    #[arg(long, value_name = "BYTES")]
    pub max_memory: Option<String>,
    /// Where the CUDA kernel sources live.
    #[arg(long, default_value = "kernels")]
    pub kernels_dir: PathBuf,
    /// The core of the V4 kernels (v4_split, hca_persist): auto (the plan's
    /// pick), or mma / wg forced on every case that can run it, so `mlabench
    /// ab` can compare the two on the same plans (the case ids stay the same).
    #[arg(long, default_value = "auto", value_parser = v4_cores())]
    pub v4_core: String,
}

/// `--v4-core`'s values; the names parse into `case::V4CoreChoice`.
fn v4_cores() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("auto").help("The plan's pick: the wgmma core for 64+ heads on whole rows and v4_split's splits of 256+ tokens (hca_persist: partitions of 1024+)"),
        PossibleValue::new("mma").help("The mma.sync core everywhere"),
        PossibleValue::new("wg").help("The wgmma core wherever a CTA has 64+ heads"),
    ])
}

/// `--ps1-schedule`'s values; the names parse into `case::Ps1Schedule`.
fn ps1_schedules() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("payload")
            .help("A fixed payload per CTA in sequence order (may overshoot it by a minimum chunk)"),
        PossibleValue::new("balanced")
            .help("Whole tile pairs, the smallest per-CTA load a fill in sequence order meets"),
    ])
}

/// `--sampling`'s values; the names parse into `backend::Sampling`.
fn samplings() -> PossibleValuesParser {
    PossibleValuesParser::new(["auto", "batched", "serial"])
}

/// `--handoff`'s values; the names parse into `backend::Handoff`.
fn handoffs() -> PossibleValuesParser {
    PossibleValuesParser::new([
        PossibleValue::new("pdl").help(
            "Programmatic dependent launch: the second kernel's blocks start during the forward and wait for its results on the device",
        ),
        PossibleValue::new("stream").help("Plain stream order: the second kernel launches after the forward"),
    ])
}
