//! The shipped adapters without their GPUs: FlashMLA's MODEL1 repack and the
//! aiter adapter's stand-in checks (numpy unit tests), and the aiter adapter
//! end to end through mlabench against its stand-in, for every contract it
//! implements. Needs python3 with numpy; skipped with a message without,
//! unless MLABENCH_REQUIRE_PYTHON=1 (CI sets it).

mod common;

use assert_cmd::Command;
use common::{python_or_skip, root};

#[test]
fn adapter_unit_tests_pass() {
    if !python_or_skip() {
        return;
    }
    for t in ["adapters/flashmla/test_model1.py", "adapters/aiter/test_standin.py"] {
        let o = std::process::Command::new("python3")
            .arg(root().join(t))
            .output()
            .unwrap();
        assert!(o.status.success(), "{t}:\n{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn the_aiter_adapter_passes_mlabench_checks_against_its_stand_in() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mut args = vec![];
    for (f, name) in [("impl", "aiter"), ("v4", "aiter_v4"), ("hca", "aiter_hca")] {
        let text = std::fs::read_to_string(root().join(format!("adapters/aiter/{f}.toml"))).unwrap();
        let text = text.replacen(
            "command = [",
            "env = { PYTHONPATH = \"adapters/aiter/standin\" }\ncommand = [",
            1,
        );
        let p = t.path().join(format!("{f}.toml"));
        std::fs::write(&p, text).unwrap();
        args.push("--impl".to_string());
        args.push(p.display().to_string());
        args.push("--variant".to_string());
        args.push(name.to_string());
    }
    let out = tempfile::tempdir().unwrap();
    let o = Command::cargo_bin("mlabench")
        .unwrap()
        .current_dir(root())
        .args([
            "run",
            "scenarios/smoke.toml",
            "--backend",
            "cpu",
            "-q",
            "--no-timing",
            "--check-rows",
            "2",
        ])
        .args(&args)
        .args(["--run-id", "a", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("a/rows.json")).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    for name in ["aiter", "aiter_v4", "aiter_hca"] {
        let passed = rows
            .iter()
            .filter(|r| r["variant"] == name && r["status"] == "pass")
            .count();
        assert!(passed >= 8, "{name}: {passed} rows passed");
    }
    // The persistent HCA kernel returns no LSE: it is checked on o alone.
    let hca = rows
        .iter()
        .find(|r| r["variant"] == "aiter_hca" && r["status"] == "pass")
        .unwrap();
    let tensors: Vec<&str> = hca["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tensor"].as_str().unwrap())
        .collect();
    assert!(
        tensors.contains(&"o") && !tensors.iter().any(|t| t.starts_with("lse")),
        "{tensors:?}"
    );
    // aiter's round-robin DCP takes interleave 1 only: S=2 cases are not run.
    let s2 = rows
        .iter()
        .find(|r| r["variant"] == "aiter" && r["case_id"].as_str().unwrap().contains("-s2-"))
        .unwrap();
    assert_eq!(s2["status"], "skip");
    assert!(s2["reason"].as_str().unwrap().contains("interleave"), "{s2}");
}
