//! Verdicts, without I/O: a run against a baseline, a kernel A/B over
//! alternated rounds, the split heuristic's regret, and the selftest's
//! planted bugs against a control.

pub mod baseline;
pub mod kernel_ab;
pub mod selftest;
pub mod split_regret;
