//! How much memory this machine can give a case, and `--max-memory` sizes.

use crate::error::InputError;

/// Bytes of host memory free for this process: `MemAvailable`, capped by a
/// cgroup (v2) limit minus what the group already uses. `None` where
/// neither can be read (not Linux).
pub fn host_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let avail = meminfo.as_deref().and_then(mem_available);
    let cgroup = cgroup_headroom(
        std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().as_deref(),
        std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok().as_deref(),
    );
    match (avail, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A cgroup v2 limit minus usage; `max` means no limit.
fn cgroup_headroom(max: Option<&str>, current: Option<&str>) -> Option<u64> {
    let max: u64 = max?.trim().parse().ok()?;
    let cur: u64 = current.and_then(|c| c.trim().parse().ok()).unwrap_or(0);
    Some(max.saturating_sub(cur))
}

/// `--max-memory`: bytes, or a number with K, M, G or T (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, InputError> {
    let t = text.trim();
    let bad = || {
        InputError::Usage(format!(
            "--max-memory {text}: give a size such as 16G, 512M or 1073741824 (bytes)"
        ))
    };
    let (num, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&t[..i], t[i..].trim()),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    let x: f64 = num.parse().map_err(|_| bad())?;
    let bytes = x * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("16G").unwrap(), 16 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        for bad in ["", "G", "-1G", "12Q", "0", "1e400"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn available_memory_is_read_from_meminfo_and_the_cgroup() {
        let info = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(mem_available(info), Some(20_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(cgroup_headroom(Some("max\n"), Some("5")), None);
        assert_eq!(cgroup_headroom(Some("1000\n"), Some("300\n")), Some(700));
        assert_eq!(cgroup_headroom(Some("1000"), Some("3000")), Some(0));
    }
}
