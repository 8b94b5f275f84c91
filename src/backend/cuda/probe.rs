//! The kernels of kernels/probe.cu, loaded once per backend.

use super::device::{CudaDevice, Kernel, LoadedModule};
use crate::backend::BackendError;
use crate::tensor_ceiling::MmaKind;
use crate::variants::KernelSpec;

pub const FILE: &str = "probe.cu";
pub const COPY: &str = "mlab_copy_u128";
pub const L2_FLUSH: &str = "mlab_l2_flush";
pub const EMPTY: &str = "mlab_empty";
pub const MMA: &str = "mlab_mma_bf16";
pub const WGMMA_BF16: &str = "mlab_wgmma_bf16";
pub const WGMMA_E4M3: &str = "mlab_wgmma_e4m3";
pub const GATHER: &str = "mlab_gather_rows";
pub const SPIN: &str = "mlab_spin";
/// Self-checks for the smoke example: dynamic shared memory opt-in, and a
/// kernel that faults on purpose.
pub const SMEM_SUM: &str = "mlab_smem_sum";
pub const TRAP: &str = "mlab_trap";

/// Whether the wgmma probes have a body on `arch`: they need sm_90a's
/// `__CUDA_ARCH_FEAT_SM90_ALL`, and are empty kernels elsewhere.
pub fn has_wgmma(arch: &str) -> bool {
    arch == "sm_90a"
}

/// The probe configuration (no defines).
pub fn spec() -> KernelSpec {
    KernelSpec::new(
        FILE,
        &[
            COPY, L2_FLUSH, EMPTY, MMA, WGMMA_BF16, WGMMA_E4M3, GATHER, SPIN, SMEM_SUM, TRAP,
        ],
    )
}

pub struct Probe {
    module: LoadedModule,
}

impl Probe {
    pub fn load(dev: &CudaDevice, cubin: &[u8]) -> Result<Self, BackendError> {
        Ok(Probe {
            module: dev.load_module(cubin, &spec())?,
        })
    }

    pub fn copy(&self) -> &Kernel {
        self.get(COPY)
    }
    pub fn l2_flush(&self) -> &Kernel {
        self.get(L2_FLUSH)
    }
    pub fn empty(&self) -> &Kernel {
        self.get(EMPTY)
    }
    /// The dense-rate probe of one tensor instruction.
    pub fn tensor(&self, kind: MmaKind) -> &Kernel {
        self.get(match kind {
            MmaKind::MmaSyncBf16 => MMA,
            MmaKind::WgmmaBf16 => WGMMA_BF16,
            MmaKind::WgmmaE4m3 => WGMMA_E4M3,
        })
    }
    pub fn gather(&self) -> &Kernel {
        self.get(GATHER)
    }
    pub fn spin(&self) -> &Kernel {
        self.get(SPIN)
    }

    pub fn smem_sum(&self) -> &Kernel {
        self.get(SMEM_SUM)
    }
    pub fn trap(&self) -> &Kernel {
        self.get(TRAP)
    }

    fn get(&self, name: &str) -> &Kernel {
        // load_module resolved every entry point of spec(), these included.
        self.module
            .kernel(name)
            .expect("probe entry points are resolved at load")
    }
}
