//! HIP backend (not implemented yet).
