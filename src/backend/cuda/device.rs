//! The driver, wrapped once: one context, one stream, buffers, module
//! loading, launches, events and graph capture, with every CUDA error mapped
//! to a [`BackendError`].
//!
//! All work goes through the one stream, so cudarc's per-buffer event
//! tracking is switched off: it would only add event waits, and those break
//! stream capture.
//!
//! Error mapping: a sticky error (illegal address, launch failure, trap, ...)
//! leaves the context unusable, so it becomes [`BackendError::DeviceLost`]
//! and every later call answers the same without touching the driver; any
//! other error is [`BackendError::Failed`].

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, DriverError, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use super::error::EnvError;
use super::libs;
use super::report::DeviceProps;
use crate::backend::BackendError;
use crate::variants::KernelSpec;

/// Device memory holding `len` elements of `T`.
pub type DeviceBuffer<T> = CudaSlice<T>;

/// A kernel argument by value, for [`CudaDevice::launch_raw`].
#[derive(Clone, Copy, Debug)]
pub enum RawArg {
    /// A device address ([`CudaDevice::addr`]); 0 passes a null pointer.
    Ptr(sys::CUdeviceptr),
    I32(i32),
    /// A `long long` parameter.
    I64(i64),
    F32(f32),
    /// A `CUtensorMap` ([`CudaDevice::tile_map`]).
    TensorMap([u64; 16]),
}

/// One kernel parameter's bytes: a tensor map must sit 64-byte aligned,
/// every other parameter reads its own size from the start.
#[repr(C, align(64))]
struct Slot([u64; 16]);

/// CUresult codes after which the context cannot be used again.
const STICKY: &[(u32, &str)] = &[
    (214, "ECC_UNCORRECTABLE"),
    (700, "ILLEGAL_ADDRESS"),
    (702, "LAUNCH_TIMEOUT"),
    (709, "CONTEXT_IS_DESTROYED"),
    (710, "ASSERT"),
    (714, "HARDWARE_STACK_ERROR"),
    (715, "ILLEGAL_INSTRUCTION"),
    (716, "MISALIGNED_ADDRESS"),
    (717, "INVALID_ADDRESS_SPACE"),
    (718, "INVALID_PC"),
    (719, "LAUNCH_FAILED"),
];

pub fn is_sticky(code: u32) -> bool {
    STICKY.iter().any(|(c, _)| *c == code)
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    props: DeviceProps,
    lost: OnceLock<String>,
}

impl CudaDevice {
    /// Opens device `ordinal`. A missing driver library, no device or a
    /// driver too old for CUDA 13 is an [`EnvError`], never a panic.
    pub fn open(ordinal: usize) -> Result<Self, EnvError> {
        libs::ensure_libcuda()?;
        let drv = |what: &str, e: DriverError| EnvError::Driver(format!("{what}: {}", describe(e)));
        cudarc::driver::result::init().map_err(|e| {
            let hint = match e.0 as u32 {
                35 => " (the driver is older than CUDA 13.0 needs; update the NVIDIA driver)",
                100 => " (the driver sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES)",
                _ => "",
            };
            EnvError::Driver(format!("cuInit: {}{hint}", describe(e)))
        })?;
        let count = CudaContext::device_count().map_err(|e| drv("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(EnvError::Driver(format!(
                "no CUDA device with ordinal {ordinal}: {count} visible (check CUDA_VISIBLE_DEVICES)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| drv("creating the context", e))?;
        // SAFETY: this device issues all its work on the single stream created
        // below, so no buffer is ever used across streams.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| drv("creating a stream", e))?;
        let props = query_props(&ctx, ordinal).map_err(|e| drv("querying device attributes", e))?;
        Ok(CudaDevice {
            ctx,
            stream,
            props,
            lost: OnceLock::new(),
        })
    }

    pub fn props(&self) -> &DeviceProps {
        &self.props
    }

    /// The raw context and stream, for anything this wrapper lacks.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Maps a driver error; sticky ones mark the device lost for good.
    pub fn map_err(&self, what: &str, e: DriverError) -> BackendError {
        let msg = format!("{what}: {}", describe(e));
        if is_sticky(e.0 as u32) {
            let _ = self.lost.set(msg.clone());
            BackendError::DeviceLost(msg)
        } else {
            BackendError::Failed(msg)
        }
    }

    fn check<T>(&self, what: &str, r: Result<T, DriverError>) -> Result<T, BackendError> {
        r.map_err(|e| self.map_err(what, e))
    }

    /// Polls `query` (cuStreamQuery / cuEventQuery) until the work is done.
    /// Past `hang_limit()` the device counts as lost: a kernel that hangs
    /// keeps it busy for good, and blocking on it would lose the run.
    fn wait_done(&self, what: &str, query: impl Fn() -> sys::CUresult) -> Result<(), BackendError> {
        let (t0, limit) = (Instant::now(), hang_limit());
        // Timed samples wait here for each event: spin for the first
        // millisecond, as a blocking wait would, and sleep only after it.
        let spin = Duration::from_millis(1);
        let mut nap = Duration::from_micros(10);
        loop {
            match query() {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(self.map_err(what, DriverError(e))),
            }
            if t0.elapsed() > limit {
                let msg = format!(
                    "{what}: the GPU did not finish within {} s, so a kernel hangs (a deadlock or an endless loop) \
                     or runs far longer than any case should; the device cannot be used again by this process, so the \
                     run stops here and keeps the rows already measured (MLABENCH_HANG_S sets the limit)",
                    limit.as_secs()
                );
                let _ = self.lost.set(msg.clone());
                return Err(BackendError::DeviceLost(msg));
            }
            if t0.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_micros(500));
        }
    }

    /// Refuses work once a sticky error was seen.
    fn alive(&self) -> Result<(), BackendError> {
        match self.lost.get() {
            Some(m) => Err(BackendError::DeviceLost(format!(
                "an earlier error left the device unusable: {m}"
            ))),
            None => Ok(()),
        }
    }

    pub fn is_lost(&self) -> bool {
        self.lost.get().is_some()
    }

    /// Waits for all queued work; asynchronous kernel faults surface here,
    /// and a kernel that never finishes becomes a lost device, not a hang.
    pub fn sync(&self) -> Result<(), BackendError> {
        self.alive()?;
        let s = self.stream.cu_stream();
        // SAFETY: `s` is this device's live stream; cuStreamQuery only reads its state.
        self.wait_done("synchronizing the stream", || unsafe { sys::cuStreamQuery(s) })?;
        self.check("synchronizing the stream", self.stream.synchronize())?;
        // Errors cudarc recorded in Drop impls (frees, event destroys).
        self.check("an earlier asynchronous operation", self.ctx.check_err())
    }

    /// Free and total device memory, bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), BackendError> {
        self.alive()?;
        self.check("cuMemGetInfo", self.ctx.mem_get_info())
    }

    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<DeviceBuffer<T>, BackendError> {
        self.alive()?;
        let what = format!("allocating {} bytes", len * std::mem::size_of::<T>());
        self.check(&what, self.stream.alloc_zeros::<T>(len))
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DeviceBuffer<T>, BackendError> {
        self.alive()?;
        let what = format!("uploading {} bytes", std::mem::size_of_val(host));
        self.check(&what, self.stream.clone_htod(host))
    }

    /// Copies `host` into the start of `dst` (which may be longer).
    pub fn upload_into<T: DeviceRepr>(&self, host: &[T], dst: &mut DeviceBuffer<T>) -> Result<(), BackendError> {
        self.alive()?;
        if host.len() > dst.len() {
            return Err(BackendError::Failed(format!(
                "upload of {} elements into a buffer of {}",
                host.len(),
                dst.len()
            )));
        }
        self.check("uploading", self.stream.memcpy_htod(host, dst))
    }

    /// Copies a buffer (or a `buf.slice(..)` view) to the host, after all
    /// queued work (waited for first, so a hung kernel cannot block the copy).
    pub fn download<T: DeviceRepr + Default + Clone, S: DevicePtr<T>>(&self, buf: &S) -> Result<Vec<T>, BackendError> {
        self.sync()?;
        let v = self.check("downloading", self.stream.clone_dtoh(buf))?;
        self.sync()?;
        Ok(v)
    }

    pub fn copy<T: DeviceRepr>(&self, src: &DeviceBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<(), BackendError> {
        self.alive()?;
        if src.len() > dst.len() {
            return Err(BackendError::Failed(format!(
                "device copy of {} elements into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        self.check("cuMemcpyDtoDAsync", self.stream.memcpy_dtod(src, dst))
    }

    /// Fills a buffer with a repeated 32-bit pattern (e.g. f32 NaN
    /// `0x7fc00000`, or two bf16 NaNs `0x7fc07fc0`) to poison outputs.
    /// The buffer's byte size must be a multiple of 4.
    pub fn fill_u32<T>(&self, buf: &mut DeviceBuffer<T>, bits: u32) -> Result<(), BackendError> {
        let bytes = buf.num_bytes();
        if bytes % 4 != 0 {
            return Err(BackendError::Failed(format!(
                "fill_u32 on {bytes} bytes (not a multiple of 4); use fill_u16 or fill_u8"
            )));
        }
        self.memset(buf, |p, s| {
            // SAFETY: p is this buffer's device pointer, valid for `bytes`
            // bytes; cudaMalloc pointers are 256-byte aligned.
            unsafe { sys::cuMemsetD32Async(p, bits, bytes / 4, s) }
        })
    }

    /// [`CudaDevice::fill_u32`] through a shared handle, for scratch buffers
    /// (partials, workspaces, outputs) that kernels also write through shared
    /// handles: the device memory is not Rust memory, and this stream orders
    /// the memset against every launch that uses the buffer.
    pub fn fill_u32_scratch<T>(&self, buf: &DeviceBuffer<T>, bits: u32) -> Result<(), BackendError> {
        let bytes = buf.num_bytes();
        if bytes % 4 != 0 {
            return Err(BackendError::Failed(format!(
                "fill_u32 on {bytes} bytes (not a multiple of 4); use fill_u16 or fill_u8"
            )));
        }
        self.memset_shared(buf, |p, s| {
            // SAFETY: p is this buffer's device pointer, valid for `bytes`
            // bytes and 256-byte aligned.
            unsafe { sys::cuMemsetD32Async(p, bits, bytes / 4, s) }
        })
    }

    /// [`CudaDevice::fill_u16`] through a shared handle (see
    /// [`CudaDevice::fill_u32_scratch`]).
    pub fn fill_u16_scratch<T>(&self, buf: &DeviceBuffer<T>, bits: u16) -> Result<(), BackendError> {
        let bytes = buf.num_bytes();
        if bytes % 2 != 0 {
            return Err(BackendError::Failed(format!(
                "fill_u16 on {bytes} bytes (odd); use fill_u8"
            )));
        }
        self.memset_shared(buf, |p, s| {
            // SAFETY: as in fill_u32_scratch, for bytes / 2 16-bit words.
            unsafe { sys::cuMemsetD16Async(p, bits, bytes / 2, s) }
        })
    }

    fn memset_shared<T>(
        &self,
        buf: &DeviceBuffer<T>,
        f: impl FnOnce(sys::CUdeviceptr, sys::CUstream) -> sys::CUresult,
    ) -> Result<(), BackendError> {
        self.alive()?;
        self.check("binding the context", self.ctx.bind_to_thread())?;
        let (ptr, _guard) = buf.device_ptr(&self.stream);
        self.check("cuMemsetAsync", f(ptr, self.stream.cu_stream()).result())
    }

    /// Fills with a repeated 16-bit pattern (byte size a multiple of 2).
    pub fn fill_u16<T>(&self, buf: &mut DeviceBuffer<T>, bits: u16) -> Result<(), BackendError> {
        let bytes = buf.num_bytes();
        if bytes % 2 != 0 {
            return Err(BackendError::Failed(format!(
                "fill_u16 on {bytes} bytes (odd); use fill_u8"
            )));
        }
        self.memset(buf, |p, s| {
            // SAFETY: as in fill_u32, for bytes / 2 16-bit words.
            unsafe { sys::cuMemsetD16Async(p, bits, bytes / 2, s) }
        })
    }

    pub fn fill_u8<T>(&self, buf: &mut DeviceBuffer<T>, bits: u8) -> Result<(), BackendError> {
        let bytes = buf.num_bytes();
        self.memset(buf, |p, s| {
            // SAFETY: as in fill_u32, for `bytes` bytes.
            unsafe { sys::cuMemsetD8Async(p, bits, bytes, s) }
        })
    }

    fn memset<T>(
        &self,
        buf: &mut DeviceBuffer<T>,
        f: impl FnOnce(sys::CUdeviceptr, sys::CUstream) -> sys::CUresult,
    ) -> Result<(), BackendError> {
        self.alive()?;
        self.check("binding the context", self.ctx.bind_to_thread())?;
        let (ptr, _guard) = buf.device_ptr_mut(&self.stream);
        self.check("cuMemsetAsync", f(ptr, self.stream.cu_stream()).result())
    }

    /// Loads a CUBIN and resolves every entry point of `spec`.
    pub fn load_module(&self, cubin: &[u8], spec: &KernelSpec) -> Result<LoadedModule, BackendError> {
        self.alive()?;
        let module = self.check(
            &format!("loading {}", spec.label()),
            self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec())),
        )?;
        let mut kernels = Vec::with_capacity(spec.entry_points.len());
        for &name in &spec.entry_points {
            let func = module.load_function(name).map_err(|e| {
                BackendError::Failed(format!(
                    "entry point `{name}` of {}: {} (is it extern \"C\"?)",
                    spec.label(),
                    describe(e)
                ))
            })?;
            kernels.push(Kernel {
                name,
                func,
                dyn_smem_limit: AtomicU32::new(48 * 1024),
            });
        }
        // The symbol sits in the CUBIN's ELF string table; reading it there
        // instead of asking the driver keeps a module without it from being a
        // failed API call (which compute-sanitizer reports as an error).
        let pdl_waits = elf_has_symbol(cubin, "mlab_pdl_waits");
        Ok(LoadedModule {
            spec: spec.clone(),
            pdl_waits,
            _module: module,
            kernels,
        })
    }

    /// Starts a launch of `kernel` on the device's stream; add arguments in
    /// the kernel's parameter order, then call [`Launch::launch`].
    pub fn launch<'a>(&'a self, kernel: &'a Kernel) -> Launch<'a> {
        Launch {
            dev: self,
            kernel,
            args: self.stream.launch_builder(&kernel.func),
        }
    }

    /// A TMA tensor map over `rows` bf16 rows at `addr`, `row_elems` of each
    /// (`row_bytes` apart), copied in boxes of 64 columns by `box_rows` rows
    /// with the 128-byte swizzle (common/mla_wg.cuh's tile layout).
    pub fn tile_map(
        &self,
        addr: sys::CUdeviceptr,
        rows: u64,
        row_elems: u32,
        row_bytes: u32,
        box_rows: u32,
    ) -> Result<[u64; 16], BackendError> {
        use sys::{
            CUtensorMapDataType as Ty, CUtensorMapFloatOOBfill as Oob, CUtensorMapInterleave as Il,
            CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Sw,
        };
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let dims = [row_elems as u64, rows];
        let strides = [row_bytes as u64];
        let boxes = [64u32, box_rows];
        let steps = [1u32, 1];
        // SAFETY: the arrays hold rank (2) entries (strides rank - 1) and
        // outlive the call, which only writes `map`.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                addr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
                Sw::CU_TENSOR_MAP_SWIZZLE_128B,
                L2::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                Oob::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        let what = format!("encoding a tensor map of {rows} rows x {row_elems} bf16 ({row_bytes} bytes apart)");
        self.check(&what, r.result())?;
        Ok(map.opaque)
    }

    /// The device address of a buffer, for [`RawArg::Ptr`].
    pub fn addr<T>(&self, b: &DeviceBuffer<T>) -> sys::CUdeviceptr {
        // Event tracking is off, so the returned guard records nothing.
        b.device_ptr(&self.stream).0
    }

    /// Queues `kernel` through `cuLaunchKernelEx`. With `pdl` it is a
    /// programmatic dependent of the kernel queued before it: its CTAs may
    /// start once every CTA of that kernel has run
    /// `griddepcontrol.launch_dependents`, and it waits for that kernel's
    /// results itself (kernels/common/pdl.cuh).
    ///
    /// # Safety
    /// As [`Launch::launch`]: `args` match the kernel's C signature, and the
    /// kernel stays inside the buffers the pointers name.
    pub unsafe fn launch_raw(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        pdl: bool,
        args: &[RawArg],
    ) -> Result<(), BackendError> {
        self.alive()?;
        let what = || {
            format!(
                "launching {}{} grid {:?} block {:?} smem {}",
                kernel.name,
                if pdl { " (programmatic dependent)" } else { "" },
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes
            )
        };
        self.ensure_smem(kernel, cfg.shared_mem_bytes)?;
        self.check("binding the context", self.ctx.bind_to_thread())?;
        // One slot per argument; the driver reads each parameter's own size
        // from the start of its slot (little-endian i32 included).
        let mut slots: Vec<Slot> = args
            .iter()
            .map(|a| {
                let word = |w: u64| {
                    let mut s = [0u64; 16];
                    s[0] = w;
                    Slot(s)
                };
                match *a {
                    RawArg::Ptr(p) => word(p),
                    RawArg::I32(v) => word(v as u32 as u64),
                    RawArg::I64(v) => word(v as u64),
                    RawArg::F32(v) => word(v.to_bits() as u64),
                    RawArg::TensorMap(m) => Slot(m),
                }
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots.iter_mut().map(|v| v as *mut Slot as *mut _).collect();
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { pad: [0; 64] },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if pdl { &mut attr } else { std::ptr::null_mut() },
            numAttrs: pdl as u32,
        };
        // SAFETY: config, attr, params and slots outlive the call, which copies
        // the parameters; the caller vouches for their number and meaning.
        let r = unsafe {
            sys::cuLaunchKernelEx(
                &config,
                kernel.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.check(&what(), r.result())
    }

    /// Raises a kernel's dynamic shared-memory limit to `bytes` when it is
    /// lower (above 48 KiB needs an opt-in per function).
    fn ensure_smem(&self, k: &Kernel, bytes: u32) -> Result<(), BackendError> {
        if bytes <= k.dyn_smem_limit.load(Ordering::Relaxed) {
            return Ok(());
        }
        let static_smem = k
            .func
            .shared_size_bytes()
            .map_err(|e| self.map_err("cuFuncGetAttribute", e))? as usize;
        let max = self.props.max_smem_per_block_optin;
        if bytes as usize + static_smem > max {
            return Err(BackendError::Failed(format!(
                "{} asks for {bytes} bytes of dynamic shared memory + {static_smem} static; the device allows {max} per block",
                k.name
            )));
        }
        self.check("binding the context", self.ctx.bind_to_thread())?;
        self.check(
            "raising MAX_DYNAMIC_SHARED_SIZE_BYTES",
            k.func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            ),
        )?;
        k.dyn_smem_limit.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// A timing event.
    pub fn event(&self) -> Result<CudaEvent, BackendError> {
        self.alive()?;
        self.check(
            "cuEventCreate",
            self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
        )
    }

    pub fn record(&self, ev: &CudaEvent) -> Result<(), BackendError> {
        self.alive()?;
        self.check("cuEventRecord", ev.record(&self.stream))
    }

    /// Milliseconds between two recorded events (waits for `end`).
    pub fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64, BackendError> {
        self.alive()?;
        let e = end.cu_event();
        // SAFETY: `e` is a live event recorded on this device's stream; cuEventQuery only reads it.
        self.wait_done("waiting for a timing event", || unsafe { sys::cuEventQuery(e) })?;
        self.check("waiting for a timing event", end.synchronize())?;
        Ok(self.check("cuEventElapsedTime", start.elapsed_ms(end))? as f64)
    }

    /// Captures the stream work `f` issues into a graph. `f` may only
    /// launch kernels, memset and copy between device buffers: no
    /// allocation, host transfer or synchronization during capture.
    pub fn capture(&self, f: impl FnOnce() -> Result<(), BackendError>) -> Result<Graph, BackendError> {
        self.alive()?;
        self.check(
            "cuStreamBeginCapture",
            self.stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        let body = f();
        // End the capture on every path so the stream is usable again.
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        body?;
        match self.check("ending the graph capture", ended)? {
            Some(graph) => Ok(Graph { graph }),
            None => Err(BackendError::Failed("graph capture recorded no work".into())),
        }
    }

    /// Queues one replay of a captured graph.
    pub fn replay(&self, g: &Graph) -> Result<(), BackendError> {
        self.alive()?;
        self.check("cuGraphLaunch", g.graph.launch())
    }
}

/// Whether `name` is a NUL-delimited string in the image (ELF symbol names
/// are, in the string table).
pub fn elf_has_symbol(image: &[u8], name: &str) -> bool {
    let mut needle = Vec::with_capacity(name.len() + 2);
    needle.push(0);
    needle.extend_from_slice(name.as_bytes());
    needle.push(0);
    image.windows(needle.len()).any(|w| w == needle.as_slice())
}

/// How long one wait for the GPU may last before it counts as hung:
/// `MLABENCH_HANG_S` seconds, default 120 (no single case of the shipped
/// scenarios keeps the GPU busy for more than a few seconds).
pub fn hang_limit() -> Duration {
    let s = std::env::var("MLABENCH_HANG_S")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(120);
    Duration::from_secs(s)
}

/// `CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)`.
pub fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as u32));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

fn query_props(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceProps, DriverError> {
    let a = |x: Attr| ctx.attribute(x);
    let mut drv = 0i32;
    // SAFETY: the driver is initialized (the context exists); drv is a valid out pointer.
    unsafe { sys::cuDriverGetVersion(&mut drv) }.result()?;
    Ok(DeviceProps {
        ordinal,
        name: ctx.name()?,
        sm_count: a(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
        l2_bytes: a(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
        total_mem_bytes: ctx.total_mem()?,
        compute_capability: ctx.compute_capability()?,
        sm_clock_mhz: a(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as f64 / 1e3,
        mem_clock_mhz: a(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? as f64 / 1e3,
        mem_bus_bits: a(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)? as u32,
        max_smem_per_block_optin: a(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize,
        max_smem_per_sm: a(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as usize,
        reserved_smem_per_block: a(Attr::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)? as usize,
        driver_version: (drv / 1000, (drv % 1000) / 10),
    })
}

/// One entry point of a loaded module.
pub struct Kernel {
    name: &'static str,
    func: CudaFunction,
    /// The dynamic shared memory this function is configured to accept.
    dyn_smem_limit: AtomicU32,
}

impl Kernel {
    pub fn name(&self) -> &'static str {
        self.name
    }
    pub fn function(&self) -> &CudaFunction {
        &self.func
    }

    /// Registers per thread, static shared and local (spill) bytes.
    pub fn resources(&self) -> Result<KernelResources, DriverError> {
        Ok(KernelResources {
            registers: self.func.num_regs()?,
            static_smem: self.func.shared_size_bytes()?,
            local_bytes: self.func.local_size_bytes()?,
            max_threads: self.func.max_threads_per_block()?,
        })
    }

    /// Blocks of `block` threads that fit on one SM.
    pub fn occupancy(&self, block: u32, dyn_smem: usize) -> Result<u32, DriverError> {
        self.func
            .occupancy_max_active_blocks_per_multiprocessor(block, dyn_smem, None)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelResources {
    pub registers: i32,
    pub static_smem: i32,
    pub local_bytes: i32,
    pub max_threads: i32,
}

/// A module and its resolved entry points (kept alive together).
pub struct LoadedModule {
    spec: KernelSpec,
    /// The module defines `mlab_pdl_waits`: its merge kernels wait for their
    /// forward, so they may be launched as programmatic dependents.
    pdl_waits: bool,
    _module: Arc<CudaModule>,
    kernels: Vec<Kernel>,
}

impl LoadedModule {
    pub fn spec(&self) -> &KernelSpec {
        &self.spec
    }
    pub fn pdl_waits(&self) -> bool {
        self.pdl_waits
    }

    pub fn kernel(&self, name: &str) -> Result<&Kernel, BackendError> {
        self.kernels.iter().find(|k| k.name == name).ok_or_else(|| {
            BackendError::Failed(format!(
                "`{name}` is not an entry point of {} (list it in its KernelSpec)",
                self.spec.label()
            ))
        })
    }
}

/// A kernel launch being put together; see [`CudaDevice::launch`].
pub struct Launch<'a> {
    dev: &'a CudaDevice,
    kernel: &'a Kernel,
    args: LaunchArgs<'a>,
}

impl<'a> Launch<'a> {
    /// Adds the next parameter: `&buffer` for a pointer, `&value` for a scalar.
    pub fn arg<T>(&mut self, arg: T) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<T>,
    {
        self.args.arg(arg);
        self
    }

    /// Queues the launch. Dynamic shared memory above the 48 KiB default is
    /// opted into automatically (up to the device's per-block limit).
    ///
    /// # Safety
    /// The arguments must match the kernel's C signature in number, order and
    /// type, and the kernel must stay inside the buffers it is given.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), BackendError> {
        self.dev.alive()?;
        let k = self.kernel;
        let what = || {
            format!(
                "launching {} grid {:?} block {:?} smem {}",
                k.name, cfg.grid_dim, cfg.block_dim, cfg.shared_mem_bytes
            )
        };
        self.dev.ensure_smem(k, cfg.shared_mem_bytes)?;
        // SAFETY: forwarded from the caller's contract above.
        let r = unsafe { self.args.launch(cfg) };
        r.map(|_| ()).map_err(|e| self.dev.map_err(&what(), e))
    }
}

/// A captured, instantiated graph; replay with [`CudaDevice::replay`].
pub struct Graph {
    graph: CudaGraph,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_errors_are_the_fault_codes() {
        assert!(is_sticky(700)); // illegal address
        assert!(is_sticky(719)); // launch failed
        assert!(is_sticky(710)); // device-side assert
        assert!(!is_sticky(1)); // invalid value: the launch was refused, context fine
        assert!(!is_sticky(2)); // out of memory
        assert!(!is_sticky(701)); // too many resources requested for launch
    }
}
