//! On-disk cache of compiled CUBINs, keyed by everything that changes the
//! binary: source, every local header it includes (transitively), the
//! compile options and the NVRTC version.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bump when the key's recipe or the stored format changes.
const FORMAT: &str = "mlabench-cubin-v2";

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

/// Headers that `file` includes, transitively, as `(label, contents)`: each
/// found under one of `roots` (searched in order after the including file's
/// own folder) is labelled by the root's tag and its path under that root.
/// Headers under none of them (NVRTC's built-ins) are left out: the NVRTC
/// version stands for them. The labels hold no root's location, so a cache
/// built under one checkout or kit folder serves a copy of it elsewhere.
pub fn includes(roots: &[(&str, &Path)], file: &Path) -> BTreeMap<String, Vec<u8>> {
    let roots: Vec<(&str, PathBuf)> = roots
        .iter()
        .filter_map(|&(tag, dir)| Some((tag, dir.canonicalize().ok()?)))
        .collect();
    let mut found = BTreeMap::new();
    let mut stack = vec![file.to_path_buf()];
    while let Some(cur) = stack.pop() {
        let Ok(text) = std::fs::read(&cur) else {
            continue;
        };
        for name in include_names(&String::from_utf8_lossy(&text)) {
            let Some(canon) = cur
                .parent()
                .into_iter()
                .chain(roots.iter().map(|r| r.1.as_path()))
                .map(|dir| dir.join(&name))
                .find(|p| p.is_file())
                .and_then(|p| p.canonicalize().ok())
            else {
                continue;
            };
            let Some(label) = roots
                .iter()
                .find_map(|(tag, root)| Some(format!("{tag}{}", canon.strip_prefix(root).ok()?.to_string_lossy())))
            else {
                continue;
            };
            if found.contains_key(&label) {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&canon) {
                found.insert(label, bytes);
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

/// Hex sha256 over the format tag, the source, its headers, the options
/// but the `-I` folders (the headers found through them count by content)
/// and the NVRTC version; fields are length-prefixed so no two different
/// inputs hash the same bytes.
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
    for o in options.iter().filter(|o| !o.starts_with("-I")) {
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
        let h = includes(&[("", k)], &k.join("a.cu"));
        let names: Vec<&str> = h.keys().map(String::as_str).collect();
        assert_eq!(names, vec!["common/x.cuh", "common/y.cuh"]);
        assert_eq!(h["common/y.cuh"], b"#include \"common/x.cuh\"\nint y;\n");
    }

    /// A kit's cache must serve a copy of the kernels and the CUDA headers
    /// in other folders, and miss when a system header's bytes change.
    #[test]
    fn system_headers_count_by_content_not_location() {
        let make = |root: &Path, sys_body: &str| {
            let (k, cuda) = (root.join("kernels"), root.join("cuinc"));
            std::fs::create_dir_all(k.join("common")).unwrap();
            std::fs::create_dir_all(&cuda).unwrap();
            std::fs::write(k.join("a.cu"), "#include <cuda_bf16.h>\n#include \"common/x.cuh\"\n").unwrap();
            std::fs::write(k.join("common/x.cuh"), "int x;\n").unwrap();
            std::fs::write(cuda.join("cuda_bf16.h"), "#include \"cuda_fp16.h\"\n").unwrap();
            std::fs::write(cuda.join("cuda_fp16.h"), sys_body).unwrap();
            let h = includes(&[("", &k), ("<cuda>/", &cuda)], &k.join("a.cu"));
            let opts = vec![
                "--gpu-architecture=sm_90a".to_string(),
                format!("-I{}", k.display()),
                format!("-I{}", cuda.display()),
            ];
            let k = key(b"src", &h, &opts, (13, 0));
            (h, k)
        };
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let (ha, ka) = make(a.path(), "half;\n");
        let names: Vec<&str> = ha.keys().map(String::as_str).collect();
        assert_eq!(names, vec!["<cuda>/cuda_bf16.h", "<cuda>/cuda_fp16.h", "common/x.cuh"]);
        assert_eq!(ka, make(b.path(), "half;\n").1);
        assert_ne!(ka, make(c.path(), "half2;\n").1);
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
        let mut with_dir = opts.clone();
        with_dir.push("-I/any/where".to_string());
        assert_eq!(base, key(b"src", &hdr, &with_dir, (13, 0)));
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
