//! Which kernel sources a run used: a fingerprint in every run's metadata,
//! so a committed report can be matched to the sources that made it and two
//! runs compared knowing whether their kernels differ.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

/// sha256 over the CUDA sources of a kernels directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KernelsStamp {
    /// The directory as given (`--kernels-dir`).
    pub dir: String,
    /// How many `.cu` / `.cuh` files went in.
    pub files: usize,
    /// Hex sha256 over every file's relative path and bytes, in path order.
    pub sha256: String,
}

impl KernelsStamp {
    /// The first 12 hex digits, enough to tell stamps apart in a report line.
    pub fn short(&self) -> &str {
        &self.sha256[..self.sha256.len().min(12)]
    }
}

/// Fingerprint of `(relative path, bytes)` pairs; the order they come in does
/// not matter.
pub fn fingerprint(dir: &str, mut files: Vec<(String, Vec<u8>)>) -> KernelsStamp {
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    for (path, bytes) in &files {
        // Lengths first, so no concatenation of two files reads as another.
        h.update((path.len() as u64).to_le_bytes());
        h.update(path.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    let sha256 = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    KernelsStamp {
        dir: dir.to_string(),
        files: files.len(),
        sha256,
    }
}

/// Reads the `.cu` / `.cuh` files under `dir` (the `dev/` folder, scratch
/// work no configuration compiles, left out). `None` when the directory
/// cannot be read or holds no source: a CPU run without kernels is fine.
pub fn stamp_kernels(dir: &Path) -> Option<KernelsStamp> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files).ok()?;
    if files.is_empty() {
        return None;
    }
    Some(fingerprint(&dir.display().to_string(), files))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        if path.is_dir() {
            if rel != "dev" {
                collect(root, &path, out)?;
            }
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")) {
            out.push((rel, std::fs::read(&path)?));
        }
    }
    Ok(())
}

/// One line for `compare`: do the two runs' kernels match?
pub fn compare_line(base: Option<&KernelsStamp>, cand: Option<&KernelsStamp>) -> String {
    match (base, cand) {
        (Some(b), Some(c)) if b.sha256 == c.sha256 => {
            format!("kernels: the same sources in both runs (sha256 {})", b.short())
        }
        (Some(b), Some(c)) => format!(
            "kernels: baseline {} -> candidate {} (sources differ)",
            b.short(),
            c.short()
        ),
        _ => "kernels: not recorded in both runs (runs made before mlabench stamped its kernels)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(p, b)| (p.to_string(), b.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn fingerprint_ignores_order_and_sees_every_byte_and_name() {
        let a = fingerprint("k", files(&[("ps1.cu", "x"), ("common/a.cuh", "yz")]));
        let b = fingerprint("k", files(&[("common/a.cuh", "yz"), ("ps1.cu", "x")]));
        assert_eq!(a, b);
        assert_eq!(a.files, 2);
        assert_eq!(a.sha256.len(), 64);
        let edited = fingerprint("k", files(&[("ps1.cu", "x"), ("common/a.cuh", "yZ")]));
        let renamed = fingerprint("k", files(&[("ps2.cu", "x"), ("common/a.cuh", "yz")]));
        // Moving a byte across the file boundary must not collide.
        let shifted = fingerprint("k", files(&[("ps1.cu", "xy"), ("common/a.cuh", "z")]));
        for other in [&edited, &renamed, &shifted] {
            assert_ne!(a.sha256, other.sha256);
        }
    }

    #[test]
    fn stamps_the_cuda_sources_and_skips_dev() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("common")).unwrap();
        std::fs::create_dir_all(root.join("dev")).unwrap();
        std::fs::write(root.join("ps1.cu"), "kernel").unwrap();
        std::fs::write(root.join("common/core.cuh"), "header").unwrap();
        std::fs::write(root.join("ABI.md"), "docs").unwrap();
        std::fs::write(root.join("dev/scratch.cu"), "scratch").unwrap();
        let s = stamp_kernels(root).unwrap();
        assert_eq!(s.files, 2);
        let expect = fingerprint(
            &root.display().to_string(),
            files(&[("ps1.cu", "kernel"), ("common/core.cuh", "header")]),
        );
        assert_eq!(s, expect);
        // Docs and dev/ do not move the stamp; a source edit does.
        std::fs::write(root.join("ABI.md"), "more docs").unwrap();
        std::fs::write(root.join("dev/scratch.cu"), "more scratch").unwrap();
        assert_eq!(stamp_kernels(root).unwrap(), s);
        std::fs::write(root.join("common/core.cuh"), "header 2").unwrap();
        assert_ne!(stamp_kernels(root).unwrap().sha256, s.sha256);
        assert!(stamp_kernels(&root.join("missing")).is_none());
    }

    #[test]
    fn compare_line_says_same_differ_or_unknown() {
        let a = fingerprint("k", files(&[("a.cu", "1")]));
        let b = fingerprint("k", files(&[("a.cu", "2")]));
        assert!(compare_line(Some(&a), Some(&a)).contains("the same sources"));
        let d = compare_line(Some(&a), Some(&b));
        assert!(
            d.contains(a.short()) && d.contains(b.short()) && d.contains("differ"),
            "{d}"
        );
        assert!(compare_line(None, Some(&b)).contains("not recorded"));
    }
}
