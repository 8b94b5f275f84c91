//! Kernels identified by data: a source file under kernels/, its -D defines
//! and the entry points the host looks up. Pure data, shared with the build
//! without the `cuda` feature so variants can name their kernels anywhere.

use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct KernelSpec {
    /// Path relative to the kernels directory, e.g. `ps1.cu`.
    pub file: &'static str,
    /// `-D NAME=VALUE`, in the order given (part of the cache key).
    pub defines: Vec<(String, String)>,
    /// `extern "C"` names that must exist in the compiled module.
    pub entry_points: Vec<&'static str>,
}

impl KernelSpec {
    pub fn new(file: &'static str, entry_points: &[&'static str]) -> Self {
        KernelSpec {
            file,
            defines: Vec::new(),
            entry_points: entry_points.to_vec(),
        }
    }

    pub fn define(mut self, name: impl Into<String>, value: impl ToString) -> Self {
        self.defines.push((name.into(), value.to_string()));
        self
    }

    /// `-DNAME=VALUE` options, in order.
    pub fn define_options(&self) -> Vec<String> {
        self.defines.iter().map(|(k, v)| format!("-D{k}={v}")).collect()
    }

    /// `ps1.cu -DHEADS=64 -DFP8=1`: names one configuration in logs and errors.
    pub fn label(&self) -> String {
        let mut s = self.file.to_string();
        for d in self.define_options() {
            s.push(' ');
            s.push_str(&d);
        }
        s
    }

    /// `ps1.cu_-DHEADS=64_-DFP8=1.cubin`: the label as a file name, the same
    /// for a configuration in any kernels dir, so two dirs' cubins pair up
    /// (`mlabench kernels --check --cubins DIR`, scripts/sass-diff.py).
    pub fn cubin_name(&self) -> String {
        format!("{}.cubin", self.label().replace(' ', "_"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_lists_defines_in_order() {
        let s = KernelSpec::new("ps1.cu", &["ps1_decode"])
            .define("HEADS", 64)
            .define("FP8", 1);
        assert_eq!(s.label(), "ps1.cu -DHEADS=64 -DFP8=1");
        assert_eq!(
            s.define_options(),
            vec!["-DHEADS=64".to_string(), "-DFP8=1".to_string()]
        );
        assert_ne!(
            s,
            KernelSpec::new("ps1.cu", &["ps1_decode"])
                .define("FP8", 1)
                .define("HEADS", 64)
        );
        assert_eq!(s.cubin_name(), "ps1.cu_-DHEADS=64_-DFP8=1.cubin");
    }
}
