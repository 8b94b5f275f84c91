//! `mlabench list`: the registry's variants and the scenarios on disk.

use anyhow::Result;
use std::path::PathBuf;

use crate::cli::ListArgs;
use crate::error::{exit, InputError};
use crate::scenario;
use crate::variants::REGISTRY;

pub fn list(args: &ListArgs) -> Result<u8> {
    println!("Variants:");
    for v in REGISTRY.iter().map(|u| u.info()) {
        println!(
            "  {:<12} {:<4} kernels/{:<15} {}",
            v.id.name(),
            format!("{:?}", v.family).to_lowercase(),
            v.kernel_file,
            v.contract
        );
        if let Some(why) = v.nondeterministic {
            println!("  {:<12} not bit-deterministic: {why}", "");
        }
    }
    println!("\nScenarios in {}:", args.scenarios_dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&args.scenarios_dir)
        .map_err(|e| {
            InputError::Usage(format!(
                "cannot read {}: {e}; pass --scenarios-dir",
                args.scenarios_dir.display()
            ))
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().map(|x| x == "toml").unwrap_or(false))
        .collect();
    files.sort();
    let w = files.iter().map(|f| f.display().to_string().len()).max().unwrap_or(0);
    for f in files {
        match scenario::load(&f) {
            Ok(sc) => {
                let ex = scenario::expand(&sc);
                println!("  {:<w$} {:>5} cases  {}", f.display(), ex.cases.len(), sc.description);
            }
            Err(e) => println!("  {:<w$} INVALID: {e}", f.display()),
        }
    }
    Ok(exit::OK)
}
