//! A progress bar on stderr, so stdout stays clean for tables and pipes.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One bar over the run's cases; the current case id is its message.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// Hidden when `quiet` or when stderr is not a terminal. indicatif's
    /// stderr target already hides itself off a tty; saying so here keeps
    /// a redirected log free of bar frames whatever indicatif decides.
    pub fn new(total: u64, quiet: bool) -> Progress {
        Progress::with_visibility(total, !quiet && std::io::stderr().is_terminal())
    }

    fn with_visibility(total: u64, visible: bool) -> Progress {
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}")
            .expect("the template is valid")
            .progress_chars("=> ");
        bar.set_style(style);
        Progress { bar }
    }

    /// Names the case now running.
    pub fn start(&self, case_id: &str) {
        self.bar.set_message(case_id.to_string());
    }

    /// One case done.
    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// Prints a line on stderr above the bar without tearing it. Unlike
    /// `ProgressBar::println`, which drops lines while hidden, the line is
    /// printed either way: notices and warnings must reach a CI log.
    pub fn println(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }

    /// Removes the bar, leaving the lines printed above it.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden()
    }

    /// Cases done so far.
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// The case id shown.
    pub fn message(&self) -> String {
        self.bar.message()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_is_hidden_and_still_counts() {
        let p = Progress::new(3, true);
        assert!(p.is_hidden());
        p.start("mla-b4-sq2/ps1");
        p.inc();
        p.println("note: printed even while hidden");
        p.start("mla-b4-sq2/page64");
        p.inc();
        assert_eq!(p.position(), 2);
        assert_eq!(p.message(), "mla-b4-sq2/page64");
        p.finish();
    }

    #[test]
    fn hidden_follows_stderr_being_a_terminal() {
        let p = Progress::new(1, false);
        assert_eq!(p.is_hidden(), !std::io::stderr().is_terminal());
    }
}
