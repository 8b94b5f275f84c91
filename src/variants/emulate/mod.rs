//! The CPU emulation every variant runs its plan with: the same quantized
//! bytes a kernel reads, the same work items, splits and merges, in f32 on
//! the host. It checks the planners and merges without a GPU, and carries
//! the device state a kernel keeps between launches (hca_persist's counters).

pub mod attn;
mod fault;

pub use fault::Fault;

use super::DeviceCheck;
use crate::metrics::POISON_BITS;

/// One case's emulated device across its launches.
#[derive(Debug, Default)]
pub struct Emulation {
    /// A planted bug (`mlabench selftest --backend cpu`); `None` in real runs.
    pub fault: Option<Fault>,
    /// Checked launches so far (1 during the first).
    pub launch: usize,
    /// hca_persist's row counters (its workspace lives for the whole case).
    pub counters: Vec<usize>,
    /// Device facts each launch reported.
    pub checks: Vec<DeviceCheck>,
}

impl Emulation {
    pub fn new(fault: Option<Fault>) -> Emulation {
        Emulation {
            fault,
            ..Default::default()
        }
    }

    /// Whether `f` is the planted bug.
    pub fn has(&self, f: Fault) -> bool {
        self.fault == Some(f)
    }
}

/// `n` poisoned f32s: what an output holds before a kernel writes it.
pub fn poison(n: usize) -> Vec<f32> {
    vec![f32::from_bits(POISON_BITS); n]
}

/// Whether a checked row lies in `[a, b)` (`rows` sorted).
pub fn wanted(rows: &[usize], a: usize, b: usize) -> bool {
    let i = rows.partition_point(|&r| r < a);
    i < rows.len() && rows[i] < b
}
