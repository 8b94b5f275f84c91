use clap::Parser;
use std::process::ExitCode;

use mlabench::app;
use mlabench::cli::{Cli, Command};
use mlabench::error::{exit, InputError};

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
