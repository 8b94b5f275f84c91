//! Drives the binary: the smoke scenario end to end on the CPU backend, and a
//! catalogue of malformed scenarios that must exit 2 naming the key.

use assert_cmd::Command;
use std::path::Path;

fn bin() -> Command {
    let mut c = Command::cargo_bin("mlabench").unwrap();
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// `mlabench run scenarios/smoke.toml --backend cpu -q` and `extra`.
fn smoke_on_cpu(extra: &[&str]) -> Command {
    let mut c = bin();
    c.args(["run", "scenarios/smoke.toml", "--backend", "cpu", "-q"]);
    c.args(extra);
    c
}

/// How many (case, variant) rows the smoke scenario has.
fn smoke_case_count() -> usize {
    let sc = mlabench::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
    mlabench::scenario::expand(&sc).cases.len()
}

fn json_rows(dir: &Path) -> Vec<serde_json::Value> {
    let run = std::fs::read_dir(dir)
        .unwrap()
        .next()
        .expect("one run directory")
        .unwrap()
        .path();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("rows.json")).unwrap()).unwrap();
    v["rows"].as_array().unwrap().clone()
}

#[test]
fn smoke_passes_every_eligible_variant_and_shows_the_forced_page64_failure() {
    let out = tempfile::tempdir().unwrap();
    let assert = bin()
        .args(["run", "scenarios/smoke.toml", "--backend", "cpu", "--out"])
        .arg(out.path())
        .assert();
    let output = assert.get_output().clone();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows = json_rows(out.path());
    let variants: std::collections::BTreeSet<&str> = rows.iter().map(|r| r["variant"].as_str().unwrap()).collect();
    for v in ["ps1", "page64", "dcp_combine", "v4_split", "hca_persist", "split_merge"] {
        assert!(variants.contains(v), "smoke touches {v}");
    }
    let mut xfail = 0;
    for r in &rows {
        let status = r["status"].as_str().unwrap();
        let forced = r["forced"].as_bool().unwrap();
        let params = &r["params"];
        let dcp_sq = params["dcp_world"].as_str().map(|w| w != "1").unwrap_or(false)
            && params["s_q"].as_str().map(|q| q != "1").unwrap_or(false);
        if r["variant"] == "page64" && dcp_sq {
            assert!(forced, "page64 under DCP with s_q > 1 only runs when forced");
            assert_eq!(
                status, "xfail",
                "{}: must fail the reference: {}",
                r["case_id"], r["reason"]
            );
            assert!(
                r["gate"].as_str().unwrap().contains("g_kv_indptr"),
                "gate says why: {}",
                r["gate"]
            );
            xfail += 1;
        } else {
            assert_eq!(status, "pass", "{} {}: {}", r["case_id"], r["variant"], r["reason"]);
        }
        assert!(r["repro"]
            .as_str()
            .unwrap()
            .starts_with("mlabench run scenarios/smoke.toml --case "));
    }
    assert!(xfail >= 2, "the forced page64 DCP rows are there");
    assert!(stdout.contains("CPU timings"), "CPU timings are labelled:\n{stdout}");
}

#[test]
fn repro_command_reruns_one_case() {
    let out = tempfile::tempdir().unwrap();
    bin()
        .args([
            "run",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "--no-timing",
            "--case",
            "mla-b2-cl5_130-h8x2-s1-q4-fp8-p1",
            "--variant",
            "ps1",
            "--out",
        ])
        .arg(out.path())
        .assert()
        .code(0);
    let rows = json_rows(out.path());
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["status"], "pass");
    assert_eq!(rows[0]["params"]["dcp_world"], "2");
}

#[test]
fn list_and_plan_describe_variants_and_gates() {
    let o = bin().args(["list"]).assert().code(0).get_output().stdout.clone();
    let s = String::from_utf8_lossy(&o);
    for v in [
        "ps1",
        "page64",
        "dcp_combine",
        "v4_split",
        "hca_persist",
        "split_merge",
        "kimi-k3-dcp8.toml",
        "dsv4-pro.toml",
    ] {
        assert!(s.contains(v), "list shows {v}");
    }
    let o = bin()
        .args(["plan", "scenarios/kimi-k3-dcp8.toml"])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let s = String::from_utf8_lossy(&o);
    assert!(s.contains("h96"), "the draft's 64 heads pad to 96:\n{s}");
    assert!(s.contains("rejected"), "page64 is rejected under DCP with s_q > 1");
    assert!(s.contains("rank 7"), "shards of all 8 ranks are shown");
}

#[test]
fn unknown_case_filter_is_bad_input() {
    bin()
        .args(["run", "--backend", "cpu", "--case", "no-such-case"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("mlabench plan"));
}

#[test]
fn cuda_backend_without_a_gpu_is_an_environment_error() {
    let has_gpu = std::process::Command::new("nvidia-smi")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if has_gpu {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    bin()
        .args(["run", "--backend", "cuda", "--no-timing"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--backend cpu"));
}

const BASE_MLA: &str = "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\n";

/// (what is wrong, file text, text the error must contain)
const MALFORMED: &[(&str, &str, &str)] = &[
    ("unknown top-level key", "nmae = \"x\"\n[[mla]]\nbatch = 1\ncontext = 4\nheads_local = 16\nvariants = [\"ps1\"]\n", "nmae"),
    ("unknown block key", "[[mla]]\nbacth = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\n", "bacth"),
    ("wrong type", "[[mla]]\nbatch = \"2\"\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\n", "batch"),
    ("missing key", "[[mla]]\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\n", "batch"),
    ("page size", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\npage_size = 32\nvariants = [\"ps1\"]\n", "page_size"),
    ("pool", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\npool = \"sorted\"\nvariants = [\"ps1\"]\n", "pool"),
    ("dtype", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\ndtype = \"fp4\"\nvariants = [\"ps1\"]\n", "dtype"),
    ("unknown variant", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps2\"]\n", "variants"),
    ("wrong family", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"v4_split\"]\n", "v4_split"),
    ("force not run", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\nforce = [\"page64\"]\n", "force"),
    ("too many heads", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 64\ndcp_world = 4\nvariants = [\"ps1\"]\n", "heads_local"),
    ("zero context", "[[mla]]\nbatch = 2\ncontext = 0\nheads_local = 16\nvariants = [\"ps1\"]\n", "context"),
    ("bad random", "[[mla]]\nbatch = 2\ncontext = { random = { min = 9, max = 3 } }\nheads_local = 16\nvariants = [\"ps1\"]\n", "context.random"),
    ("zero batch", "[[mla]]\nbatch = 0\ncontext = 4\nheads_local = 16\nvariants = [\"ps1\"]\n", "batch"),
    ("looser tolerance", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\ntolerance = { bf16 = { cos_diff = 0.1 } }\n", "tolerance.bf16.cos_diff"),
    ("unknown tolerance key", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\ntolerance = { bf16 = { cosdiff = 1e-6 } }\n", "cosdiff"),
    ("target", "target = \"gfx942\"\n[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"ps1\"]\n", "target"),
    ("v4 heads", "[[v4]]\nlayer = \"hca\"\nrows = 4\nheads = 48\nposition = 100\nvariants = [\"v4_split\"]\n", "heads"),
    ("v4 layer", "[[v4]]\nlayer = \"mla\"\nrows = 4\nheads = 16\nposition = 100\nvariants = [\"v4_split\"]\n", "layer"),
    ("v4 splits", "[[v4]]\nlayer = \"hca\"\nrows = 4\nheads = 16\nposition = 100\nsplits = 17\nvariants = [\"v4_split\"]\n", "splits"),
    ("v4 position past max", "[[v4]]\nlayer = \"hca\"\nrows = 4\nheads = 16\nposition = 5000\nmax_model_len = 4096\nvariants = [\"v4_split\"]\n", "position"),
    ("no blocks", "name = \"empty\"\n", "[[mla]]"),
    ("dcp_devices count", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 8\ndcp_world = [2, 8]\nvariants = [\"ps1\"]\ndcp_devices = 3\n", "dcp_devices"),
    ("dcp_devices not dividing W", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 8\ndcp_world = [2, 8]\nvariants = [\"ps1\"]\ndcp_devices = 4\n", "W=2 is not a multiple of 4 GPUs"),
    ("dcp_reduce alone", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 8\ndcp_world = 2\nvariants = [\"ps1\"]\ndcp_reduce = \"f32\"\n", "add dcp_devices"),
    ("dcp_reduce type", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 8\ndcp_world = 2\nvariants = [\"ps1\"]\ndcp_devices = 2\ndcp_reduce = \"f16\"\n", "dcp_reduce"),
    ("dcp_devices world past 8", "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 1\ndcp_world = 16\nvariants = [\"ps1\"]\ndcp_devices = \"world\"\n", "dcp_devices"),
    ("toml syntax", "[[mla]\nbatch = 2\n", "bad.toml"),
];

#[test]
fn malformed_scenarios_exit_2_and_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    assert!(BASE_MLA.contains("ps1"));
    for (what, text, needle) in MALFORMED {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = bin()
            .args(["run", "--backend", "cpu", "--out"])
            .arg(dir.path().join("out"))
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: exit code; stderr: {err}");
        assert!(err.contains(needle), "{what}: message names `{needle}`: {err}");
        assert!(err.contains("bad.toml"), "{what}: message names the file: {err}");
    }
    let out = bin()
        .args(["run", "--backend", "cpu", "no/such/file.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/file.toml"));
}

#[test]
fn splits_rescores_the_committed_h200_timings_with_todays_heuristic() {
    let o = bin()
        .args([
            "splits",
            "scenarios/dsv4-pro.toml",
            "--from",
            "results/h200/dsv4-splits/splits.csv",
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let s = String::from_utf8_lossy(&o);
    // The claim in docs/v4-heuristic.md, from the committed table.
    assert!(
        s.contains("heuristic regret: max 28.8%, mean 3.1% over 28 workloads"),
        "{s}"
    );
}

#[test]
fn splits_on_the_cpu_writes_a_study_per_workload() {
    let out = tempfile::tempdir().unwrap();
    bin()
        .args([
            "splits",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "--case",
            "v4-hca-n16-t18-h128-pu0-3000-v1",
            "--min-samples",
            "1",
            "--min-time-ms",
            "0",
            "--run-id",
            "s",
            "--out",
        ])
        .arg(out.path())
        .assert()
        .code(0);
    let dir = out.path().join("s");
    let csv = std::fs::read_to_string(dir.join("splits.csv")).unwrap();
    // Header, n = 1..=16, the heuristic's pick and hca_persist.
    assert_eq!(csv.lines().count(), 1 + 16 + 2, "{csv}");
    assert!(csv.lines().any(|l| l.contains(",hca_persist,")));
    assert!(std::fs::read_to_string(dir.join("splits.svg"))
        .unwrap()
        .starts_with("<svg"));
    let rows = json_rows(out.path());
    assert_eq!(rows.len(), 17, "16 fixed plans and hca_persist, each checked");
    assert!(rows.iter().all(|r| r["status"] == "pass"));
}

#[test]
fn run_against_a_baseline_fails_on_a_slowdown_and_writes_compare_md() {
    let out = tempfile::tempdir().unwrap();
    let filter = ["--case", "mla-b3-cu8-200-h16x1-s1-q1-bf16"];
    bin()
        .args([
            "run",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "--run-id",
            "base",
            "--out",
        ])
        .arg(out.path())
        .args(filter)
        .assert()
        .code(0);
    let base = out.path().join("base");
    // Baselines made from the run's own rows with every time scaled, so the
    // verdicts do not depend on how loaded this machine is.
    let scaled = |factor: f64, name: &str| {
        let path = out.path().join(name);
        scaled_rows(&base, factor, &path);
        path
    };
    // Against a baseline 1000x slower than anything real: no regression.
    let slow = scaled(1000.0, "slow.csv");
    bin()
        .args([
            "run",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "--run-id",
            "same",
            "--out",
        ])
        .arg(out.path())
        .args(filter)
        .arg("--baseline")
        .arg(&slow)
        .assert()
        .code(0);
    let md = std::fs::read_to_string(out.path().join("same/compare.md")).unwrap();
    assert!(md.starts_with("## mlabench: no regression"), "{md}");

    // CPU wall-clock rows are one sample of the emulation: never judged,
    // however far apart.
    let fast = scaled(0.001, "fast.csv");
    let o = bin()
        .args(["compare"])
        .arg(&fast)
        .arg(&base)
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let s = String::from_utf8_lossy(&o);
    assert!(s.contains("cpu clock, not judged") && !s.contains("SLOWER"), "{s}");

    // The same rows as GPU timings: a baseline 1000x faster than anything
    // real makes every timed row slower.
    let gpu = |factor: f64, name: &str| {
        let path = out.path().join(name);
        scaled_rows(&base, factor, &path);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("cpu-wall", "cuda-events");
        std::fs::write(&path, text).unwrap();
        path
    };
    let o = bin()
        .args(["compare"])
        .arg(gpu(0.001, "fast-gpu.csv"))
        .arg(gpu(1.0, "base-gpu.csv"))
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let s = String::from_utf8_lossy(&o);
    assert!(s.contains("SLOWER") && s.contains("slower"), "{s}");

    // Bad input is exit 2, before anything runs.
    bin()
        .args([
            "run",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "--baseline",
            "no/such/run",
            "--out",
        ])
        .arg(out.path())
        .assert()
        .code(2)
        .stderr(predicates::str::contains("no/such/run"));
}

/// rows.csv of `run` with every time column multiplied by `factor`.
fn scaled_rows(run: &std::path::Path, factor: f64, to: &std::path::Path) {
    let csv = std::fs::read_to_string(run.join("rows.csv")).unwrap();
    let mut r = ::csv::Reader::from_reader(csv.as_bytes());
    let header = r.headers().unwrap().clone();
    let mut w = ::csv::Writer::from_writer(Vec::new());
    w.write_record(&header).unwrap();
    for rec in r.records() {
        let rec = rec.unwrap();
        let cells: Vec<String> = rec
            .iter()
            .zip(header.iter())
            .map(|(v, h)| match (h.ends_with("_ms"), v.parse::<f64>()) {
                (true, Ok(x)) => (x * factor).to_string(),
                _ => v.to_string(),
            })
            .collect();
        w.write_record(&cells).unwrap();
    }
    std::fs::write(to, w.into_inner().unwrap()).unwrap();
}

#[test]
fn ab_pools_rounds_and_judges_against_the_drift() {
    let out = tempfile::tempdir().unwrap();
    bin()
        .args(["run", "scenarios/smoke.toml", "--backend", "cpu", "-q", "--run-id", "r"])
        .args(["--case", "mla-b3-cu8-200-h16x1-s1-q1-bf16", "--out"])
        .arg(out.path())
        .assert()
        .code(0);
    let run = out.path().join("r");
    let p = |name: &str| out.path().join(name);
    // Control rounds drift 4%; the candidate is 2x faster in both rounds.
    for (name, f) in [("c1.csv", 1.0), ("c2.csv", 1.04), ("d1.csv", 0.5), ("d2.csv", 0.51)] {
        scaled_rows(&run, f, &p(name));
    }
    let ab = |ctl: [&str; 2], cand: [&str; 2]| {
        let mut c = bin();
        c.arg("ab");
        for (a, b) in ctl.iter().zip(cand) {
            c.arg("--control").arg(p(a)).arg("--candidate").arg(p(b));
        }
        c
    };
    let o = ab(["c1.csv", "c2.csv"], ["d1.csv", "d2.csv"])
        .arg("--markdown")
        .arg(p("ab.md"))
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let s = String::from_utf8_lossy(&o);
    assert!(s.contains("3 faster (geomean -50."), "{s}");
    assert!(s.contains("control drift up to 4.0%"), "{s}");
    let md = std::fs::read_to_string(p("ab.md")).unwrap();
    assert!(md.starts_with("## mlabench A/B: no regression"), "{md}");
    // The other way round every row is slower: exit 1.
    ab(["d1.csv", "d2.csv"], ["c1.csv", "c2.csv"])
        .assert()
        .code(1)
        .stdout(predicates::str::contains("SLOWER"));
    // A 3% change inside the control's 4% drift is no verdict.
    scaled_rows(&run, 1.03, &p("e.csv"));
    ab(["c1.csv", "c2.csv"], ["e.csv", "e.csv"])
        .assert()
        .code(0)
        .stdout(predicates::str::contains("3 same"));
    // A missing run is bad input.
    bin()
        .args(["ab", "--control", "no/such/run", "--candidate"])
        .arg(p("d1.csv"))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("no/such/run"));
}

#[test]
fn payload_ps1_schedule_passes_and_a_resume_holds_to_it() {
    let out = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut c = smoke_on_cpu(&["--variant", "ps1", "--no-timing"]);
        c.args(extra).arg("--out").arg(out.path());
        c
    };
    // The non-default schedule: the default (balanced) runs in every other test.
    run(&["--ps1-schedule", "payload", "--run-id", "p"]).assert().code(0);
    let rows = json_rows(out.path());
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["status"] == "pass"),
        "{rows:?}"
    );
    assert!(rows
        .iter()
        .all(|r| r["plan"].as_str().unwrap().contains("schedule=payload")));
    // A row's repro command runs it the same way.
    assert!(rows
        .iter()
        .all(|r| r["repro"].as_str().unwrap().contains("--ps1-schedule payload")));
    let md = std::fs::read_to_string(out.path().join("p/summary.md")).unwrap();
    assert!(md.contains("- ps1 schedule: payload"), "{md}");
    let dir = out.path().join("p");
    run(&["--resume", dir.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--ps1-schedule payload"));
}

#[test]
fn a_forced_v4_core_is_planned_recorded_repeated_and_held_by_a_resume() {
    let out = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut c = smoke_on_cpu(&["--variant", "v4_split", "--case", "h128", "--no-timing"]);
        c.args(extra).arg("--out").arg(out.path());
        c
    };
    run(&["--v4-core", "wg", "--run-id", "w"]).assert().code(0);
    let rows = json_rows(out.path());
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["status"] == "pass"),
        "{rows:?}"
    );
    // Every 128-head case runs the wgmma core, short splits included.
    assert!(
        rows.iter().all(|r| r["plan"].as_str().unwrap().contains("core=wg")),
        "{rows:?}"
    );
    assert!(rows
        .iter()
        .all(|r| r["repro"].as_str().unwrap().contains("--v4-core wg")));
    let md = std::fs::read_to_string(out.path().join("w/summary.md")).unwrap();
    assert!(md.contains("- V4 core: wg"), "{md}");
    let dir = out.path().join("w");
    run(&["--resume", dir.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--v4-core wg"));
    // An unknown core is bad input.
    run(&["--v4-core", "tensor"]).assert().code(2);
    // Left to the plan, most of these short splits take the mma core, so the
    // rows above saw the option; `plan` takes it too.
    let plan = |extra: &[&str]| {
        let o = bin()
            .args(["plan", "scenarios/smoke.toml", "--case", "h128"])
            .args(extra)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    assert!(plan(&[]).contains("(Heuristic) core=mma"));
    let forced = plan(&["--v4-core", "wg"]);
    assert!(
        forced.contains("core=wg: forced (--v4-core wg)") && !forced.contains("core=mma"),
        "{forced}"
    );
}

#[test]
fn stream_handoff_is_recorded_repeated_and_held_by_a_resume() {
    let out = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut c = smoke_on_cpu(&["--variant", "page64", "--no-timing", "--case", "b2"]);
        c.args(extra).arg("--out").arg(out.path());
        c
    };
    run(&["--handoff", "stream", "--run-id", "s"]).assert().code(0);
    let rows = json_rows(out.path());
    assert!(!rows.is_empty());
    assert!(rows
        .iter()
        .all(|r| r["repro"].as_str().unwrap().contains("--handoff stream")));
    let md = std::fs::read_to_string(out.path().join("s/summary.md")).unwrap();
    assert!(md.contains("- merge hand-off: stream"), "{md}");
    // the default (pdl) is another way of launching: a resume must not mix them
    let dir = out.path().join("s");
    run(&["--resume", dir.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--handoff stream"));
    run(&["--handoff", "sideways"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("pdl"));
}

#[test]
fn resume_finishes_a_cut_run_without_repeating_rows() {
    let out = tempfile::tempdir().unwrap();
    let cmd = smoke_on_cpu;
    // A run cut short: only one block of cases made it.
    cmd(&["--run-id", "cut", "--case", "mla-b3"])
        .arg("--out")
        .arg(out.path())
        .assert()
        .code(0);
    let dir = out.path().join("cut");
    let dir_s = dir.to_str().unwrap();
    cmd(&["--resume", dir_s]).assert().code(0);
    let rows = json_rows(out.path());
    let keys: std::collections::BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["case_id"].as_str().unwrap().into(),
                r["variant"].as_str().unwrap().into(),
            )
        })
        .collect();
    let whole = smoke_case_count();
    assert_eq!(rows.len(), whole, "the whole smoke scenario");
    assert_eq!(keys.len(), whole, "no row twice");
    // Another scenario or another sampling cannot continue it.
    bin()
        .args([
            "run",
            "scenarios/kimi-k3-dcp8.toml",
            "--backend",
            "cpu",
            "--resume",
            dir_s,
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("resume with the same scenarios"));
    cmd(&["--resume", dir_s, "--check-rows", "2"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("row sampling"));
}

#[test]
fn runs_stamp_their_kernel_sources_and_resume_holds_to_them() {
    let out = tempfile::tempdir().unwrap();
    let kernels = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(kernels.path().join("common")).unwrap();
    std::fs::write(kernels.path().join("ps1.cu"), "// v1").unwrap();
    std::fs::write(kernels.path().join("common/core.cuh"), "// core").unwrap();
    let cmd = |extra: &[&str]| {
        let mut c = smoke_on_cpu(&["--case", "mla-b3", "--variant", "ps1"]);
        c.arg("--kernels-dir").arg(kernels.path());
        c.args(extra);
        c
    };
    cmd(&["--run-id", "cut"]).arg("--out").arg(out.path()).assert().code(0);
    let dir = out.path().join("cut");
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("(2 CUDA sources), sha256 `"), "{summary}");
    // A run compared with itself: same sources, nothing changed.
    bin()
        .arg("compare")
        .arg(&dir)
        .arg(&dir)
        .assert()
        .code(0)
        .stdout(predicates::str::contains("kernels: the same sources in both runs"));
    // Edited sources cannot continue the run.
    std::fs::write(kernels.path().join("ps1.cu"), "// v2").unwrap();
    cmd(&["--resume", dir.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("kernel sources"));
}

#[test]
fn kernel_ab_script_compares_a_host_option_with_one_kernels_dir() {
    let out = tempfile::tempdir().unwrap();
    let ab = out.path().join("ab");
    let o = std::process::Command::new("bash")
        .arg("scripts/kernel-ab.sh")
        .arg(&ab)
        .args(["scenarios/smoke.toml", "1", "kernels", "kernels", "--"])
        .args([
            "--case",
            "mla-b3",
            "--variant",
            "ps1",
            "--min-samples",
            "3",
            "--min-time-ms",
            "0",
        ])
        .env("BIN", env!("CARGO_BIN_EXE_mlabench"))
        .env("BACKEND", "cpu")
        .env("CAND_ARGS", "--ps1-schedule payload")
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // 1 only if CPU timings call the candidate slower; both sides ran either way.
    assert!(matches!(o.status.code(), Some(0) | Some(1)), "{log}");
    assert!(log.contains("c1-r1 (kernels --ps1-schedule payload): exit"), "{log}");
    let schedule = |id: &str| {
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ab.join(id).join("rows.json")).unwrap()).unwrap();
        j["meta"]["ps1_schedule"].as_str().unwrap().to_string()
    };
    assert_eq!(schedule("c0-r1"), "balanced");
    assert_eq!(schedule("c1-r1"), "payload");
    assert!(ab.join("ab-c1.md").exists(), "{log}");
}

/// The Jenkins/Surefire JUnit schema (`junit-10.xsd`, shipped in pytest's
/// source distribution; `.ci/run` fetches it) and Python's `xmlschema`.
/// Without them the test says so and passes, unless
/// MLABENCH_REQUIRE_JUNIT_SCHEMA=1 (CI), where their absence fails it.
fn junit_schema() -> Option<std::path::PathBuf> {
    let required = std::env::var("MLABENCH_REQUIRE_JUNIT_SCHEMA").is_ok_and(|v| v == "1");
    let xsd = std::env::var_os("MLABENCH_JUNIT_XSD").map(std::path::PathBuf::from);
    let have_lib = std::process::Command::new("python3")
        .args(["-c", "import xmlschema"])
        .status()
        .is_ok_and(|s| s.success());
    match xsd {
        Some(p) if p.is_file() && have_lib => Some(p),
        _ if required => panic!(
            "MLABENCH_REQUIRE_JUNIT_SCHEMA=1 but MLABENCH_JUNIT_XSD ({:?}) or python3's xmlschema is missing",
            std::env::var_os("MLABENCH_JUNIT_XSD")
        ),
        _ => {
            eprintln!("junit schema check not run: set MLABENCH_JUNIT_XSD to junit-10.xsd and pip install xmlschema");
            None
        }
    }
}

#[test]
fn junit_output_validates_against_the_junit_schema() {
    let out = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let xml = files.path().join("junit.xml");
    // The forced page64 rows fail as the gate predicts; a bad --kernels-dir
    // would be refused, so plant a failure through the tolerance instead.
    let scen = files.path().join("tight.toml");
    std::fs::write(
        &scen,
        "[[mla]]\nbatch = 2\ncontext = [17, 65]\nheads_local = 16\ndtype = \"bf16\"\nvariants = [\"ps1\", \"page64\"]\n\
         tolerance = { bf16 = { cos_diff = 1e-30 } }\n",
    )
    .unwrap();
    let assert = bin()
        .args(["run", "--backend", "cpu", "-q", "--out"])
        .arg(out.path())
        .arg("--junit")
        .arg(&xml)
        .arg(&scen)
        .arg("scenarios/smoke.toml")
        .assert();
    assert_eq!(assert.get_output().status.code(), Some(1), "the tightened block fails");
    let text = std::fs::read_to_string(&xml).unwrap();
    assert!(text.contains("<failure type=\"cos_diff\""), "{text}");
    assert!(text.contains("<skipped type=\"xfail\""), "{text}");
    assert!(text.contains("repro: mlabench run"), "{text}");
    let rows = json_rows(out.path());
    assert_eq!(text.matches("<testcase ").count(), rows.len());
    let Some(xsd) = junit_schema() else { return };
    let check = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, xmlschema; xmlschema.XMLSchema(sys.argv[1]).validate(sys.argv[2])",
        ])
        .arg(&xsd)
        .arg(&xml)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "junit.xml does not validate against {}:\n{}",
        xsd.display(),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `mlabench run` on a scenario written to a temp dir.
fn run_scenario(text: &str, extra: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(&path, text).unwrap();
    let out = bin()
        .arg("run")
        .arg(&path)
        .args(["--backend", "cpu", "-q", "--no-timing", "--out"])
        .arg(dir.path().join("results"))
        .args(extra)
        .output()
        .unwrap();
    (out, dir)
}

#[test]
fn zero_counts_are_bad_input_not_a_pass() {
    for (flag, value) in [("--check-rows", "0"), ("--min-samples", "0"), ("--repeat-checks", "0")] {
        let a = smoke_on_cpu(&[flag, value]).assert().code(2);
        let err = String::from_utf8_lossy(&a.get_output().stderr).to_string();
        assert!(err.contains(flag), "{flag}: {err}");
    }
}

#[test]
fn a_kernels_dir_without_the_kernels_is_bad_input_on_every_backend() {
    let empty = tempfile::tempdir().unwrap();
    smoke_on_cpu(&["--kernels-dir", "no/such/dir"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("no such directory"));
    smoke_on_cpu(&["--kernels-dir", empty.path().to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("ps1.cu"));
}

#[test]
fn outputs_that_cannot_be_written_are_refused_before_the_run() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under = file.join("dumps");
    smoke_on_cpu(&["--dump", under.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--dump"));
    smoke_on_cpu(&["--junit", file.join("j.xml").to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--junit"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
}

#[test]
fn absurd_sizes_are_bad_input_with_the_size_named() {
    let block = |batch: &str, context: &str| {
        format!("[[mla]]\nbatch = {batch}\ncontext = {context}\nheads_local = 16\nvariants = [\"ps1\"]\n")
    };
    for (text, says) in [
        (block("100000000", "1"), "batch"),
        (block("1", "1099511627776"), "i32"),
        (block("1", "1e9"), "context"),
        (
            "[[v4]]\nlayer = \"hca\"\nrows = 4\npad_rows = 4000000000\nheads = 128\nposition = 10\nvariants = [\"v4_split\"]\n"
                .to_string(),
            "pad_rows",
        ),
    ] {
        let (out, _d) = run_scenario(&text, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}\n{err}");
        assert!(err.contains(says), "{text}: {err}");
        assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{err}");
    }
}

#[test]
fn a_case_too_big_for_the_memory_is_skipped_saying_what_fits() {
    // 32 x 256k tokens: fine on a big GPU host, not under a 1 GiB budget.
    let text = "[[mla]]\nbatch = [1, 32]\ncontext = 262144\nheads_local = 16\nvariants = [\"ps1\"]\n";
    let (out, dir) = run_scenario(text, &["--max-memory", "4G", "--check-rows", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = json_rows(&dir.path().join("results"));
    let big = rows.iter().find(|r| r["params"]["batch"] == "32").unwrap();
    assert_eq!(big["status"], "skip");
    let why = big["reason"].as_str().unwrap();
    assert!(why.contains("host memory") && why.contains("batch <="), "{why}");
    let small = rows.iter().find(|r| r["params"]["batch"] == "1").unwrap();
    assert_eq!(small["status"], "pass");
    // Nothing fits: bad input before anything runs.
    let (out, _d) = run_scenario(text, &["--max-memory", "1M"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no case fits"));
}

#[test]
fn cases_that_differ_in_any_setting_never_share_an_id_or_inputs() {
    let block = |extra: &str| {
        format!("[[mla]]\nbatch = 2\ncontext = {{ list = [33, 70] }}\nheads_local = 16\nvariants = [\"ps1\"]\n{extra}")
    };
    let text = format!("{}\n{}", block(""), block("sm_scale = 0.5\n"));
    let (out, dir) = run_scenario(&text, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = json_rows(&dir.path().join("results"));
    assert_eq!(rows.len(), 2);
    assert_ne!(rows[0]["case_id"], rows[1]["case_id"]);
    let cos = |r: &serde_json::Value| r["checks"][0]["metrics"]["cos_diff"].as_f64().unwrap();
    assert_ne!(cos(&rows[0]), cos(&rows[1]), "each block computes on its own inputs");
    // The same block under two seeds, in two files of one run.
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a.toml"), t.path().join("b.toml"));
    std::fs::write(&a, format!("seed = 1\n{}", block(""))).unwrap();
    std::fs::write(&b, format!("seed = 2\n{}", block(""))).unwrap();
    bin()
        .arg("run")
        .arg(&a)
        .arg(&b)
        .args(["--backend", "cpu", "-q", "--no-timing", "--out"])
        .arg(t.path().join("r"))
        .assert()
        .code(0);
    let rows = json_rows(&t.path().join("r"));
    assert_eq!(rows.len(), 2);
    assert_ne!(rows[0]["case_id"], rows[1]["case_id"]);
    assert_ne!(rows[0]["params"]["seed"], rows[1]["params"]["seed"]);
    assert_ne!(cos(&rows[0]), cos(&rows[1]));
    // The same file twice is one case, run once.
    let o = bin()
        .arg("run")
        .arg(&a)
        .arg(&a)
        .args(["--backend", "cpu", "--no-timing", "--out"])
        .arg(t.path().join("twice"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(json_rows(&t.path().join("twice")).len(), 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("more than once"));
}

#[test]
fn a_repro_command_reruns_exactly_its_row() {
    let out = tempfile::tempdir().unwrap();
    smoke_on_cpu(&["--no-timing", "--variant", "v4_split", "--out"])
        .arg(out.path())
        .assert()
        .code(0);
    let rows = json_rows(out.path());
    // An "auto" row whose id is a prefix of its fixed-split siblings'.
    let auto = rows
        .iter()
        .find(|r| {
            let id = r["case_id"].as_str().unwrap();
            let shape = id.split('@').next().unwrap();
            rows.iter().any(|o| {
                let other = o["case_id"].as_str().unwrap();
                other != id && other.starts_with(shape)
            })
        })
        .expect("a v4_split row with fixed-split siblings");
    let repro = auto["repro"].as_str().unwrap();
    let args: Vec<&str> = repro.split_whitespace().skip(1).collect();
    let again = tempfile::tempdir().unwrap();
    bin()
        .args(&args)
        .args(["-q", "--no-timing", "--out"])
        .arg(again.path())
        .assert()
        .code(0);
    let rerun = json_rows(again.path());
    assert_eq!(rerun.len(), 1, "{repro} reran {} rows", rerun.len());
    assert_eq!(rerun[0]["case_id"], auto["case_id"]);
}

#[test]
fn a_run_cut_short_says_so_and_cannot_be_judged_as_complete() {
    let out = tempfile::tempdir().unwrap();
    smoke_on_cpu(&["--no-timing", "--case", "mla-b3", "--run-id", "full", "--out"])
        .arg(out.path())
        .assert()
        .code(0);
    let full = out.path().join("full");
    let text = std::fs::read_to_string(full.join("rows.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["completeness"], "complete");
    // The run as a kill after its first two rows leaves it: every file as of then.
    let planned = doc["meta"]["planned"].as_u64().unwrap();
    doc["rows"].as_array_mut().unwrap().truncate(2);
    doc["completeness"] = format!("incomplete: 2 of {planned} cases").into();
    let cut = out.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    std::fs::write(cut.join("rows.json"), serde_json::to_string(&doc).unwrap()).unwrap();
    let csv = std::fs::read_to_string(full.join("rows.csv")).unwrap();
    std::fs::write(
        cut.join("rows.csv"),
        csv.lines().take(3).collect::<Vec<_>>().join("\n") + "\n",
    )
    .unwrap();
    bin()
        .arg("compare")
        .arg(&full)
        .arg(&cut)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(format!("incomplete: 2 of {planned} cases")));
    bin()
        .arg("compare")
        .arg(&full)
        .arg(&cut)
        .arg("--allow-incomplete")
        .assert()
        .code(0);
    // --resume finishes it, and then it is complete.
    smoke_on_cpu(&["--no-timing", "--case", "mla-b3", "--resume", cut.to_str().unwrap()])
        .assert()
        .code(0);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(cut.join("rows.json")).unwrap()).unwrap();
    assert_eq!(v["completeness"], "complete");
    assert_eq!(v["rows"].as_array().unwrap().len() as u64, planned);
    let summary = std::fs::read_to_string(cut.join("summary.md")).unwrap();
    assert!(summary.contains("(complete)"), "{summary}");
}

#[test]
fn a_killed_run_reads_incomplete_on_disk() {
    let out = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mlabench"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "run",
            "scenarios/mla-sweep.toml",
            "--backend",
            "cpu",
            "-q",
            "--no-timing",
            "--check-rows",
            "1",
            "--out",
        ])
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once rows.json exists (it is written before the first case).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let json = loop {
        let found = std::fs::read_dir(out.path())
            .ok()
            .and_then(|mut d| d.next())
            .map(|e| e.unwrap().path().join("rows.json"))
            .filter(|p| p.is_file());
        if let Some(p) = found {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "no rows.json appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let c = v["completeness"].as_str().unwrap();
    assert!(c.starts_with("incomplete: ") && c.ends_with(" of 2360 cases"), "{c}");
    let summary = std::fs::read_to_string(json.with_file_name("summary.md")).unwrap();
    assert!(summary.contains("This run is incomplete"), "{summary}");
}

#[test]
fn no_row_checked_is_a_failure_that_says_so() {
    // Every case needs more than a 1 MiB budget... but one must fit, so
    // skip by the gate instead: page64 at page size 1 cannot run.
    let text = "[[mla]]\nbatch = 2\ncontext = 40\nheads_local = 16\npage_size = 1\nvariants = [\"page64\"]\n";
    let (out, _d) = run_scenario(text, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no row was checked"));
}

#[test]
fn selftest_on_the_cpu_catches_every_planted_fault() {
    let out = tempfile::tempdir().unwrap();
    let o = bin()
        .args(["selftest", "--backend", "cpu", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("planted bugs caught"), "{stdout}");
    assert!(!stdout.contains("**NO**") && !stdout.contains("BROKEN"), "{stdout}");
    for class in ["empty partials", "race", "split boundary", "lse only", "replay"] {
        assert!(stdout.contains(class), "{class}: {stdout}");
    }
}

#[test]
fn the_pipeline_gives_the_rows_of_one_case_at_a_time_in_the_same_order() {
    let strip = |rows: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        rows.into_iter()
            .map(|mut r| {
                // Timing and throughput differ run to run; everything else must not.
                for k in ["latency", "gbps", "tflops", "frac_bw", "frac_tc"] {
                    r.as_object_mut().unwrap().remove(k);
                }
                r
            })
            .collect()
    };
    let mut got = Vec::new();
    // Sequential; the pipeline at this machine's cores; and as on a machine
    // of 12 cores (three builders, three checkers side by side).
    for (extra, threads) in [(&["--no-pipeline"][..], None), (&[][..], None), (&[][..], Some("12"))] {
        let out = tempfile::tempdir().unwrap();
        let mut cmd = smoke_on_cpu(&["--check-rows", "3", "--out"]);
        cmd.arg(out.path()).args(extra);
        if let Some(n) = threads {
            cmd.env("RAYON_NUM_THREADS", n);
        }
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        got.push(strip(json_rows(out.path())));
    }
    assert_eq!(got[0].len(), smoke_case_count());
    assert_eq!(got[0], got[1]);
    assert_eq!(got[0], got[2]);
}

/// `mlabench run` of the smoke scenario with `args` after it; its stderr
/// and exit code.
fn smoke_run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = tempfile::tempdir().unwrap();
    let mut c = bin();
    c.args(["run", "scenarios/smoke.toml", "-q", "--no-timing", "--out"])
        .arg(out.path())
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn dcp_devices_arguments_that_cannot_work_exit_2_naming_the_fix() {
    let (code, err) = smoke_run(&["--dcp-devices", "3"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--dcp-devices `3`: give 1, 2, 4 or 8 GPUs"), "{err}");
    // The W=2 cases only: 4 GPUs divide none of them.
    let (code, err) = smoke_run(&["--dcp-devices", "4", "--case", "x2-"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no case can run on those GPUs") && err.contains("W=2 is not a multiple of 4 GPUs"),
        "{err}"
    );
}

#[test]
fn dcp_devices_without_nccl_is_an_environment_error_naming_the_install() {
    // Checked before the driver, so it holds on a machine without a GPU too.
    let (code, err) = smoke_run(
        &["--dcp-devices", "1", "--backend", "cuda"],
        &[("MLABENCH_NCCL_LIB", "/nonexistent/libnccl.so.2")],
    );
    assert_eq!(code, Some(2), "{err}");
    for needle in [
        "libnccl (NCCL) could not be loaded",
        "/nonexistent/libnccl.so.2",
        "pip install nvidia-nccl-cu13",
    ] {
        assert!(err.contains(needle), "names {needle}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn plan_shows_which_gpu_holds_which_rank_of_a_dcp_group() {
    let o = bin()
        .args(["plan", "scenarios/kimi-k3-dcp8-multi.toml", "--case", "h12x4-s1-q4"])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let s = String::from_utf8_lossy(&o);
    assert!(s.contains("-p1-g4"), "the twin of each case runs on W GPUs:\n{s}");
    assert!(
        s.contains("DCP group on 4 GPUs (GPU 0: r0, GPU 1: r1, GPU 2: r2, GPU 3: r3)"),
        "{s}"
    );
}

#[test]
fn dcp_devices_finds_the_nccl_wheel_and_goes_on_to_the_driver() {
    let has_gpu = std::process::Command::new("nvidia-smi")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if has_gpu {
        eprintln!("skipped: this machine has a GPU, so the run would go on");
        return;
    }
    let (code, err) = smoke_run(&["--dcp-devices", "1", "--backend", "cuda"], &[]);
    assert_eq!(code, Some(2), "{err}");
    if err.contains("libnccl (NCCL) could not be loaded") {
        // CI installs nvidia-nccl-cu13 and says it must be found.
        assert!(std::env::var_os("MLABENCH_REQUIRE_NCCL").is_none(), "{err}");
        eprintln!("skipped: no NCCL on this machine ({err})");
        return;
    }
    // NCCL loaded, every symbol resolved: the next missing piece is the driver.
    assert!(err.contains("a DCP group: libcuda.so"), "{err}");
}

#[test]
fn dcp_devices_on_the_cpu_checks_the_steps_modelled_merge_for_each_reduce_type() {
    let out = tempfile::tempdir().unwrap();
    bin()
        .args(["run", "scenarios/smoke.toml", "--backend", "cpu", "-q", "--no-timing"])
        .args([
            "--dcp-devices",
            "2",
            "--dcp-reduce",
            "bf16,f32",
            "--case",
            "x2-s1-q1-bf16",
            "--out",
        ])
        .arg(out.path())
        .assert()
        .code(0);
    let rows = json_rows(out.path());
    let cos = |id_part: &str| -> f64 {
        let r = rows
            .iter()
            .find(|r| r["variant"] == "ps1" && r["case_id"].as_str().unwrap().contains(id_part))
            .unwrap_or_else(|| panic!("a ps1 row {id_part}"));
        assert_eq!(r["status"], "pass", "{r}");
        let c = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["tensor"] == "o.dcp")
            .expect("o.dcp checked");
        c["metrics"]["cos_diff"].as_f64().unwrap()
    };
    let (bf16, f32) = (cos("-p1-g2@"), cos("-p1-g2-rs32@"));
    // One bf16 hop more than the f32 path's one rounding, both within 1e-5.
    assert!(f32 < bf16 && bf16 < 1e-5, "bf16 {bf16} f32 {f32}");
    // ps1, page64 and dcp_combine emulated; ps1 and page64 twice on 2 GPUs.
    let twins = rows.iter().filter(|r| !r["params"]["dcp_devices"].is_null()).count();
    assert_eq!((rows.len(), twins), (7, 4));
}
