use clap::Parser;
use std::process::ExitCode;

use mlabench::app;
use mlabench::cli::{Cli, Command};
use mlabench::error::{exit, InputError};

/// A run allocates and frees gigabytes per case (workloads, references,
/// downloads). glibc maps each large block fresh and unmaps it on free, so
/// every case pays the kernel's page faults and zeroing again, and the
/// unmaps stall the other stages' faults. mimalloc hands freed memory to
/// the next case instead (see `main` for how long it keeps it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's option index for the purge delay in mimalloc.h (v3), which
/// the crate does not export; Cargo.toml pins the version it was read from.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Host memory from which freed memory is never returned to the system.
/// Kept, it costs a sweep's peak several GB more (CPU mla-sweep of b128
/// cases: 16.3 GB kept against 10.1 GB returned after mimalloc's default
/// 1 s, 3% slower), which a machine this size has room for.
const KEEP_FREED_FROM: u64 = 64 << 30;

fn run() -> anyhow::Result<u8> {
    let cli = Cli::parse();
    match &cli.cmd {
        Command::Run(a) => app::run(a),
        Command::List(a) => app::list(a),
        Command::Plan(a) => app::plan(a),
        Command::Device(a) => app::device(a),
        Command::Kernels(a) => app::kernels(a),
        Command::Splits(a) => app::splits(a),
        Command::Compare(a) => app::compare(a),
        Command::Ab(a) => app::ab(a),
        Command::Report(a) => app::report(a),
        Command::Selftest(a) => app::selftest(a),
    }
}

fn main() -> ExitCode {
    if mlabench::app::memory::host_available().is_some_and(|b| b >= KEEP_FREED_FROM) {
        // SAFETY: sets a plain allocator option (no pointers); -1 means
        // freed memory stays mapped for reuse.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
    // `mlabench plan ... | head` should end quietly, not panic on a closed pipe.
    #[cfg(unix)]
    // SAFETY: restores the default SIGPIPE action before any other thread
    // exists. The one writer that must survive a closed pipe, a worker's
    // stdin, writes from a thread that blocks SIGPIPE (backend/worker.rs).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let kind = if e.downcast_ref::<InputError>().is_some() {
                "error"
            } else {
                "error (environment or internal)"
            };
            eprintln!("mlabench: {kind}: {e:#}");
            ExitCode::from(exit::BAD_INPUT)
        }
    }
}
