//! TEMPORARY placeholder until the CUDA backend lands.
use std::path::Path;
pub struct CudaBackend;
impl CudaBackend {
    pub fn open(_k: &Path) -> anyhow::Result<CudaBackend> {
        anyhow::bail!("CUDA backend not built yet")
    }
}
impl super::Backend for CudaBackend {
    fn info(&self) -> &super::DeviceInfo {
        unreachable!()
    }
    fn run(&mut self, _r: &super::RunRequest) -> Result<super::RunOutput, super::BackendError> {
        unreachable!()
    }
}
