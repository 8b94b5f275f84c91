//! What `mlabench device` shows: device facts, toolchain, measured ceilings.
//! Pure data, shared with the build without the `cuda` feature.

use serde::Serialize;

use crate::tensor_ceiling::{MmaKind, TensorRates};

/// Facts the driver reports about one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceProps {
    pub ordinal: usize,
    pub name: String,
    pub sm_count: usize,
    pub l2_bytes: usize,
    pub total_mem_bytes: usize,
    pub compute_capability: (i32, i32),
    /// Rated maximum clocks (driver attributes), not the clock of the moment.
    pub sm_clock_mhz: f64,
    pub mem_clock_mhz: f64,
    pub mem_bus_bits: u32,
    /// Largest dynamic + static shared memory one block may opt into.
    pub max_smem_per_block_optin: usize,
    /// Shared memory of one SM, and what the system keeps of it per block:
    /// they decide how many blocks of a given size fit on an SM.
    pub max_smem_per_sm: usize,
    pub reserved_smem_per_block: usize,
    /// `(13, 0)` for a driver that supports CUDA 13.0.
    pub driver_version: (i32, i32),
}

/// Measured ceilings that reports divide achieved rates by.
#[derive(Clone, Debug, Serialize)]
pub struct Ceilings {
    /// Device-to-device copy, bytes read + written, GB/s (1e9).
    pub copy_gbps: f64,
    /// Which copy gave `copy_gbps` (`cuMemcpyDtoD` or the 16-byte copy kernel).
    pub copy_method: String,
    /// Both copies' medians, for the record.
    pub memcpy_gbps: f64,
    pub copy_kernel_gbps: f64,
    /// Bytes of one copy's source buffer.
    pub copy_buffer_bytes: usize,
    /// Dense tensor rate of each instruction kind, TFLOP/s (1e12); the
    /// wgmma ones only on sm_90a.
    pub tensor: TensorRates,
    /// Read-only rate of the gather probe with rows in order, GB/s.
    pub read_gbps: f64,
    /// Read-only rate of rows gathered in random order, per row size.
    pub gather: Vec<GatherCeiling>,
    /// Timed runs behind each median.
    pub samples: usize,
}

/// Read rate of one row size in random order: what a page-size-1 KV cache
/// of such rows can stream at best.
#[derive(Clone, Debug, Serialize)]
pub struct GatherCeiling {
    pub row_bytes: usize,
    /// Bytes read, GB/s (1e9).
    pub gbps: f64,
}

/// Cost of launching an empty kernel.
#[derive(Clone, Debug, Serialize)]
pub struct LaunchOverhead {
    /// Median between device events around one launch queued ahead of
    /// the GPU (device-side cost, host latency excluded), microseconds.
    pub events_us: f64,
    /// Per launch inside a replayed graph, microseconds.
    pub graph_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    pub props: DeviceProps,
    pub nvrtc_version: (i32, i32),
    /// How libnvrtc was found.
    pub nvrtc_source: String,
    pub arch: String,
    pub cuda_include: String,
    pub kernel_cache: Option<String>,
    pub ceilings: Option<Ceilings>,
    pub launch: Option<LaunchOverhead>,
}

impl DeviceReport {
    /// `(key, value)` lines for a terminal table, in reading order.
    pub fn lines(&self) -> Vec<(String, String)> {
        let p = &self.props;
        let mut v = vec![
            ("device".to_string(), format!("{} (ordinal {})", p.name, p.ordinal)),
            (
                "compute capability".into(),
                format!("{}.{} -> {}", p.compute_capability.0, p.compute_capability.1, self.arch),
            ),
            ("SMs".into(), p.sm_count.to_string()),
            ("L2".into(), format!("{:.1} MiB", p.l2_bytes as f64 / (1 << 20) as f64)),
            (
                "memory".into(),
                format!(
                    "{:.1} GiB, {}-bit bus",
                    p.total_mem_bytes as f64 / (1u64 << 30) as f64,
                    p.mem_bus_bits
                ),
            ),
            (
                "max clocks (rated)".into(),
                format!("SM {:.0} MHz, memory {:.0} MHz", p.sm_clock_mhz, p.mem_clock_mhz),
            ),
            (
                "smem per block (opt-in)".into(),
                format!("{} KiB", p.max_smem_per_block_optin / 1024),
            ),
            (
                "driver".into(),
                format!("CUDA {}.{}", p.driver_version.0, p.driver_version.1),
            ),
            (
                "NVRTC".into(),
                format!(
                    "{}.{} ({})",
                    self.nvrtc_version.0, self.nvrtc_version.1, self.nvrtc_source
                ),
            ),
            ("CUDA headers".into(), self.cuda_include.clone()),
            (
                "kernel cache".into(),
                self.kernel_cache.clone().unwrap_or_else(|| "off".into()),
            ),
        ];
        match &self.ceilings {
            Some(c) => {
                v.push((
                    "copy bandwidth".into(),
                    format!(
                        "{:.0} GB/s read+write ({}; memcpy {:.0}, kernel {:.0}; {} MiB buffers, median of {})",
                        c.copy_gbps,
                        c.copy_method,
                        c.memcpy_gbps,
                        c.copy_kernel_gbps,
                        c.copy_buffer_bytes >> 20,
                        c.samples
                    ),
                ));
                let rows: Vec<String> = c
                    .gather
                    .iter()
                    .map(|g| {
                        format!(
                            "{} B rows {:.0} GB/s ({:.0}% of copy)",
                            g.row_bytes,
                            g.gbps,
                            100.0 * g.gbps / c.copy_gbps
                        )
                    })
                    .collect();
                v.push((
                    "read bandwidth".into(),
                    format!("{:.0} GB/s in order; random order: {}", c.read_gbps, rows.join(", ")),
                ));
                let rates: Vec<String> = MmaKind::ALL
                    .iter()
                    .map(|&k| match c.tensor.get(k) {
                        Some(t) => format!("{k} {t:.1} TFLOP/s"),
                        None => format!("{k} not measured (needs sm_90a)"),
                    })
                    .collect();
                v.push((
                    "tensor rates".into(),
                    format!("{} (dense, median of {})", rates.join(", "), c.samples),
                ));
            }
            None => v.push(("ceilings".into(), "not measured".into())),
        }
        if let Some(l) = &self.launch {
            v.push((
                "empty kernel".into(),
                format!(
                    "{:.2} us (events), {:.2} us per launch in a graph",
                    l.events_us, l.graph_us
                ),
            ));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_measured_values() {
        let r = DeviceReport {
            props: DeviceProps {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                sm_count: 132,
                l2_bytes: 60 << 20,
                total_mem_bytes: 140 << 30,
                compute_capability: (9, 0),
                sm_clock_mhz: 1980.0,
                mem_clock_mhz: 3201.0,
                mem_bus_bits: 6144,
                max_smem_per_block_optin: 232448,
                max_smem_per_sm: 233472,
                reserved_smem_per_block: 1024,
                driver_version: (13, 0),
            },
            nvrtc_version: (13, 0),
            nvrtc_source: "LD_LIBRARY_PATH".into(),
            arch: "sm_90a".into(),
            cuda_include: "/usr/local/cuda/include".into(),
            kernel_cache: None,
            ceilings: Some(Ceilings {
                copy_gbps: 4312.4,
                copy_method: "cuMemcpyDtoD".into(),
                memcpy_gbps: 4312.4,
                copy_kernel_gbps: 4100.0,
                copy_buffer_bytes: 2 << 30,
                tensor: TensorRates {
                    mma_sync_bf16_tflops: Some(612.3),
                    wgmma_bf16_tflops: Some(780.31),
                    wgmma_e4m3_tflops: None,
                },
                read_gbps: 3900.0,
                gather: vec![
                    GatherCeiling {
                        row_bytes: 576,
                        gbps: 2587.4,
                    },
                    GatherCeiling {
                        row_bytes: 1152,
                        gbps: 3449.9,
                    },
                ],
                samples: 10,
            }),
            launch: None,
        };
        let lines = r.lines();
        let get = |k: &str| lines.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone()).unwrap();
        assert_eq!(get("SMs"), "132");
        assert_eq!(get("L2"), "60.0 MiB");
        assert_eq!(get("compute capability"), "9.0 -> sm_90a");
        assert!(get("copy bandwidth").starts_with("4312 GB/s"));
        assert_eq!(
            get("tensor rates"),
            "mma.sync bf16 612.3 TFLOP/s, wgmma bf16 780.3 TFLOP/s, wgmma e4m3 not measured (needs sm_90a) (dense, median of 10)"
        );
        assert_eq!(
            get("read bandwidth"),
            "3900 GB/s in order; random order: 576 B rows 2587 GB/s (60% of copy), 1152 B rows 3450 GB/s (80% of copy)"
        );
        assert_eq!(get("kernel cache"), "off");
    }
}
