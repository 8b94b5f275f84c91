//! `mlabench kernels`: every kernel configuration the variants launch,
//! compiled with NVRTC when asked (no GPU needed). Exit 1 when any fails;
//! the NVRTC log is printed verbatim with the file name.

use anyhow::Result;

use crate::backend::cuda;
use crate::cli::KernelsArgs;
use crate::error::{exit, InputError};

pub fn kernels(args: &KernelsArgs) -> Result<u8> {
    let mut specs = crate::variants::all_kernels();
    specs.push(cuda::probe_spec());
    if args.resources {
        return resources(args, &specs);
    }
    if !args.check {
        for s in &specs {
            println!("{}", s.label());
        }
        println!(
            "{} configurations; add --check to compile them, --resources for their registers and spills",
            specs.len()
        );
        return Ok(exit::OK);
    }
    let arch = args.arch.as_deref().unwrap_or("sm_90a");
    let t0 = std::time::Instant::now();
    let results = match &args.cubins {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| InputError::Environment(format!("cannot create --cubins {}: {e}", dir.display())))?;
            cuda::dump_all(&args.kernels_dir, &specs, arch, dir)
        }
        None => cuda::check_all(&args.kernels_dir, &specs, arch),
    }
    .map_err(|e| InputError::Environment(format!("{e}")))?;
    let mut failed = 0;
    for (spec, r) in &results {
        match r {
            Ok(()) => println!("ok    {}", spec.label()),
            Err(e) => {
                failed += 1;
                println!("FAIL  {}\n{e}", spec.label());
            }
        }
    }
    println!(
        "{} of {} kernel configurations compiled for {arch} in {:.1} s",
        results.len() - failed,
        results.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(if failed > 0 { exit::CHECK_FAILED } else { exit::OK })
}

/// `--resources`: one line per entry point; a spill is flagged, since a
/// spilling decode kernel reads local memory in its inner loop, and so are
/// serialised wgmmas (each waits for the one before).
/// `arrive` counts the fences ptxas injected before wgmmas (C7519).
fn resources(args: &KernelsArgs, specs: &[crate::variants::KernelSpec]) -> Result<u8> {
    let arch = args.arch.as_deref().unwrap_or("sm_90a");
    let results =
        cuda::resources_all(&args.kernels_dir, specs, arch).map_err(|e| InputError::Environment(format!("{e}")))?;
    let mut failed = 0;
    let mut spilling = 0;
    let mut serialized = 0;
    println!(
        "{:<24} {:>5} {:>8} {:>8} {:>6} {:>7} {:>6}  configuration ({arch})",
        "entry", "regs", "spill-st", "spill-ld", "stack", "smem", "arrive"
    );
    for (spec, r) in &results {
        match r {
            Ok(entries) => {
                for e in entries {
                    let spills = e.spill_stores + e.spill_loads > 0;
                    spilling += usize::from(spills);
                    serialized += usize::from(e.wgmma_serialized.is_some());
                    println!(
                        "{:<24} {:>5} {:>8} {:>8} {:>6} {:>7} {:>6}  {}{}{}",
                        e.entry,
                        e.registers,
                        e.spill_stores,
                        e.spill_loads,
                        e.stack_bytes,
                        e.smem_bytes,
                        e.arrives_injected,
                        spec.label(),
                        if spills { "  SPILLS" } else { "" },
                        e.wgmma_serialized
                            .as_deref()
                            .map(|r| format!("  WGMMA SERIALIZED ({r})"))
                            .unwrap_or_default()
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!("FAIL  {}\n{e}", spec.label());
            }
        }
    }
    println!(
        "{} configurations, {} entry points spill, {} serialise their wgmmas; bytes are per thread (stack, spills) and per block (smem, static only)",
        results.len(),
        spilling,
        serialized
    );
    Ok(if failed > 0 { exit::CHECK_FAILED } else { exit::OK })
}
