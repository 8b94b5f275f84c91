//! The implementation protocol through the numpy worker (adapters/numpy):
//! every contract passes the same checks as the built-in kernels, the gate
//! holds a local-mask implementation to seed 000's rule, and every kind of
//! worker fault becomes an error row (or exit 2 before anything runs),
//! never a lost run or a silent pass. Needs python3 with numpy; skipped with
//! a message without them, unless MLABENCH_REQUIRE_PYTHON=1 (CI sets it).

mod common;

use assert_cmd::Command;
use common::{python_or_skip, root};
use std::path::{Path, PathBuf};

/// A declaration of the numpy worker for `contract` with extra worker args
/// and declaration lines, written into `dir`.
fn decl(dir: &Path, name: &str, contract: &str, args: &[&str], extra: &str) -> PathBuf {
    let worker = root().join("adapters/numpy/worker.py");
    let mut cmd = vec![
        format!("{:?}", "python3"),
        format!("{:?}", worker.display().to_string()),
    ];
    cmd.extend(args.iter().map(|a| format!("{a:?}")));
    let text = format!(
        "[impl]\nname = \"{name}\"\ncontract = \"{contract}\"\ncommand = [{}]\n{extra}\n",
        cmd.join(", ")
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn mla_caps(mask: &str) -> String {
    format!("[impl.caps]\npage_sizes = [1, 64]\ndtypes = [\"bf16\", \"fp8\"]\nmax_s_q = 8\nmask = \"{mask}\"\n")
}

struct Run {
    code: i32,
    stdout: String,
    rows: Vec<serde_json::Value>,
}

/// `mlabench run scenarios/smoke.toml --backend cpu` with the implementation,
/// only its rows, on a few cases (`cases`: --case filters).
fn run(impl_file: &Path, name: &str, cases: &[&str], extra: &[&str]) -> Run {
    let out = tempfile::tempdir().unwrap();
    let mut c = Command::cargo_bin("mlabench").unwrap();
    c.current_dir(root());
    c.args([
        "run",
        "scenarios/smoke.toml",
        "--backend",
        "cpu",
        "-q",
        "--no-timing",
        "--check-rows",
        "2",
    ]);
    c.arg("--impl")
        .arg(impl_file)
        .args(["--variant", name, "--run-id", "t", "--out"])
        .arg(out.path());
    for k in cases {
        c.arg(format!("--case={k}"));
    }
    c.args(extra);
    let o = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let rows = std::fs::read(out.path().join("t/rows.json"))
        .ok()
        .map(|b| {
            serde_json::from_slice::<serde_json::Value>(&b).unwrap()["rows"]
                .as_array()
                .unwrap()
                .clone()
        })
        .unwrap_or_default();
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout,
        rows,
    }
}

fn statuses(r: &Run) -> Vec<String> {
    r.rows
        .iter()
        .map(|x| x["status"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_contract_passes_through_the_numpy_worker() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for (name, contract, caps) in [
        ("np_mla", "mla_decode", mla_caps("global")),
        ("np_v4", "v4_decode", String::new()),
        ("np_combine", "dcp_combine", String::new()),
        ("np_merge", "split_merge", String::new()),
    ] {
        let f = decl(t.path(), name, contract, &[], &caps);
        let r = run(&f, name, &[], &[]);
        assert_eq!(r.code, 0, "{name}: {}", r.stdout);
        assert!(r.rows.len() >= 8, "{name}: {} rows", r.rows.len());
        assert!(statuses(&r).iter().all(|s| s == "pass"), "{name}: {:?}", statuses(&r));
        for row in &r.rows {
            assert_eq!(row["implementation"], name);
            assert!(row["impl_version"].as_str().unwrap().starts_with("numpy "), "{row}");
            assert!(!row["checks"].as_array().unwrap().is_empty());
        }
    }
}

#[test]
fn a_local_mask_is_gated_under_dcp_with_s_q_above_one_and_forcing_shows_the_bug() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let f = decl(
        t.path(),
        "np_local",
        "mla_decode",
        &["--mask", "local"],
        &mla_caps("local"),
    );
    // h8x2 and h8x8 at s_q 4: DCP worlds 2 and 8.
    let spec_dcp = ["-h8x2-s1-q4-", "-h8x8-s1-q4-"];
    let r = run(&f, "np_local", &spec_dcp, &[]);
    assert!(!r.rows.is_empty());
    for row in &r.rows {
        assert_eq!(row["status"], "skip", "{row}");
        let gate = row["gate"].as_str().unwrap();
        assert!(
            gate.contains("needs the causal mask on global positions") && gate.contains("np_local masks bottom-right"),
            "{gate}"
        );
    }
    let r = run(&f, "np_local", &spec_dcp, &["--force", "np_local"]);
    assert_eq!(r.code, 0, "xfail is not a failure: {}", r.stdout);
    assert!(statuses(&r).iter().all(|s| s == "xfail"), "{:?}", statuses(&r));
    // One query token, or no DCP: the local mask is right.
    let r = run(&f, "np_local", &["-h8x2-s1-q1-", "-h16x1-s1-q1-"], &[]);
    assert!(
        !r.rows.is_empty() && statuses(&r).iter().all(|s| s == "pass"),
        "{:?}",
        statuses(&r)
    );
}

#[test]
fn every_worker_fault_is_an_error_row_and_the_next_case_runs() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let cases = ["b3-cl1_17_65-h16x1", "b4-cl63_64_65_129-h16x1"];
    for (fault, words) in [
        ("crash", "exited"),
        ("hang", "no answer within 2 s"),
        ("garbage", "not a safetensors file"),
        ("short", "not a safetensors file"),
        ("wrong-shape", "has shape"),
        ("protocol", "protocol violation"),
        ("refuse", "refused"),
    ] {
        let name = format!("np_{}", fault.replace('-', "_"));
        let f = decl(
            t.path(),
            &name,
            "mla_decode",
            &["--fault", fault],
            &format!("timeout_s = 2\n{}", mla_caps("global")),
        );
        let r = run(&f, &name, &cases, &[]);
        assert_eq!(r.code, 1, "{fault}: a faulting worker fails the run: {}", r.stdout);
        // Every case got its row: a fault costs that case, not the run.
        assert!(r.rows.len() >= 4, "{fault}: {} rows", r.rows.len());
        for row in &r.rows {
            assert_eq!(row["status"], "error", "{fault}: {row}");
            let why = row["reason"].as_str().unwrap();
            assert!(why.contains(words), "{fault}: {why}");
            assert!(
                why.starts_with(&format!("{name}: `")),
                "{fault}: names the implementation and request: {why}"
            );
        }
        if fault == "crash" {
            let why = r.rows[0]["reason"].as_str().unwrap();
            assert!(why.contains("worker stderr") || why.contains("exited"), "{why}");
        }
    }
}

#[test]
fn a_library_that_cannot_run_a_case_gives_a_skip_with_its_reason() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let f = decl(
        t.path(),
        "np_unsup",
        "mla_decode",
        &["--fault", "unsupported"],
        &mla_caps("global"),
    );
    let r = run(&f, "np_unsup", &["b3-cl1_17_65-h16x1"], &[]);
    assert_eq!(r.code, 1, "nothing was checked: {}", r.stdout);
    assert!(!r.rows.is_empty());
    for row in &r.rows {
        assert_eq!(row["status"], "skip", "{row}");
        assert!(
            row["reason"].as_str().unwrap().contains("cannot run this case"),
            "{row}"
        );
    }
}

#[test]
fn bad_outputs_fail_the_check_rather_than_pass() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for fault in ["nan", "unwritten"] {
        let name = format!("np_{fault}");
        let f = decl(t.path(), &name, "mla_decode", &["--fault", fault], &mla_caps("global"));
        let r = run(&f, &name, &["b3-cl1_17_65-h16x1"], &[]);
        assert_eq!(r.code, 1, "{fault}: {}", r.stdout);
        assert!(
            !r.rows.is_empty() && statuses(&r).iter().all(|s| s == "fail"),
            "{fault}: {:?}",
            statuses(&r)
        );
    }
}

#[test]
fn a_worker_that_cannot_start_or_speaks_another_version_is_exit_2() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let f = decl(
        t.path(),
        "np_version",
        "mla_decode",
        &["--fault", "version"],
        &mla_caps("global"),
    );
    let r = run(&f, "np_version", &["b3-cl1_17_65-h16x1"], &[]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stdout.contains("speaks protocol 99, mlabench speaks 1"),
        "{}",
        r.stdout
    );
    let bad = t.path().join("nope.toml");
    std::fs::write(
        &bad,
        "[impl]\nname = \"nope\"\ncontract = \"mla_decode\"\ncommand = [\"/no/such/worker\"]\n",
    )
    .unwrap();
    let r = run(&bad, "nope", &["b3-cl1_17_65-h16x1"], &[]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stdout.contains("the worker did not start") && r.stdout.contains("impl.command"),
        "{}",
        r.stdout
    );
    let wrong = decl(t.path(), "np_wrong", "v4_decode", &["--fault", "refuse"], "");
    std::fs::write(
        &wrong,
        std::fs::read_to_string(&wrong)
            .unwrap()
            .replace("v4_decode", "mla_decoder"),
    )
    .unwrap();
    let r = run(&wrong, "np_wrong", &[], &[]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stdout.contains("key `impl.contract`: unknown contract `mla_decoder`"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_run_cut_by_a_crashing_worker_resumes_with_a_fixed_one() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let go = |fault: Option<&str>, resume: bool| {
        let args: Vec<&str> = fault.map_or(vec![], |f| vec!["--fault", f]);
        let f = decl(t.path(), "np_r", "mla_decode", &args, &mla_caps("global"));
        let mut c = Command::cargo_bin("mlabench").unwrap();
        c.current_dir(root());
        c.args([
            "run",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "-q",
            "--no-timing",
            "--check-rows",
            "2",
        ]);
        c.arg("--impl").arg(&f).args(["--variant", "np_r", "--case", "h16x1"]);
        if resume {
            c.arg("--resume").arg(out.path().join("r"));
        } else {
            c.args(["--run-id", "r", "--out"]).arg(out.path());
        }
        c.output().unwrap()
    };
    let first = go(Some("crash"), false);
    assert_eq!(first.status.code(), Some(1));
    let again = go(None, true);
    let text = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("r/rows.json")).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["status"] == "pass"),
        "{rows:?}"
    );
}

#[test]
fn a_timed_cpu_worker_reports_one_host_sample_that_is_never_judged() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let f = decl(t.path(), "np_t", "mla_decode", &[], &mla_caps("global"));
    let out = tempfile::tempdir().unwrap();
    let mut c = Command::cargo_bin("mlabench").unwrap();
    c.current_dir(root());
    c.args([
        "run",
        "scenarios/smoke.toml",
        "--backend",
        "cpu",
        "-q",
        "--check-rows",
        "2",
        "--case",
        "b3-cl1_17_65-h16x1",
    ]);
    c.arg("--impl").arg(&f).args(["--run-id", "t", "--out"]).arg(out.path());
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let csv = std::fs::read_to_string(out.path().join("t/rows.csv")).unwrap();
    let np: Vec<&str> = csv.lines().filter(|l| l.contains(",np_t,")).collect();
    assert!(!np.is_empty());
    assert!(np.iter().all(|l| l.contains(",cpu-wall,")), "{np:?}");
    let md = std::fs::read_to_string(out.path().join("t/summary.md")).unwrap();
    assert!(
        md.contains("## Peers"),
        "several implementations of one case: a peers table\n{md}"
    );
    assert!(out.path().join("t/peers.svg").is_file());
    let peers = md.split("## Peers").nth(1).unwrap().split("\n## ").next().unwrap();
    assert!(
        peers.contains("np_t") && !peers.contains("dcp_combine"),
        "a merge never competes with the decodes\n{peers}"
    );

    // `report` renders the files again from rows.json alone.
    let dir = out.path().join("t");
    for f in ["summary.md", "rows.csv", "peers.svg"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let mut c = Command::cargo_bin("mlabench").unwrap();
    c.current_dir(root()).arg("report").arg(&dir).arg("--impl").arg(&f);
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(dir.join("summary.md")).unwrap(), md);
    assert_eq!(std::fs::read_to_string(dir.join("rows.csv")).unwrap(), csv);
    assert!(dir.join("peers.svg").is_file());
}
