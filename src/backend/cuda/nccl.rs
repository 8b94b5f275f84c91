//! NCCL, loaded at run time, for the DCP group (`--dcp-devices`).
//!
//! The types come from cudarc's `nccl` bindings; the library is loaded here.
//! cudarc's own loader asks the dynamic loader for `libnccl.so` and
//! `libnccl.so.<CUDA major>`, but both the pip wheel (`nvidia-nccl-cu13`)
//! and the system package ship only the soname `libnccl.so.2`, so cudarc
//! would panic on first use where NCCL is installed. Search order:
//! `$MLABENCH_NCCL_LIB` (a file), the loader's search path (`libnccl.so.2`,
//! `libnccl.so`), then the pip wheel's `nvidia/nccl/lib` (found by asking
//! `python3`). A missing library or symbol is an [`EnvError`], never a panic.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use cudarc::driver::sys::CUstream;
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t};

use super::error::EnvError;
use crate::backend::BackendError;

/// NCCL's status codes are plain ints here: an enum from C with a value the
/// bindings do not know would be undefined behaviour.
type Status = c_int;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> Status;
type GetErrorString = unsafe extern "C" fn(Status) -> *const c_char;
type CommInitAll = unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> Status;
type CommFree = unsafe extern "C" fn(ncclComm_t) -> Status;
type CommAsyncError = unsafe extern "C" fn(ncclComm_t, *mut Status) -> Status;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclComm_t, CUstream) -> Status;
type ReduceScatter = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    CUstream,
) -> Status;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    CUstream,
) -> Status;

/// The NCCL entry points the DCP group calls, resolved once.
pub struct Nccl {
    /// `2.27.3`, from `ncclGetVersion`.
    pub version: String,
    /// Where it was found, for the report.
    pub source: String,
    error_string: GetErrorString,
    comm_init_all: CommInitAll,
    comm_destroy: CommFree,
    comm_abort: CommFree,
    async_error: CommAsyncError,
    all_gather: AllGather,
    reduce_scatter: ReduceScatter,
    all_reduce: AllReduce,
}

const FIX: &str = "install NCCL for CUDA 13 (`pip install nvidia-nccl-cu13`, or the system's libnccl2), \
     or set MLABENCH_NCCL_LIB=/path/to/libnccl.so.2; --dcp-devices needs it even for one GPU";

/// Loads NCCL once per process; later calls return the first answer.
pub fn load() -> Result<&'static Nccl, EnvError> {
    static LOADED: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LOADED
        .get_or_init(find_and_load)
        .as_ref()
        .map_err(|tried| EnvError::LibraryMissing {
            lib: "libnccl (NCCL)".into(),
            tried: tried.clone(),
            fix: FIX.into(),
        })
}

fn find_and_load() -> Result<Nccl, String> {
    // NVLink SHARP multicast objects can take a shared host's GPUs out of
    // service when a process dies holding them: NCCL must never make one.
    // Set before the library is loaded, so its first read of the
    // environment sees it.
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    if let Ok(file) = std::env::var("MLABENCH_NCCL_LIB") {
        let h = dl::open(&file).map_err(|e| format!("MLABENCH_NCCL_LIB={file}: {e}"))?;
        return resolve(h, format!("MLABENCH_NCCL_LIB={file}")).map_err(|e| format!("MLABENCH_NCCL_LIB={file}: {e}"));
    }
    let mut tried = Vec::new();
    for name in ["libnccl.so.2", "libnccl.so"] {
        match dl::open(name) {
            Ok(h) => return resolve(h, format!("loader search path ({name})")),
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    match pip_nccl() {
        Some(p) => {
            let s = p.display().to_string();
            match dl::open(&s) {
                Ok(h) => return resolve(h, s),
                Err(e) => tried.push(format!("{s} ({e})")),
            }
        }
        None => tried.push("pip nvidia-nccl-cu13 (python3 found no nvidia/nccl/lib/libnccl.so.2)".into()),
    }
    Err(tried.join("; "))
}

fn resolve(h: dl::Handle, source: String) -> Result<Nccl, String> {
    // SAFETY: each symbol is NCCL's public C function of that name, whose
    // signature since NCCL 2.12 is the one its type gives (nccl.h); the
    // handle stays loaded for the process's life, and ncclGetVersion only
    // writes its out-parameter.
    unsafe {
        let get_version: GetVersion = dl::sym(h, "ncclGetVersion")?;
        let mut v: c_int = 0;
        let rc = get_version(&mut v);
        if rc != 0 {
            return Err(format!("ncclGetVersion failed ({rc})"));
        }
        Ok(Nccl {
            version: version_string(v),
            source,
            error_string: dl::sym(h, "ncclGetErrorString")?,
            comm_init_all: dl::sym(h, "ncclCommInitAll")?,
            comm_destroy: dl::sym(h, "ncclCommDestroy")?,
            comm_abort: dl::sym(h, "ncclCommAbort")?,
            async_error: dl::sym(h, "ncclCommGetAsyncError")?,
            all_gather: dl::sym(h, "ncclAllGather")?,
            reduce_scatter: dl::sym(h, "ncclReduceScatter")?,
            all_reduce: dl::sym(h, "ncclAllReduce")?,
        })
    }
}

/// NCCL_VERSION_CODE: `major*10000 + minor*100 + patch` since 2.9.
pub fn version_string(code: c_int) -> String {
    let c = code.max(0);
    format!("{}.{}.{}", c / 10000, (c / 100) % 100, c % 100)
}

/// `site-packages/nvidia/nccl/lib/libnccl.so.2` of the pip wheel, asked of
/// `python3` (or `$PYTHON`).
fn pip_nccl() -> Option<PathBuf> {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import os, nvidia\nfor p in nvidia.__path__:\n    f = os.path.join(p, 'nccl', 'lib', 'libnccl.so.2')\n    if os.path.isfile(f):\n        print(f)\n        break\n";
    let out = Command::new(py).args(["-c", script]).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    let f = PathBuf::from(s.trim());
    (out.status.success() && f.is_file()).then_some(f)
}

impl Nccl {
    fn check(&self, what: &str, rc: Status) -> Result<(), BackendError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string
        // for any code (an unknown one included).
        let msg = unsafe { CStr::from_ptr((self.error_string)(rc)) }
            .to_string_lossy()
            .into_owned();
        Err(BackendError::Failed(format!("{what}: NCCL error {rc} ({msg})")))
    }

    /// One communicator per device of `devices`, rank `i` on `devices[i]`, in
    /// this process (ncclCommInitAll).
    pub fn init_all(&'static self, devices: &[usize]) -> Result<Vec<Comm>, BackendError> {
        let devs: Vec<c_int> = devices.iter().map(|&d| d as c_int).collect();
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one handle per device in `devs`, both
        // live for the call; NCCL sets each device itself.
        let rc = unsafe { (self.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        self.check(&format!("ncclCommInitAll over devices {devices:?}"), rc)?;
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, raw)| Comm {
                lib: self,
                raw,
                rank,
                aborted: false,
            })
            .collect())
    }
}

/// One rank's communicator. Used by one thread at a time; destroyed on drop
/// (aborted instead after a failure, so a peer that never arrives cannot
/// block the drop).
pub struct Comm {
    lib: &'static Nccl,
    raw: ncclComm_t,
    pub rank: usize,
    aborted: bool,
}

// SAFETY: a communicator may be used from any thread as long as calls on it
// do not overlap; `Comm` is only reached through `&mut` or by its one owner.
unsafe impl Send for Comm {}

impl Comm {
    /// Gathers `count` elements of type `ty` from every rank into `recv`
    /// (`count * ranks` elements, rank order), queued on `stream`.
    ///
    /// # Safety
    /// `send` must hold `count` and `recv` `count * ranks` elements of `ty`
    /// on this rank's device, live until the stream has run the call.
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        ty: ncclDataType_t,
        stream: CUstream,
    ) -> Result<(), BackendError> {
        let rc = (self.lib.all_gather)(send as *const c_void, recv as *mut c_void, count, ty, self.raw, stream);
        self.lib.check("ncclAllGather", rc)
    }

    /// Sums `recv_count * ranks` elements over the ranks and leaves block
    /// `rank` (of `recv_count`) in `recv`.
    ///
    /// # Safety
    /// As [`Comm::all_gather`], with `send` holding `recv_count * ranks`.
    pub unsafe fn reduce_scatter_sum(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        ty: ncclDataType_t,
        stream: CUstream,
    ) -> Result<(), BackendError> {
        let rc = (self.lib.reduce_scatter)(
            send as *const c_void,
            recv as *mut c_void,
            recv_count,
            ty,
            ncclRedOp_t::ncclSum,
            self.raw,
            stream,
        );
        self.lib.check("ncclReduceScatter", rc)
    }

    /// Sums `count` elements over the ranks in place.
    ///
    /// # Safety
    /// `buf` must hold `count` elements of `ty` on this rank's device.
    pub unsafe fn all_reduce_sum(
        &self,
        buf: u64,
        count: usize,
        ty: ncclDataType_t,
        stream: CUstream,
    ) -> Result<(), BackendError> {
        let p = buf as *mut c_void;
        let rc = (self.lib.all_reduce)(p, p, count, ty, ncclRedOp_t::ncclSum, self.raw, stream);
        self.lib.check("ncclAllReduce", rc)
    }

    /// An error a peer or the network raised asynchronously, if any.
    pub fn async_error(&self) -> Result<(), BackendError> {
        let mut e: Status = 0;
        // SAFETY: `raw` is a live communicator and `e` a valid out-parameter.
        let rc = unsafe { (self.lib.async_error)(self.raw, &mut e) };
        self.lib.check("ncclCommGetAsyncError", rc)?;
        self.lib.check("a collective of this communicator", e)
    }

    /// Marks the communicator for abort on drop: its peers may be gone.
    pub fn poison(&mut self) {
        self.aborted = true;
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let f = if self.aborted {
            self.lib.comm_abort
        } else {
            self.lib.comm_destroy
        };
        // SAFETY: `raw` came from ncclCommInitAll and is freed exactly once,
        // here; nothing uses it afterwards.
        let _ = unsafe { f(self.raw) };
    }
}

mod dl {
    use super::*;

    /// A library loaded for the rest of the process (never closed: the
    /// function pointers taken from it live as long).
    #[derive(Clone, Copy)]
    pub struct Handle(*mut c_void);

    pub fn open(name: &str) -> Result<Handle, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: `c` is a NUL-terminated name that outlives the call;
        // dlopen runs NCCL's initializers, which only set up its own state.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(last_error());
        }
        Ok(Handle(h))
    }

    /// The function `name` of the library, as type `F`.
    ///
    /// # Safety
    /// `F` must be the function pointer type of that symbol.
    pub unsafe fn sym<F: Copy>(h: Handle, name: &str) -> Result<F, String> {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let c = CString::new(name).map_err(|e| e.to_string())?;
        let p = libc::dlsym(h.0, c.as_ptr());
        if p.is_null() {
            return Err(format!("the library has no symbol {name} (NCCL older than 2.12?)"));
        }
        Ok(std::mem::transmute_copy::<*mut c_void, F>(&p))
    }

    fn last_error() -> String {
        // SAFETY: dlerror returns NULL or a NUL-terminated string owned by
        // libc, valid until the next dl* call on this thread; copied at once.
        unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "dlopen failed".into()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_major_minor_patch() {
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(23206), "2.32.6");
        assert_eq!(version_string(-1), "0.0.0");
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = dl::open("/nonexistent/libnccl.so.2").err().unwrap();
        assert!(e.contains("nonexistent"), "{e}");
    }
}
