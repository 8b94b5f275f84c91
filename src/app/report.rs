//! `mlabench report`: renders a run's files again from its rows.json, so a
//! run made by an older mlabench gets today's summary and peers table.

use anyhow::Result;
use std::io::IsTerminal;

use crate::cli::ReportArgs;
use crate::report::{self, RunDir};

pub fn report(args: &ReportArgs) -> Result<u8> {
    super::declare_impls(&args.impls)?;
    for path in &args.dirs {
        let mut dir = RunDir::reopen(path).map_err(|e| crate::error::InputError::Usage(format!("{e:#}")))?;
        let mut unknown = std::collections::BTreeSet::new();
        for r in dir.rows_mut().iter_mut().filter(|r| r.contract.is_empty()) {
            r.contract = report::peers::contract_of(r);
            if r.contract.is_empty() {
                unknown.insert(r.variant.clone());
            }
        }
        dir.finish(|_| ())?;
        let peers = super::write_peers(dir.path(), dir.rows())?;
        if !peers.is_empty() {
            println!("{}", report::peers::table(&peers, std::io::stdout().is_terminal()));
        }
        if !unknown.is_empty() {
            println!(
                "warning: rows of {} name no contract and no --impl declares them; pass their declarations to compare them with peers",
                unknown.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        println!("{}: {}", path.display(), report::table::summary_line(dir.rows()));
    }
    Ok(0)
}
