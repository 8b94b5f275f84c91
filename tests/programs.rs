//! What a GPU would be asked to run, checked without one: for every case of
//! the smoke scenario, each variant's programs hold together (arguments and
//! outputs name buffers, poison fits, entry points are declared), every
//! kernel they launch is one `mlabench kernels --check` compiles, and one
//! program per pass is timed.

use std::path::Path;

use mlabench::case::Case;
use mlabench::runner::Caches;
use mlabench::variants::program::{Program, Smem};
use mlabench::variants::{self, Job, KernelSpec, PlanData};

/// Every smoke case a GPU would run, with its variant's kernels and programs.
fn for_each_smoke_program(mut f: impl FnMut(&Case, &[KernelSpec], &[Program])) {
    let sc = mlabench::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
    let mut cases = mlabench::scenario::expand(&sc).cases;
    // Cases sharing inputs next to each other, as a run orders them.
    cases.sort_by(|a, b| a.data_id.cmp(&b.data_id));
    let mut caches = Caches::default();
    for case in &cases {
        let d = variants::decide(case);
        if d.skip.is_some() {
            continue;
        }
        let unit = case.variant.unit();
        let inputs = caches.get(case, Some(2)).unwrap();
        let (wl, refs) = (&*inputs.workload, &*inputs.refs);
        let plan = unit
            .plan(case, &d, Some(PlanData { workload: wl, refs }))
            .unwrap_or_else(|e| panic!("{}: {e}", case.key()));
        let job = Job {
            case,
            workload: wl,
            plan: &plan,
            rows: &refs.rows,
        };
        let programs = unit.programs(&job).unwrap_or_else(|e| panic!("{}: {e}", case.key()));
        f(case, &unit.kernels(case, &d), &programs);
    }
}

#[test]
fn smoke_programs_validate_and_launch_only_checked_kernels() {
    let compiled = variants::all_kernels();
    let mut checked = 0;
    for_each_smoke_program(|case, launched, programs| {
        assert!(!programs.is_empty(), "{}: no program", case.key());
        assert_eq!(
            programs.iter().filter(|p| p.timed).count(),
            1,
            "{}: one pass is timed",
            case.key()
        );
        for p in programs {
            p.validate().unwrap_or_else(|e| panic!("{}: {e}", case.key()));
            for c in &p.calls {
                assert!(
                    launched.contains(&c.kernel),
                    "{}: launches {} outside the variant's kernels()",
                    case.key(),
                    c.kernel.label()
                );
                assert!(
                    compiled.contains(&c.kernel),
                    "{}: {} is not compiled by CI",
                    case.key(),
                    c.kernel.label()
                );
            }
        }
        checked += 1;
    });
    assert!(checked > 100, "only {checked} smoke cases run");
}

/// A second kernel launched as a programmatic dependent runs so only where
/// its module defines `mlab_pdl_waits` (kernels/common/pdl.cuh); else the
/// host launches it in stream order, and a lost include would show only as
/// time. One configuration per file: the symbol comes from an include.
#[cfg(feature = "cuda")]
#[test]
fn modules_of_dependent_launches_say_they_wait() {
    use mlabench::backend::cuda::{device::elf_has_symbol, Compiler};
    use std::collections::BTreeMap;
    let mut files = BTreeMap::new();
    for_each_smoke_program(|_, _, programs| {
        for c in programs.iter().flat_map(|p| &p.calls).filter(|c| c.dependent) {
            files.entry(c.kernel.file).or_insert_with(|| c.kernel.clone());
        }
    });
    for f in ["merge.cu", "ps1.cu", "ps1_wg.cu", "page64.cu", "page64_wg.cu"] {
        assert!(files.contains_key(f), "smoke launches no dependent of {f}: {files:?}");
    }
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let compiler = match Compiler::new(&kernels, "sm_90a") {
        Ok(c) => c,
        Err(e) if std::env::var("MLABENCH_REQUIRE_NVRTC").is_ok_and(|v| v == "1") => {
            panic!("MLABENCH_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}")
        }
        Err(e) => return eprintln!("skipping the NVRTC part: {e}"),
    };
    for spec in files.values() {
        let cubin = compiler
            .compile(spec)
            .unwrap_or_else(|e| panic!("{}: {e}", spec.label()))
            .cubin;
        assert!(
            elf_has_symbol(&cubin, "mlab_pdl_waits"),
            "{} is launched as a dependent but does not define mlab_pdl_waits",
            spec.label()
        );
    }
}

/// v4_split's one-split plans launch `v4_split_one` alone, on either core
/// (it adds the sink itself); every other plan keeps the stage-1 kernel
/// and a merge after it.
#[test]
fn v4_split_launches_the_one_split_entry_exactly_for_one_split_plans() {
    use mlabench::variants::v4::V4Core;
    use mlabench::variants::v4_split::{plan::SplitPlan, ONE_SPLIT_ENTRY};
    let sc = mlabench::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
    let mut caches = Caches::default();
    let (mut one, mut two) = ([0, 0], 0);
    for case in mlabench::scenario::expand(&sc).cases {
        if case.variant != mlabench::variants::v4_split::ID {
            continue;
        }
        let d = variants::decide(&case);
        let unit = case.variant.unit();
        let inputs = caches.get(&case, Some(2)).unwrap();
        let (wl, refs) = (&*inputs.workload, &*inputs.refs);
        let plan = unit.plan(&case, &d, Some(PlanData { workload: wl, refs })).unwrap();
        let s = plan.of::<SplitPlan>().unwrap();
        let job = Job {
            case: &case,
            workload: wl,
            plan: &plan,
            rows: &refs.rows,
        };
        let programs = unit.programs(&job).unwrap();
        let calls = &programs[0].calls;
        if s.n == 1 {
            assert_eq!(calls.len(), 1, "{}: the one-split entry alone", case.key());
            assert_eq!(calls[0].entry, ONE_SPLIT_ENTRY, "{}", case.key());
            assert_eq!(calls[0].grid.2, 1, "{}: one split", case.key());
            assert!(
                calls[0].kernel.entry_points.contains(&ONE_SPLIT_ENTRY),
                "{}",
                case.key()
            );
            one[usize::from(s.core().0 == V4Core::Wg)] += 1;
        } else {
            assert_eq!(calls.len(), 2, "{}: stage 1 and a merge", case.key());
            assert_eq!(calls[0].entry, "v4_split", "{}", case.key());
            assert!(calls[1].entry.starts_with("split_merge"), "{}", case.key());
            // The merge may start during stage 1 (it waits on the device).
            assert!(calls[1].second && calls[1].dependent, "{}", case.key());
            assert_eq!(calls[1].smem, Smem::DependentMerge, "{}", case.key());
            two += 1;
        }
    }
    assert!(
        one[0] >= 2 && one[1] >= 2 && two >= 10,
        "smoke covers both launches: {one:?} one-split (mma, wgmma), {two} two-kernel"
    );
}
