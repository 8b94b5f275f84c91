//! mlabench: validates and benchmarks MLA decode attention kernels.
//!
//! Data flows one way: scenario -> cases -> workload -> plans -> backend ->
//! reference -> metrics -> stats -> reports (see DESIGN.md).

pub mod backend;
pub mod case;
pub mod metrics;
pub mod plan;
pub mod reference;
pub mod report;
pub mod result;
pub mod stats;
pub mod variants;
pub mod workload;
