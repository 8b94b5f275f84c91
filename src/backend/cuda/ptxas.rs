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
    /// Fences ptxas put before wgmmas whose registers it saw written
    /// (C7519): each makes the next wgmma wait for those writes.
    pub arrives_injected: u32,
    /// Why ptxas serialised every wgmma of the entry (C751x: "insufficient
    /// register resources", "non wgmma instructions defining accumulator
    /// registers", ...): each then waits for the one before it, so the
    /// tensor pipe runs one instruction at a time.
    pub wgmma_serialized: Option<String>,
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
    // The wgmma advisories name their function and may come before its
    // `Compiling entry function` line.
    for line in log.lines() {
        if line.contains("warpgroup.arrive is injected") {
            if let Some(e) = entry_named(&mut out, line) {
                e.arrives_injected += 1;
            }
        } else if let Some(at) = line.find("instructions are serialized due to ") {
            let rest = &line[at + "instructions are serialized due to ".len()..];
            let reason = rest[..rest.find(" in the function '").unwrap_or(rest.len())].trim();
            let code = line
                .find("(C")
                .and_then(|i| line[i + 1..].find(')').map(|j| &line[i + 1..i + 1 + j]));
            if let Some(e) = entry_named(&mut out, line) {
                e.wgmma_serialized = Some(match code {
                    Some(c) => format!("{c}: {reason}"),
                    None => reason.to_string(),
                });
            }
        }
    }
    out
}

/// The entry an advisory line names (`... function 'NAME'`, last quote).
fn entry_named<'a>(out: &'a mut [EntryResources], line: &str) -> Option<&'a mut EntryResources> {
    let name = quoted_after(line, "function '")?;
    out.iter_mut().find(|e| e.entry == name)
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
                ..Default::default()
            }
        );
        assert_eq!(
            (r[1].entry.as_str(), r[1].registers, r[1].smem_bytes),
            ("ps1_reduce", 40, 2048)
        );
        assert_eq!(r[1].stack_bytes, 0, "the helper's 32-byte frame is not the reduce's");
    }

    #[test]
    fn reads_the_wgmma_advisories_of_each_entry() {
        // The advisories as ptxas prints them, before or after the entry's lines.
        let log = "\
ptxas info    : (C7519) warpgroup.arrive is injected in around line 3341 by compiler to allow use of registers in GMMA in function 'page64_fwd'
ptxas info    : (C7519) warpgroup.arrive is injected in around line 3430 by compiler to allow use of registers in GMMA in function 'page64_fwd'
ptxas info    : Compiling entry function 'page64_fwd' for 'sm_90a'
ptxas info    : Used 168 registers, used 6 barriers
ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function 'v4_split'
ptxas info    : Compiling entry function 'v4_split' for 'sm_90a'
ptxas info    : Used 128 registers, used 1 barriers
ptxas info    : Compiling entry function 'page64_merge' for 'sm_90a'
ptxas info    : Used 51 registers, used 0 barriers
";
        let r = parse(log);
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].arrives_injected, r[0].wgmma_serialized.as_deref()), (2, None));
        assert_eq!(r[1].arrives_injected, 0);
        assert_eq!(
            r[1].wgmma_serialized.as_deref(),
            Some("C7511: insufficient register resources for the wgmma pipeline")
        );
        assert_eq!((r[2].arrives_injected, r[2].wgmma_serialized.as_deref()), (0, None));
    }
}
