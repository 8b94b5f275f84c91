//! Helpers the integration tests that run python workers share.

use std::path::Path;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether python3 with numpy is there; without it the test skips with a
/// message, unless MLABENCH_REQUIRE_PYTHON=1 (CI sets it) makes that a failure.
pub fn python_or_skip() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var("MLABENCH_REQUIRE_PYTHON").as_deref() != Ok("1"),
            "MLABENCH_REQUIRE_PYTHON=1 but python3 with numpy is not usable"
        );
        eprintln!("skipping: python3 with numpy is not available");
    }
    ok
}
