//! f64 reference attention on the CPU.
