//! On-disk cache of compiled CUBINs, keyed by everything that changes the
//! binary: source, every local header it includes (transitively), the
//! compile options and the NVRTC version.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bump when the key's recipe or the stored format changes.
const FORMAT: &str = "mlabench-cubin-v1";

/// The cache directory: `$MLABENCH_CACHE` (`off` disables caching), else
/// `$XDG_CACHE_HOME/mlabench/kernels`, else `~/.cache/mlabench/kernels`.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("MLABENCH_CACHE") {
        return (v != "off" && !v.is_empty()).then(|| PathBuf::from(v));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("mlabench/kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mlabench/kernels"))
}

/// Headers under `kernels_dir` that `file` includes, transitively, as
/// `(path relative to kernels_dir, contents)`. System headers (those not
/// found under `kernels_dir`) are left out: the NVRTC version and the include
/// directory in the options stand for them.
pub fn local_includes(kernels_dir: &Path, file: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![file.to_path_buf()];
    while let Some(cur) = stack.pop() {
        let Ok(text) = std::fs::read(&cur) else {
            continue;
        };
        let here = cur.parent().unwrap_or(kernels_dir).to_path_buf();
        for name in include_names(&String::from_utf8_lossy(&text)) {
            let Some(path) = [here.join(&name), kernels_dir.join(&name)]
                .into_iter()
                .find(|p| p.is_file())
            else {
                continue;
            };
            let Ok(canon) = path.canonicalize() else {
                continue;
            };
            let Ok(root) = kernels_dir.canonicalize() else {
                continue;
            };
            let Ok(rel) = canon.strip_prefix(&root) else {
                continue;
            };
            let rel = rel.to_string_lossy().into_owned();
            if found.contains_key(&rel) {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&canon) {
                found.insert(rel, bytes);
                stack.push(canon);
            }
        }
    }
    found
}

/// Names in `#include "x"` and `#include <x>` lines.
fn include_names(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|line| {
            let rest = line
                .trim_start()
                .strip_prefix('#')?
                .trim_start()
                .strip_prefix("include")?
                .trim_start();
            let (open, close) = match rest.chars().next()? {
                '"' => ('"', '"'),
                '<' => ('<', '>'),
                _ => return None,
            };
            let inner = rest.strip_prefix(open)?;
            Some(inner[..inner.find(close)?].to_string())
        })
        .collect()
}

/// Hex sha256 over the format tag, the source, its local headers, the
/// options and the NVRTC version; fields are length-prefixed so no two
/// different inputs hash the same bytes.
pub fn key(source: &[u8], headers: &BTreeMap<String, Vec<u8>>, options: &[String], nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(FORMAT.as_bytes());
    field(source);
    for (name, bytes) in headers {
        field(name.as_bytes());
        field(bytes);
    }
    field(b"--options--");
    for o in options {
        field(o.as_bytes());
    }
    field(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// Creates the directory; None (with no caching) when it cannot.
    pub fn open(dir: PathBuf) -> Option<Self> {
        std::fs::create_dir_all(&dir).ok()?;
        Some(KernelCache { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.cubin"))
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(key)).ok().filter(|b| !b.is_empty())
    }

    /// Writes through a temporary file and a rename, so concurrent runs never
    /// read a half-written binary.
    pub fn put(&self, key: &str, cubin: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{key}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(cubin)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.path(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_lines_are_parsed() {
        let src =
            "#include <cuda_bf16.h>\n  #  include \"common/merge.cuh\" // x\n#define include \"no\"\n#include MACRO\n";
        assert_eq!(
            include_names(src),
            vec!["cuda_bf16.h".to_string(), "common/merge.cuh".to_string()]
        );
    }

    #[test]
    fn local_headers_are_found_transitively_and_system_ones_skipped() {
        let t = tempfile::tempdir().unwrap();
        let k = t.path();
        std::fs::create_dir_all(k.join("common")).unwrap();
        std::fs::write(k.join("a.cu"), "#include <cuda_bf16.h>\n#include \"common/x.cuh\"\n").unwrap();
        std::fs::write(k.join("common/x.cuh"), "#include \"y.cuh\"\n").unwrap();
        std::fs::write(k.join("common/y.cuh"), "#include \"common/x.cuh\"\nint y;\n").unwrap();
        let h = local_includes(k, &k.join("a.cu"));
        let names: Vec<&str> = h.keys().map(String::as_str).collect();
        assert_eq!(names, vec!["common/x.cuh", "common/y.cuh"]);
        assert_eq!(h["common/y.cuh"], b"#include \"common/x.cuh\"\nint y;\n");
    }

    #[test]
    fn key_changes_with_every_input() {
        let mut hdr = BTreeMap::new();
        hdr.insert("common/x.cuh".to_string(), b"int x;".to_vec());
        let opts = vec!["--gpu-architecture=sm_90a".to_string(), "-DH=16".to_string()];
        let base = key(b"src", &hdr, &opts, (13, 0));
        assert_eq!(base.len(), 64);
        assert_eq!(base, key(b"src", &hdr, &opts, (13, 0)));
        assert_ne!(base, key(b"src2", &hdr, &opts, (13, 0)));
        assert_ne!(base, key(b"src", &hdr, &opts, (13, 1)));
        assert_ne!(base, key(b"src", &hdr, &opts[..1], (13, 0)));
        let mut hdr2 = hdr.clone();
        hdr2.insert("common/x.cuh".to_string(), b"int x; ".to_vec());
        assert_ne!(base, key(b"src", &hdr2, &opts, (13, 0)));
        // Moving bytes between fields must not collide.
        let a = key(b"ab", &BTreeMap::new(), &["c".to_string()], (13, 0));
        let b = key(b"a", &BTreeMap::new(), &["bc".to_string()], (13, 0));
        assert_ne!(a, b);
    }

    #[test]
    fn put_then_get_round_trips() {
        let t = tempfile::tempdir().unwrap();
        let c = KernelCache::open(t.path().join("k")).unwrap();
        assert!(c.get("abc").is_none());
        c.put("abc", b"\x7fELF...").unwrap();
        assert_eq!(c.get("abc").unwrap(), b"\x7fELF...");
        let leftovers: Vec<_> = std::fs::read_dir(c.dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
