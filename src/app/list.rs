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
    super::declare_impls(&args.impls)?;
    println!("\nImplementations (--impl FILE, or an [[impl]] table in a scenario):");
    let mut shipped: Vec<PathBuf> = std::fs::read_dir(&args.adapters_dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|d| d.is_dir())
                .flat_map(|d| {
                    std::fs::read_dir(d)
                        .into_iter()
                        .flatten()
                        .filter_map(|e| e.ok().map(|e| e.path()))
                })
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect()
        })
        .unwrap_or_default();
    shipped.sort();
    for f in &shipped {
        match crate::variants::external::decl::load(f) {
            Ok(d) => print_impl(&d, &f.display().to_string()),
            Err(e) => println!("  {:<12} INVALID: {e}", f.display()),
        }
    }
    for e in crate::variants::external::declared() {
        if !shipped.iter().any(|f| f.display().to_string() == e.decl.source) {
            print_impl(&e.decl, &e.decl.source);
        }
    }
    if shipped.is_empty() && crate::variants::external::declared().is_empty() {
        println!("  (none; {} has no */*.toml declarations)", args.adapters_dir.display());
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

fn print_impl(d: &crate::variants::external::ImplDecl, source: &str) {
    use crate::variants::external::Contract;
    let c = &d.caps;
    let heads = c.heads.as_ref().map_or("any".to_string(), |h| format!("{h:?}"));
    let caps = match d.contract {
        Contract::MlaDecode => {
            let dtypes: Vec<String> = c.dtypes.iter().map(|t| t.to_string()).collect();
            format!(
                "pages {:?}, {}, heads {heads}, s_q <= {}, {} mask",
                c.page_sizes,
                dtypes.join("/"),
                c.max_s_q,
                format!("{:?}", c.mask).to_lowercase()
            )
        }
        Contract::V4Decode => format!(
            "heads {heads}{}{}",
            if c.splits { ", takes the split plan" } else { "" },
            if c.lse { "" } else { ", returns no lse" }
        ),
        Contract::DcpCombine | Contract::SplitMerge => "the contract's inputs".to_string(),
    };
    println!("  {:<13} {:<11} {caps}; {source}", d.name, d.contract.name());
    println!("  {:<13} worker: {}", "", d.command.join(" "));
}
