//! NVRTC compilation of kernels/<file>.cu to CUBIN, through the on-disk
//! cache. Needs libnvrtc and the CUDA headers, never a GPU, so CI can check
//! every kernel configuration on a machine without one.

use rayon::prelude::*;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::sys as nv;

use super::cache::{self, KernelCache};
use super::error::{CompileError, EnvError};
use super::libs::{self, NvrtcLib};
use super::ptxas::{self, EntryResources};
use crate::variants::KernelSpec;

/// The architecture to compile for: `sm_90a` on compute capability 9.0
/// (our kernels may use Hopper-only instructions), else `sm_XY`.
pub fn default_arch(cc: (i32, i32)) -> String {
    if cc == (9, 0) {
        "sm_90a".to_string()
    } else {
        format!("sm_{}{}", cc.0, cc.1)
    }
}

/// One compiled configuration.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub cache_hit: bool,
    /// NVRTC's log (warnings); empty on a cache hit.
    pub log: String,
    pub key: String,
    /// Wall time of the NVRTC compile (0 on a cache hit).
    pub compile_ms: f64,
}

pub struct Compiler {
    kernels_dir: PathBuf,
    include_dir: PathBuf,
    arch: String,
    cache: Option<KernelCache>,
    nvrtc: NvrtcLib,
}

impl Compiler {
    /// Finds libnvrtc and the CUDA headers; the cache directory comes from
    /// [`cache::default_dir`].
    pub fn new(kernels_dir: &Path, arch: &str) -> Result<Self, EnvError> {
        let nvrtc = libs::load_nvrtc()?;
        let include_dir = libs::find_cuda_include(&nvrtc)?;
        Ok(Compiler {
            kernels_dir: kernels_dir.to_path_buf(),
            include_dir,
            arch: arch.to_string(),
            cache: cache::default_dir().and_then(KernelCache::open),
            nvrtc,
        })
    }

    /// Replaces the cache directory (None: no caching).
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache = dir.and_then(KernelCache::open);
        self
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn include_dir(&self) -> &Path {
        &self.include_dir
    }
    pub fn kernels_dir(&self) -> &Path {
        &self.kernels_dir
    }
    pub fn nvrtc(&self) -> &NvrtcLib {
        &self.nvrtc
    }
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(KernelCache::dir)
    }

    /// The full NVRTC option list for one configuration.
    pub fn options(&self, spec: &KernelSpec) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", self.arch),
            "-std=c++17".to_string(),
            format!("-I{}", self.kernels_dir.display()),
            format!("-I{}", self.include_dir.display()),
        ];
        o.extend(spec.define_options());
        o
    }

    /// The configuration as errors name it: the file under the kernels dir
    /// this compiler reads (`--kernels-dir`), its defines and the target.
    fn label(&self, spec: &KernelSpec) -> String {
        format!("{} [{}]", self.kernels_dir.join(spec.label()).display(), self.arch)
    }

    /// Compiles one configuration (or takes it from the cache) and checks
    /// that every entry point is in the binary.
    pub fn compile(&self, spec: &KernelSpec) -> Result<Compiled, CompileError> {
        let label = self.label(spec);
        let path = self.kernels_dir.join(spec.file);
        let source = std::fs::read(&path).map_err(|e| CompileError::Source {
            path: path.display().to_string(),
            err: e.to_string(),
        })?;
        let roots = [
            ("", self.kernels_dir.as_path()),
            ("<cuda>/", self.include_dir.as_path()),
        ];
        let headers = cache::includes(&roots, &path);
        let options = self.options(spec);
        let key = cache::key(&source, &headers, &options, self.nvrtc.version);
        if let Some(cubin) = self.cache.as_ref().and_then(|c| c.get(&key)) {
            check_entry_points(&cubin, spec, &label)?;
            return Ok(Compiled {
                cubin,
                cache_hit: true,
                log: String::new(),
                key,
                compile_ms: 0.0,
            });
        }
        let t0 = Instant::now();
        let (cubin, log) = nvrtc_compile(&label, spec.file, &source, &options)?;
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        check_entry_points(&cubin, spec, &label)?;
        if let Some(c) = &self.cache {
            // A cache that cannot be written costs time, never correctness.
            let _ = c.put(&key, &cubin);
        }
        Ok(Compiled {
            cubin,
            cache_hit: false,
            log,
            key,
            compile_ms,
        })
    }

    /// ptxas's resources of each entry point of one configuration. Always
    /// compiles (a cached CUBIN has no ptxas report) and checks the entry
    /// points as [`Compiler::compile`] does.
    pub fn resources(&self, spec: &KernelSpec) -> Result<Vec<EntryResources>, CompileError> {
        let label = self.label(spec);
        let path = self.kernels_dir.join(spec.file);
        let source = std::fs::read(&path).map_err(|e| CompileError::Source {
            path: path.display().to_string(),
            err: e.to_string(),
        })?;
        let mut options = self.options(spec);
        options.push("--ptxas-options=-v".into());
        let (cubin, log) = nvrtc_compile(&label, spec.file, &source, &options)?;
        check_entry_points(&cubin, spec, &label)?;
        let mut found = ptxas::parse(&log);
        found.retain(|e| spec.entry_points.iter().any(|n| *n == e.entry));
        Ok(found)
    }

    /// Compiles every configuration (in parallel; NVRTC programs are
    /// independent), reporting each one's result.
    pub fn check_all(&self, specs: &[KernelSpec]) -> CheckResults {
        specs
            .par_iter()
            .map(|s| (s.clone(), self.compile(s).map(|_| ())))
            .collect()
    }

    /// [`Compiler::check_all`], each cubin written to `dir`.
    pub fn dump_all(&self, specs: &[KernelSpec], dir: &Path) -> CheckResults {
        specs
            .par_iter()
            .map(|s| {
                let r = self.compile(s).and_then(|k| {
                    let path = dir.join(s.cubin_name());
                    std::fs::write(&path, &k.cubin).map_err(|e| CompileError::Output {
                        path: path.display().to_string(),
                        err: e.to_string(),
                    })
                });
                (s.clone(), r)
            })
            .collect()
    }
}

/// Each configuration with its compile result.
pub type CheckResults = Vec<(KernelSpec, Result<(), CompileError>)>;

/// `mlabench kernels --check`: compile every configuration for `arch`
/// without a GPU. Errors only when NVRTC or the headers are missing.
pub fn check_all(kernels_dir: &Path, specs: &[KernelSpec], arch: &str) -> Result<CheckResults, EnvError> {
    Ok(Compiler::new(kernels_dir, arch)?.check_all(specs))
}

/// `mlabench kernels --check --cubins DIR`: [`check_all`], writing each
/// configuration's cubin to `DIR` (an existing directory) as
/// [`KernelSpec::cubin_name`], so two kernels dirs' SASS can be compared
/// without a GPU.
pub fn dump_all(kernels_dir: &Path, specs: &[KernelSpec], arch: &str, dir: &Path) -> Result<CheckResults, EnvError> {
    Ok(Compiler::new(kernels_dir, arch)?.dump_all(specs, dir))
}

/// `mlabench kernels --resources`: ptxas's report of every configuration.
pub fn resources_all(kernels_dir: &Path, specs: &[KernelSpec], arch: &str) -> Result<ResourceResults, EnvError> {
    let c = Compiler::new(kernels_dir, arch)?;
    Ok(specs.par_iter().map(|s| (s.clone(), c.resources(s))).collect())
}

/// Each configuration with its entry points' resources.
pub type ResourceResults = Vec<(KernelSpec, Result<Vec<EntryResources>, CompileError>)>;

/// Entry points are ELF symbols: their names sit NUL-delimited in the
/// string table. A missing one is usually a forgotten `extern "C"`.
fn check_entry_points(cubin: &[u8], spec: &KernelSpec, label: &str) -> Result<(), CompileError> {
    let missing: Vec<&str> = spec
        .entry_points
        .iter()
        .copied()
        .filter(|name| !super::device::elf_has_symbol(cubin, name))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CompileError::Nvrtc {
            label: label.to_string(),
            log: format!(
                "compiled, but entry point(s) {} are not in the binary (missing extern \"C\"?)",
                missing.join(", ")
            ),
        })
    }
}

/// Destroys the NVRTC program on every path out of [`nvrtc_compile`].
struct Program(nv::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from a successful nvrtcCreateProgram and is
        // destroyed exactly once, here.
        unsafe {
            nv::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn api_err(label: &str, call: &'static str, rc: nv::nvrtcResult) -> CompileError {
    CompileError::Api {
        label: label.to_string(),
        call,
        code: format!("{rc:?}"),
    }
}

/// Returns the CUBIN and NVRTC's log. The caller has loaded libnvrtc.
fn nvrtc_compile(
    label: &str,
    name: &str,
    source: &[u8],
    options: &[String],
) -> Result<(Vec<u8>, String), CompileError> {
    let src = CString::new(source).map_err(|_| CompileError::Source {
        path: name.to_string(),
        err: "source contains a NUL byte".into(),
    })?;
    let cname = CString::new(name).expect("kernel file names have no NUL");
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).expect("options have no NUL"))
        .collect();
    let popts: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let mut raw: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: src and cname are NUL-terminated and outlive the program; no
    // in-memory headers are passed (count 0, null arrays).
    let rc = unsafe {
        nv::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if rc != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(api_err(label, "nvrtcCreateProgram", rc));
    }
    let prog = Program(raw);
    // SAFETY: prog is a live program; popts points at popts.len() valid
    // NUL-terminated strings kept alive by copts.
    let rc = unsafe { nv::nvrtcCompileProgram(prog.0, popts.len() as i32, popts.as_ptr()) };
    let log = program_log(&prog);
    if rc != nv::nvrtcResult::NVRTC_SUCCESS {
        let log = if log.trim().is_empty() {
            format!("{rc:?} (NVRTC gave no log)")
        } else {
            log
        };
        return Err(CompileError::Nvrtc {
            label: label.to_string(),
            log,
        });
    }
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; size is a valid out pointer.
    let rc = unsafe { nv::nvrtcGetCUBINSize(prog.0, &mut size) };
    if rc != nv::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(api_err(
            label,
            "nvrtcGetCUBINSize (is --gpu-architecture a real sm_XY?)",
            rc,
        ));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: cubin holds exactly the size NVRTC reported.
    let rc = unsafe { nv::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut c_char) };
    if rc != nv::nvrtcResult::NVRTC_SUCCESS {
        return Err(api_err(label, "nvrtcGetCUBIN", rc));
    }
    Ok((cubin, log))
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: prog is live; size is a valid out pointer.
    if unsafe { nv::nvrtcGetProgramLogSize(prog.0, &mut size) } != nv::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: buf holds exactly the size NVRTC reported, NUL included.
    if unsafe { nv::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) } != nv::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::probe;

    #[test]
    fn arch_defaults_to_sm90a_on_hopper_only() {
        assert_eq!(default_arch((9, 0)), "sm_90a");
        assert_eq!(default_arch((8, 9)), "sm_89");
        assert_eq!(default_arch((10, 0)), "sm_100");
    }

    #[test]
    fn entry_points_are_found_by_exact_symbol_name() {
        let fake = b"\0.text.mlab_empty\0mlab_empty\0.nv.info.mlab_copy_u128\0";
        let spec = KernelSpec::new("probe.cu", &["mlab_empty"]);
        assert!(check_entry_points(fake, &spec, "x").is_ok());
        let spec = KernelSpec::new("probe.cu", &["mlab_empty", "mlab_copy_u128"]);
        let e = check_entry_points(fake, &spec, "x").unwrap_err().to_string();
        assert!(e.contains("mlab_copy_u128") && !e.contains("mlab_empty,"), "{e}");
    }

    fn kernels_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels")
    }

    /// None (with the reason printed) when this machine has no NVRTC; a
    /// failure instead when MLABENCH_REQUIRE_NVRTC=1 (CI has it).
    fn compiler_or_skip(cache: Option<PathBuf>) -> Option<Compiler> {
        match Compiler::new(&kernels_dir(), "sm_90a") {
            Ok(c) => Some(c.with_cache_dir(cache)),
            Err(e) => {
                if std::env::var("MLABENCH_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                    panic!("MLABENCH_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}");
                }
                eprintln!("skipping NVRTC test: {e}");
                None
            }
        }
    }

    #[test]
    fn probe_compiles_for_sm90a_and_is_cached() {
        let t = tempfile::tempdir().unwrap();
        let Some(c) = compiler_or_skip(Some(t.path().to_path_buf())) else {
            return;
        };
        let spec = probe::spec();
        let first = c.compile(&spec).unwrap_or_else(|e| panic!("{e}"));
        assert!(!first.cache_hit);
        // A CUBIN is an ELF image.
        assert_eq!(&first.cubin[..4], b"\x7fELF");
        let again = c.compile(&spec).unwrap();
        assert!(again.cache_hit);
        assert_eq!(again.cubin, first.cubin);
        assert_eq!(again.key, first.key);
        // A define is part of the key: a new configuration compiles afresh.
        let other = c.compile(&spec.clone().define("MLAB_TEST_DEFINE", 4)).unwrap();
        assert!(!other.cache_hit);
        assert_ne!(other.key, first.key);
    }

    #[test]
    fn compile_errors_carry_the_file_name_and_nvrtc_log() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("broken.cu"),
            "extern \"C\" __global__ void k() { undeclared_thing(); }\n",
        )
        .unwrap();
        let Some(c) = compiler_or_skip(None) else {
            return;
        };
        let c = Compiler {
            kernels_dir: t.path().to_path_buf(),
            ..c
        };
        let e = c.compile(&KernelSpec::new("broken.cu", &["k"])).unwrap_err();
        let msg = e.to_string();
        let named = format!("{} [sm_90a]", t.path().join("broken.cu").display());
        assert!(msg.contains(&named), "the error names the kernels dir it read: {msg}");
        // NVRTC's own diagnostic, verbatim: file(line): error: ...
        assert!(msg.contains("broken.cu(1): error"), "{msg}");
        assert!(msg.contains("undeclared_thing"), "{msg}");
    }

    #[test]
    fn resources_name_every_entry_point_with_its_registers() {
        let Some(c) = compiler_or_skip(None) else {
            return;
        };
        let spec = probe::spec();
        let r = c.resources(&spec).unwrap_or_else(|e| panic!("{e}"));
        let mut names: Vec<&str> = r.iter().map(|e| e.entry.as_str()).collect();
        names.sort_unstable();
        let mut want: Vec<&str> = spec.entry_points.clone();
        want.sort_unstable();
        assert_eq!(names, want);
        assert!(r.iter().all(|e| e.registers > 0), "{r:?}");
    }

    #[test]
    fn check_all_reports_each_configuration() {
        let Some(c) = compiler_or_skip(None) else {
            return;
        };
        let good = probe::spec();
        let bad = KernelSpec::new("probe.cu", &["no_such_kernel"]);
        let r = c.check_all(&[good.clone(), bad.clone()]);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0, good);
        assert!(r[0].1.is_ok());
        assert!(r[1].1.as_ref().unwrap_err().to_string().contains("no_such_kernel"));
    }

    #[test]
    fn dump_all_writes_each_compiled_configuration_under_its_name() {
        let Some(c) = compiler_or_skip(None) else {
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let good = probe::spec();
        let bad = KernelSpec::new("probe.cu", &["no_such_kernel"]).define("MLAB_TEST_DEFINE", 1);
        let r = c.dump_all(&[good.clone(), bad.clone()], t.path());
        assert!(r[0].1.is_ok() && r[1].1.is_err());
        let cubin = std::fs::read(t.path().join(good.cubin_name())).unwrap();
        assert_eq!(cubin, c.compile(&good).unwrap().cubin);
        assert!(
            !t.path().join(bad.cubin_name()).exists(),
            "no cubin for a failed configuration"
        );
    }
}
