//! Plan types produced by the variants.
pub enum VariantPlan {}
