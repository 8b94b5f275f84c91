//! The helper scripts that need no GPU: `scripts/ncu-diff.py` on two small
//! raw-counter exports. Needs python3; skipped with a message without,
//! unless MLABENCH_REQUIRE_PYTHON=1 (CI sets it).

mod common;

use common::{python_or_skip, root};

fn ncu_diff(args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new("python3")
        .arg(root().join("scripts/ncu-diff.py"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn ncu_diff_shows_the_counters_that_differ_past_the_ratio() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    // `ncu --page raw --csv`: names, units, one row per launch (the first is read).
    let write = |name: &str, values: &str| {
        let p = t.path().join(name);
        std::fs::write(
            &p,
            format!(
                "\"Kernel Name\",\"lts__t_sectors.sum\",\"lrc__lts2lrc_sectors_op_read.sum\",\"dram__bytes.sum\"\n\
                 \"\",\"sector\",\"sector\",\"byte\"\n{values}\n\"ignored\",\"1\",\"1\",\"1\"\n"
            ),
        )
        .unwrap();
        p
    };
    let a = write("a.csv", "\"page64_fwd\",\"276,831,121\",\"90231090\",\"100\"");
    let b = write("b.csv", "\"splitkv_mla\",\"48389701\",\"35862122\",\"150\"");
    let o = ncu_diff(&[a.as_os_str(), b.as_os_str()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // 0.175x and 0.397x are past 2x either way; 1.5x is not; names are not counters.
    assert!(out.contains("lts__t_sectors.sum") && out.contains("0.175x"), "{out}");
    assert!(
        out.contains("lrc__lts2lrc_sectors_op_read.sum") && out.contains("0.397x"),
        "{out}"
    );
    assert!(
        !out.contains("dram__bytes.sum") && !out.contains("Kernel Name"),
        "{out}"
    );
    // --all with --match: every matching counter, whatever the ratio.
    let o = ncu_diff(&[
        a.as_os_str(),
        b.as_os_str(),
        "--match".as_ref(),
        "^dram".as_ref(),
        "--all".as_ref(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("dram__bytes.sum") && out.contains("1.5x"), "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[test]
fn ncu_diff_names_bad_input_with_exit_2() {
    if !python_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty.csv");
    std::fs::write(&empty, "\"a\"\n\"unit\"\n").unwrap();
    let missing = t.path().join("missing.csv");
    for (args, want) in [
        (vec![missing.as_os_str(), empty.as_os_str()], "cannot read"),
        (vec![empty.as_os_str(), empty.as_os_str()], "no data row"),
    ] {
        let o = ncu_diff(&args);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{err}");
    }
}
