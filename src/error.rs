//! Errors that end a run with exit code 2, with messages that name the fix.

use thiserror::Error;

/// Bad input or environment: the run cannot start or continue (exit 2).
#[derive(Debug, Error)]
pub enum InputError {
    /// A scenario file is malformed or asks for something impossible.
    #[error("{file}: {msg}")]
    Scenario { file: String, msg: String },
    /// A command-line combination that cannot work.
    #[error("{0}")]
    Usage(String),
    /// The machine lacks something the run needs (GPU, driver, NVRTC).
    #[error("{0}")]
    Environment(String),
}

/// Process exit codes (README documents them).
pub mod exit {
    pub const OK: u8 = 0;
    pub const CHECK_FAILED: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
}
