//! plan worklist
