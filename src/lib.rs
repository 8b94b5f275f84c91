//! mlabench: validates and benchmarks MLA decode attention kernels.
//!
//! Data flows one way: scenario -> cases -> workload -> plans -> backend ->
//! reference -> metrics -> stats -> reports (see DESIGN.md).

pub mod app;
pub mod backend;
pub mod budget;
pub mod case;
pub mod cli;
pub mod dcp;
pub mod dcp_step;
pub mod error;
pub mod judge;
pub mod metrics;
pub mod provenance;
pub mod reference;
pub mod report;
pub mod result;
pub mod runner;
pub mod scenario;
pub mod serde_float;
pub mod stats;
pub mod tensor_ceiling;
pub mod variants;
pub mod workload;
