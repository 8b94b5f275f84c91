//! mlabench: validates and benchmarks MLA decode attention kernels.
//!
//! Data flows one way: scenario -> cases -> workload -> plans -> backend ->
//! reference -> metrics -> stats -> reports (see DESIGN.md).

pub mod ab;
pub mod app;
pub mod backend;
pub mod budget;
pub mod case;
pub mod cli;
pub mod compare;
pub mod error;
pub mod metrics;
pub mod plan;
pub mod provenance;
pub mod reference;
pub mod report;
pub mod result;
pub mod runner;
pub mod scenario;
pub mod selftest;
pub mod serde_float;
pub mod splits;
pub mod stats;
pub mod variants;
pub mod workload;
