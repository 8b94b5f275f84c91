//! `mlabench ab`: pooled A/B of runs alternated in one session (no GPU).

use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::PathBuf;

use super::compare::{read_entries, read_meta};
use crate::error::{exit, InputError};
use crate::report;

pub fn ab(args: &crate::cli::AbArgs) -> Result<u8> {
    if !(args.threshold.is_finite() && args.threshold >= 0.0) {
        return Err(InputError::Usage(format!("--threshold {}: give a percentage >= 0", args.threshold)).into());
    }
    let read = |paths: &[PathBuf]| -> Result<Vec<_>, InputError> {
        paths.iter().map(|p| read_entries(p, &args.view.region)).collect()
    };
    let (control, candidate) = (read(&args.control)?, read(&args.candidate)?);
    let thr = args.threshold / 100.0;
    let rows = crate::judge::kernel_ab::ab(&control, &candidate, thr, args.mixed_clocks);
    let clocks = crate::judge::kernel_ab::clock_mismatch(&control, &candidate);
    if rows
        .iter()
        .all(|r| r.verdict == crate::judge::kernel_ab::AbVerdict::Incomplete)
    {
        let why = match (&clocks, args.mixed_clocks) {
            (Some((c, d)), false) => format!(
                "the control runs are timed with {c} and the candidate runs with {d}; pass --mixed-clocks to compare them anyway (e.g. eager launches against --graph replay)"
            ),
            _ => "no (case, variant) row is timed with one clock in every run; give runs of the same scenario and cases, timed".into(),
        };
        return Err(InputError::Usage(why).into());
    }
    println!(
        "{}",
        report::kernel_ab::table(&rows, std::io::stdout().is_terminal(), args.view.show)
    );
    println!("A/B: {}", report::kernel_ab::summary_line(&rows));
    let (ctl, cand) = (
        read_meta(&args.control[0]).unwrap_or_default(),
        read_meta(&args.candidate[0]).unwrap_or_default(),
    );
    let kernels = crate::provenance::compare_line(ctl.kernels.as_ref(), cand.kernels.as_ref());
    println!("{kernels}");
    if let Some(path) = &args.view.markdown {
        let names = |ps: &[PathBuf]| ps.iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
        // The commands show what else differed (a flag, a kernels dir), which
        // a pull-request comment's reader cannot see from the run names.
        let mut provenance = vec![kernels];
        if let (Some((c, d)), true) = (&clocks, args.mixed_clocks) {
            provenance.push(format!("clocks: control {c}, candidate {d} (--mixed-clocks)"));
        }
        for (side, meta) in [("control", &ctl), ("candidate", &cand)] {
            if let Some(cmd) = &meta.command {
                provenance.push(format!("{side}: `{}`", report::kernel_ab::essential_command(cmd)));
            }
        }
        let md = report::kernel_ab::markdown(
            &rows,
            &names(&args.control),
            &names(&args.candidate),
            thr,
            &args.view.region,
            &provenance,
        );
        std::fs::write(path, md).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if rows.iter().any(|r| r.verdict.is_regression()) {
        exit::CHECK_FAILED
    } else {
        exit::OK
    })
}
