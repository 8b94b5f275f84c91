//! Registers, spills, stack and static shared memory of each entry point,
//! from ptxas's verbose report (NVRTC `--ptxas-options=-v`): what a kernel
//! engineer reads first after a change, and no GPU is needed for it.

use serde::Serialize;

/// What ptxas says about one entry point.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EntryResources {
    pub entry: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    /// Static shared memory; dynamic shared memory is a launch argument.
    pub smem_bytes: u32,
    pub barriers: u32,
}

/// The entry points ptxas compiled, in the order it reports them.
///
/// The report gives, per function, a `Compiling entry function 'NAME'`
/// line, then `N bytes stack frame, N bytes spill stores, N bytes spill
/// loads` and `Used N registers, ...`; device functions (not entries) get
/// properties lines too and are skipped.
pub fn parse(log: &str) -> Vec<EntryResources> {
    let mut out: Vec<EntryResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in log.lines() {
        let line = line.trim();
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            out.push(EntryResources {
                entry: name.to_string(),
                ..Default::default()
            });
            current = Some(out.len() - 1);
            continue;
        }
        if let Some(name) = line.split("Function properties for ").nth(1) {
            // Properties of a device function: not an entry point's.
            current = out.iter().position(|e| e.entry == name.trim());
            continue;
        }
        let Some(e) = current.map(|i| &mut out[i]) else {
            continue;
        };
        if line.contains("bytes stack frame") {
            e.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            e.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            e.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used ") && line.contains(" registers") {
            e.registers = number_before(line, "registers").unwrap_or(0);
            e.barriers = number_before(line, "barriers").unwrap_or(0);
            e.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    Some(&rest[..rest.find('\'')?])
}

/// The integer just before `unit` ("168 registers" -> 168).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let head = line[..line.find(unit)?].trim_end();
    let digits: String = head
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_entries_and_skips_device_functions() {
        let log = "\
ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function 'ps1_fwd' for 'sm_90a'
ptxas info    : Function properties for ps1_fwd
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 576 bytes cmem[0]
ptxas info    : Function properties for helper
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'ps1_reduce' for 'sm_90a'
ptxas info    : Function properties for ps1_reduce
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 2048 bytes smem, 400 bytes cmem[0]
";
        let r = parse(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            EntryResources {
                entry: "ps1_fwd".into(),
                registers: 168,
                spill_stores: 4,
                spill_loads: 12,
                stack_bytes: 8,
                smem_bytes: 0,
                barriers: 1,
            }
        );
        assert_eq!(
            (r[1].entry.as_str(), r[1].registers, r[1].smem_bytes),
            ("ps1_reduce", 40, 2048)
        );
        assert_eq!(r[1].stack_bytes, 0, "the helper's 32-byte frame is not the reduce's");
    }
}
