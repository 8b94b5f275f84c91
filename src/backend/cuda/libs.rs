//! Finding libcuda, libnvrtc and the CUDA headers before cudarc touches them.
//!
//! cudarc's dynamic loading panics on first use when a library is absent, so
//! every entry point of this backend checks here first and returns an
//! [`EnvError`] that names the library and the fix instead.
//!
//! libnvrtc is searched in this order: `$MLABENCH_NVRTC_LIB` (a file), the
//! dynamic loader's own search (LD_LIBRARY_PATH, ldconfig), the usual toolkit
//! directories, and last the pip wheel `nvidia-cuda-nvrtc` (found by asking
//! `python3`). A library found by path is loaded with `dlopen` by its full
//! path first; cudarc's later `dlopen("libnvrtc.so.13")` then matches it by
//! soname, so no LD_LIBRARY_PATH is needed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cudarc::nvrtc::sys as nvrtc_sys;

use super::error::EnvError;

/// How libnvrtc was found, and its version.
#[derive(Clone, Debug)]
pub struct NvrtcLib {
    pub version: (i32, i32),
    /// `$MLABENCH_NVRTC_LIB`, `loader search path` or the directory it came from.
    pub source: String,
    /// The directory it was loaded from by path (None: found by the loader).
    pub dir: Option<PathBuf>,
}

const NVRTC_FIX: &str = "install NVRTC for CUDA 13 (`pip install nvidia-cuda-nvrtc==13.0.88 \
     nvidia-cuda-runtime==13.0.96`, or the CUDA 13 toolkit), then add its lib directory to \
     LD_LIBRARY_PATH or set MLABENCH_NVRTC_LIB=/path/to/libnvrtc.so.13";

/// Checks that the driver library can be loaded (never panics).
pub fn ensure_libcuda() -> Result<(), EnvError> {
    // SAFETY: only tries to dlopen the candidate names and closes them again.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        return Ok(());
    }
    Err(EnvError::LibraryMissing {
        lib: "libcuda.so (the NVIDIA driver)".into(),
        tried: "libcuda.so, libcuda.so.1 and the other names cudarc knows, on the loader search path".into(),
        fix: "this machine needs an NVIDIA GPU and driver; inside a container, start it with the \
              NVIDIA runtime (--gpus all) so libcuda.so.1 is mounted, or add the driver's \
              directory to LD_LIBRARY_PATH"
            .into(),
    })
}

/// Loads libnvrtc once per process; later calls return the first answer.
pub fn load_nvrtc() -> Result<NvrtcLib, EnvError> {
    static LOADED: OnceLock<Result<NvrtcLib, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| find_and_load_nvrtc().map_err(|e| e.to_string()))
        .clone()
        .map_err(|msg| EnvError::LibraryMissing {
            lib: "libnvrtc (NVRTC)".into(),
            tried: msg,
            fix: NVRTC_FIX.into(),
        })
}

/// Returns a description of where the search looked when it fails.
fn find_and_load_nvrtc() -> Result<NvrtcLib, String> {
    let mut tried = Vec::new();
    if let Ok(file) = std::env::var("MLABENCH_NVRTC_LIB") {
        let path = PathBuf::from(&file);
        let dir = path.parent().map(Path::to_path_buf);
        if let Some(d) = &dir {
            preload_builtins(d);
        }
        dl::open_global(&path).map_err(|e| format!("MLABENCH_NVRTC_LIB={file}: {e}"))?;
        return finish(format!("MLABENCH_NVRTC_LIB={file}"), dir);
    }
    // SAFETY: only tries to dlopen the candidate names and closes them again.
    if unsafe { nvrtc_sys::is_culib_present() } {
        return finish("loader search path".into(), None);
    }
    tried.push("loader search path (LD_LIBRARY_PATH, ldconfig) for libnvrtc.so, libnvrtc.so.13".into());
    let mut dirs = toolkit_dirs("lib64");
    dirs.extend(toolkit_dirs("lib"));
    if let Ok(inc) = std::env::var("MLABENCH_CUDA_INCLUDE") {
        dirs.push(Path::new(&inc).join("..").join("lib"));
    }
    let mut pip_tried = false;
    loop {
        for dir in &dirs {
            if let Some(lib) = nvrtc_in(dir) {
                preload_builtins(dir);
                match dl::open_global(&lib) {
                    Ok(()) => return finish(dir.display().to_string(), Some(dir.clone())),
                    Err(e) => tried.push(format!("{} ({e})", lib.display())),
                }
            } else {
                tried.push(dir.display().to_string());
            }
        }
        if pip_tried {
            break;
        }
        pip_tried = true;
        dirs = pip_cu13_dir().map(|d| vec![d.join("lib")]).unwrap_or_default();
        if dirs.is_empty() {
            tried.push("pip nvidia-cuda-nvrtc (python3 found no nvidia/cu13)".into());
            break;
        }
    }
    Err(tried.join("; "))
}

fn finish(source: String, dir: Option<PathBuf>) -> Result<NvrtcLib, String> {
    // SAFETY: the loader already resolved libnvrtc under one of cudarc's
    // candidate names (checked by is_culib_present), so this cannot panic.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(format!(
            "{source}: loaded, but not under a name cudarc looks for (libnvrtc.so.13)"
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is loaded (checked above); the pointers are valid locals.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("{source}: nvrtcVersion failed ({rc:?})"));
    }
    Ok(NvrtcLib {
        version: (major, minor),
        source,
        dir,
    })
}

/// NVRTC dlopens `libnvrtc-builtins.so.X.Y` by soname at compile time; load
/// it by path first so the loader finds it without LD_LIBRARY_PATH.
fn preload_builtins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        .collect();
    names.sort();
    for p in names {
        // A missing builtins library shows up later as NVRTC's own error.
        let _ = dl::open_global(&p);
    }
}

fn nvrtc_in(dir: &Path) -> Option<PathBuf> {
    ["libnvrtc.so.13", "libnvrtc.so"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// `$CUDA_PATH/<sub>`, `$CUDA_HOME/<sub>`, `/usr/local/cuda/<sub>` and the
/// targets layout, in that order.
fn toolkit_dirs(sub: &str) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut out: Vec<PathBuf> = roots.iter().map(|r| r.join(sub)).collect();
    if sub != "lib64" {
        out.extend(roots.iter().map(|r| r.join("targets/x86_64-linux").join(sub)));
    }
    out
}

/// `site-packages/nvidia/cu13` of the pip wheels, asked of `python3` (or
/// `$PYTHON`) once per process.
fn pip_cu13_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let script = "import os, nvidia\nfor p in nvidia.__path__:\n    d = os.path.join(p, 'cu13')\n    if os.path.isdir(d):\n        print(d)\n        break\n";
        let out = Command::new(py).args(["-c", script]).output().ok()?;
        let s = String::from_utf8(out.stdout).ok()?;
        let d = PathBuf::from(s.trim());
        (out.status.success() && d.is_dir()).then_some(d)
    })
    .clone()
}

/// A CUDA include directory holding the headers our kernels include.
pub fn find_cuda_include(nvrtc: &NvrtcLib) -> Result<PathBuf, EnvError> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("MLABENCH_CUDA_INCLUDE") {
        // An explicit choice is the only candidate: a wrong one must not be
        // papered over by some other toolkit's headers.
        let p = PathBuf::from(p);
        return if has_headers(&p) {
            Ok(p)
        } else {
            Err(EnvError::HeadersMissing {
                tried: format!("MLABENCH_CUDA_INCLUDE={}", p.display()),
            })
        };
    }
    cands.extend(toolkit_dirs("include"));
    if let Some(d) = &nvrtc.dir {
        cands.push(d.join("..").join("include"));
    }
    if let Some(found) = cands.iter().find(|p| has_headers(p)) {
        return Ok(found.clone());
    }
    if let Some(d) = pip_cu13_dir() {
        let p = d.join("include");
        if has_headers(&p) {
            return Ok(p);
        }
        cands.push(p);
    }
    let tried = cands
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(EnvError::HeadersMissing { tried })
}

fn has_headers(dir: &Path) -> bool {
    dir.join("cuda_bf16.h").is_file() && dir.join("cuda_fp8.h").is_file()
}

#[cfg(target_os = "linux")]
mod dl {
    use std::ffi::{c_char, c_int, c_void, CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
        fn dlerror() -> *mut c_char;
    }
    const RTLD_NOW: c_int = 2;
    const RTLD_GLOBAL: c_int = 0x100;

    /// Loads a shared library for the rest of the process (never closed:
    /// cudarc resolves its symbols from it later).
    pub fn open_global(path: &Path) -> Result<(), String> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call;
        // dlopen runs the library's initializers, which for NVRTC only set up
        // its own state.
        let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_GLOBAL) };
        if !h.is_null() {
            return Ok(());
        }
        // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc,
        // valid until the next dl* call on this thread; it is copied at once.
        let msg = unsafe {
            let e = dlerror();
            if e.is_null() {
                "dlopen failed".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        Err(msg)
    }
}

#[cfg(not(target_os = "linux"))]
mod dl {
    use std::path::Path;

    pub fn open_global(path: &Path) -> Result<(), String> {
        Err(format!(
            "{}: loading by path is only supported on Linux; put its directory on the loader's search path",
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolkit_dirs_end_with_usr_local_cuda() {
        let d = toolkit_dirs("include");
        assert!(d.contains(&PathBuf::from("/usr/local/cuda/include")));
        assert!(d.contains(&PathBuf::from("/usr/local/cuda/targets/x86_64-linux/include")));
        assert_eq!(
            toolkit_dirs("lib64").last(),
            Some(&PathBuf::from("/usr/local/cuda/lib64"))
        );
    }

    #[test]
    fn header_check_needs_both_headers() {
        let t = tempfile::tempdir().unwrap();
        assert!(!has_headers(t.path()));
        std::fs::write(t.path().join("cuda_bf16.h"), "").unwrap();
        assert!(!has_headers(t.path()));
        std::fs::write(t.path().join("cuda_fp8.h"), "").unwrap();
        assert!(has_headers(t.path()));
    }

    #[test]
    fn dlopen_of_a_missing_file_is_an_error_not_a_panic() {
        let e = dl::open_global(Path::new("/nonexistent/libnvrtc.so.13")).unwrap_err();
        assert!(e.contains("nonexistent"), "{e}");
    }
}
