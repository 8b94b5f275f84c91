//! CUDA backend: only the device. The cudarc driver wrapper, NVRTC compile
//! and cache, event and graph timing, measured ceilings, and the one
//! sequence that runs any variant's programs (exec.rs).

mod cache;
pub mod ceilings;
pub mod compile;
pub mod dcp_group;
pub mod device;
pub mod error;
mod exec;
mod libs;
pub mod nccl;
pub mod probe;
pub mod ptxas;
pub mod report;
pub mod timing;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use crate::variants::KernelSpec;
pub use compile::{
    check_all, default_arch, dump_all, resources_all, CheckResults, Compiled, Compiler, ResourceResults,
};
pub use cudarc::driver::LaunchConfig;
pub use device::{CudaDevice, DeviceBuffer, Graph, Kernel, KernelResources, Launch, LoadedModule, RawArg};
pub use error::{CompileError, EnvError};
pub use ptxas::EntryResources;
pub use report::{Ceilings, DeviceProps, DeviceReport, LaunchOverhead};
pub use timing::{Aids, Cold, L2Flush, RegionSamples, Timer};

use super::{Backend, BackendError, DeviceInfo, Exec, RunOutput, Samples, TimingOptions};
use crate::variants::{Job, Variant};
use probe::Probe;

/// What [`CudaBackend::open_with`] does besides opening the device.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub ordinal: usize,
    /// NVRTC target; None: [`default_arch`] of the device.
    pub arch: Option<String>,
    /// Measure copy bandwidth and tensor rates (about a second of GPU time).
    pub measure_ceilings: bool,
    /// Measure the empty-kernel launch cost.
    pub measure_launch: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            ordinal: 0,
            arch: None,
            measure_ceilings: true,
            measure_launch: false,
        }
    }
}

pub struct CudaBackend {
    pub dev: CudaDevice,
    pub compiler: Compiler,
    pub probe: Probe,
    pub flush: L2Flush,
    pub timer: Timer,
    pub ceilings: Option<Ceilings>,
    pub launch_overhead: Option<LaunchOverhead>,
    info: DeviceInfo,
    modules: HashMap<KernelSpec, Arc<LoadedModule>>,
    pub(super) notes: Vec<String>,
    /// The GPUs a DCP case's ranks run on (`--dcp-devices`), opened by the
    /// first such case.
    group: Option<dcp_group::Group>,
}

impl CudaBackend {
    /// Device 0, with its ceilings measured.
    pub fn open(kernels_dir: &Path) -> Result<Self, EnvError> {
        Self::open_with(kernels_dir, &OpenOptions::default())
    }

    pub fn open_with(kernels_dir: &Path, opts: &OpenOptions) -> Result<Self, EnvError> {
        let dev = CudaDevice::open(opts.ordinal)?;
        let arch = opts
            .arch
            .clone()
            .unwrap_or_else(|| default_arch(dev.props().compute_capability));
        let compiler = Compiler::new(kernels_dir, &arch)?;
        let compiled = compiler.compile(&probe::spec())?;
        let setup = |e: BackendError| EnvError::Setup(e.to_string());
        let probe = Probe::load(&dev, &compiled.cubin).map_err(setup)?;
        let flush = L2Flush::new(&dev, probe.l2_flush()).map_err(setup)?;
        let timer = Timer::default();
        let ceilings = if opts.measure_ceilings {
            Some(ceilings::measure(&dev, &probe, probe::has_wgmma(compiler.arch())).map_err(setup)?)
        } else {
            None
        };
        let launch_overhead = if opts.measure_launch {
            Some(ceilings::launch_overhead(&dev, &probe, &timer).map_err(setup)?)
        } else {
            None
        };
        let info = device_info(&dev, &compiler, ceilings.as_ref());
        Ok(CudaBackend {
            dev,
            compiler,
            probe,
            flush,
            timer,
            ceilings,
            launch_overhead,
            info,
            modules: HashMap::new(),
            notes: Vec::new(),
            group: None,
        })
    }

    /// The loaded module of one kernel configuration, compiled (or taken
    /// from the cache) on first use.
    pub fn module(&mut self, spec: &KernelSpec) -> Result<Arc<LoadedModule>, BackendError> {
        if let Some(m) = self.modules.get(spec) {
            return Ok(m.clone());
        }
        let c = self
            .compiler
            .compile(spec)
            .map_err(|e| BackendError::Failed(e.to_string()))?;
        self.notes.push(if c.cache_hit {
            format!("{}: kernel cache hit", spec.label())
        } else {
            format!("{}: compiled in {:.0} ms", spec.label(), c.compile_ms)
        });
        let m = Arc::new(self.dev.load_module(&c.cubin, spec)?);
        self.modules.insert(spec.clone(), m.clone());
        Ok(m)
    }

    /// A module [`CudaBackend::module`] loaded before, for code that holds
    /// the backend shared.
    pub fn module_loaded(&self, spec: &KernelSpec) -> Result<Arc<LoadedModule>, BackendError> {
        self.modules
            .get(spec)
            .cloned()
            .ok_or_else(|| BackendError::Failed(format!("{} was not loaded before its launch", spec.label())))
    }

    /// Runs a DCP case as a step on its group of GPUs, opening the group
    /// first (again, when the case asks for another size).
    fn run_group(&mut self, n: usize, unit: &dyn Variant, job: &Job, exec: &Exec) -> Result<RunOutput, BackendError> {
        if self.group.as_ref().map(dcp_group::Group::size) != Some(n) {
            self.group = None;
            self.group = Some(dcp_group::Group::open(n, self)?);
        }
        let group = self.group.as_mut().expect("opened above");
        let r = group.run(unit, job, exec);
        if r.is_err() {
            // Its collectives may be half issued: the next case opens a new one.
            self.group = None;
        }
        r
    }

    /// Compile notes gathered since the last call (for `RunOutput::notes`).
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// The flush and queue-ahead kernels of this backend, for [`Timer`].
    pub fn aids(&self) -> Aids<'_> {
        Aids {
            flush: Some((&self.flush, self.probe.l2_flush())),
            spin: Some(self.probe.spin()),
        }
    }

    /// [`Timer::time_region`] with this backend's L2 flush and queue-ahead.
    pub fn time_region(
        &self,
        opts: &TimingOptions,
        between: impl FnMut() -> Result<(), BackendError>,
        launch: impl FnMut(usize) -> Result<(), BackendError>,
    ) -> Result<RegionSamples, BackendError> {
        self.timer.time_region(&self.dev, opts, self.aids(), between, launch)
    }

    /// The kernel-only region (`launch(false)`) and the whole variant
    /// (`launch(true)`), their samples interleaved (see [`Timer::time_regions`]).
    pub fn kernel_and_variant(
        &self,
        opts: &TimingOptions,
        mut launch: impl FnMut(bool) -> Result<(), BackendError>,
    ) -> Result<Samples, BackendError> {
        let mut v = self
            .timer
            .time_regions(&self.dev, opts, self.aids(), 2, || Ok(()), |r, _| launch(r == 1))?;
        let (variant, kernel) = (v.remove(1), v.remove(0));
        Ok(Samples {
            kernel_ms: kernel.ms,
            variant_ms: variant.ms,
            clock: variant.clock.to_string(),
            regions: Vec::new(),
        })
    }

    pub fn report(&self) -> DeviceReport {
        DeviceReport {
            props: self.dev.props().clone(),
            nvrtc_version: self.compiler.nvrtc().version,
            nvrtc_source: self.compiler.nvrtc().source.clone(),
            arch: self.compiler.arch().to_string(),
            cuda_include: self.compiler.include_dir().display().to_string(),
            kernel_cache: self.compiler.cache_dir().map(|d| d.display().to_string()),
            ceilings: self.ceilings.clone(),
            launch: self.launch_overhead.clone(),
        }
    }
}

/// `mlabench device`: opens device 0 and measures what the report shows.
pub fn device_report(kernels_dir: &Path, measure_ceilings: bool) -> Result<DeviceReport, EnvError> {
    let opts = OpenOptions {
        measure_ceilings,
        measure_launch: measure_ceilings,
        ..OpenOptions::default()
    };
    Ok(CudaBackend::open_with(kernels_dir, &opts)?.report())
}

fn device_info(dev: &CudaDevice, compiler: &Compiler, ceilings: Option<&Ceilings>) -> DeviceInfo {
    let p = dev.props();
    let mut details = vec![
        (
            "compute_capability".to_string(),
            format!("{}.{}", p.compute_capability.0, p.compute_capability.1),
        ),
        ("arch".into(), compiler.arch().to_string()),
        (
            "driver".into(),
            format!("{}.{}", p.driver_version.0, p.driver_version.1),
        ),
        (
            "nvrtc".into(),
            format!("{}.{}", compiler.nvrtc().version.0, compiler.nvrtc().version.1),
        ),
        ("sm_clock_max_mhz".into(), format!("{:.0}", p.sm_clock_mhz)),
        ("mem_clock_max_mhz".into(), format!("{:.0}", p.mem_clock_mhz)),
        (
            "mem_total_gib".into(),
            format!("{:.1}", p.total_mem_bytes as f64 / (1u64 << 30) as f64),
        ),
    ];
    if let Some(c) = ceilings {
        details.push(("copy_method".into(), c.copy_method.clone()));
        details.push(("read_gbps".into(), format!("{:.0}", c.read_gbps)));
        for g in &c.gather {
            details.push((format!("gather_{}b_gbps", g.row_bytes), format!("{:.0}", g.gbps)));
        }
    }
    DeviceInfo {
        backend: "cuda".into(),
        name: p.name.clone(),
        compute_units: p.sm_count,
        l2_bytes: p.l2_bytes,
        copy_gbps: ceilings.map(|c| c.copy_gbps),
        tensor: ceilings.map(|c| c.tensor).unwrap_or_default(),
        details,
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn run(&mut self, unit: &dyn Variant, job: &Job, exec: &Exec) -> Result<RunOutput, BackendError> {
        if let Some(n) = job.case.dcp_devices {
            return self.run_group(n, unit, job, exec);
        }
        let t = std::time::Instant::now();
        let programs = unit.programs(job).map_err(BackendError::Failed)?;
        let built = t.elapsed().as_secs_f64();
        let mut out = self.execute(&programs, exec)?;
        out.phases.insert(0, ("programs", built));
        Ok(out)
    }

    fn free_memory(&self) -> Option<u64> {
        self.dev.mem_info().ok().map(|(free, _)| free as u64)
    }
}

/// What a DCP group needs before any case runs: NCCL, then the driver.
/// Returns the line a run prints of it and the GPUs visible.
pub fn dcp_preflight() -> Result<(String, usize), EnvError> {
    let lib = nccl::load()?;
    libs::ensure_libcuda()?;
    cudarc::driver::result::init().map_err(|e| EnvError::Driver(format!("cuInit: {}", device::describe(e))))?;
    let count = cudarc::driver::CudaContext::device_count()
        .map_err(|e| EnvError::Driver(format!("cuDeviceGetCount: {}", device::describe(e))))?
        .max(0) as usize;
    let line = format!(
        "DCP groups: NCCL {} from {} (NCCL_NVLS_ENABLE=0), {} visible",
        lib.version,
        lib.source,
        crate::backend::gpus(count)
    );
    Ok((line, count))
}

/// The ceiling probes' kernel configuration (compiled by `kernels --check` too).
pub fn probe_spec() -> KernelSpec {
    probe::spec()
}
