//! What a GPU would be asked to run, checked without one: for every case of
//! the smoke scenario, each variant's programs hold together (arguments and
//! outputs name buffers, poison fits, entry points are declared), every
//! kernel they launch is one `mlabench kernels --check` compiles, and one
//! program per pass is timed.

use std::path::Path;

use mlabench::runner::Caches;
use mlabench::variants::{self, Job, PlanData};

#[test]
fn smoke_programs_validate_and_launch_only_checked_kernels() {
    let sc = mlabench::scenario::load(Path::new("scenarios/smoke.toml")).unwrap();
    let mut cases = mlabench::scenario::expand(&sc).cases;
    // Cases sharing inputs next to each other, as a run orders them.
    cases.sort_by(|a, b| a.data_id.cmp(&b.data_id));
    let compiled = variants::all_kernels();
    let mut caches = Caches::default();
    let mut checked = 0;
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
        assert!(!programs.is_empty(), "{}: no program", case.key());
        assert_eq!(
            programs.iter().filter(|p| p.timed).count(),
            1,
            "{}: one pass is timed",
            case.key()
        );
        let launched = unit.kernels(case, &d);
        for p in &programs {
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
    }
    assert!(checked > 100, "only {checked} smoke cases run");
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
            two += 1;
        }
    }
    assert!(
        one[0] >= 2 && one[1] >= 2 && two >= 10,
        "smoke covers both launches: {one:?} one-split (mma, wgmma), {two} two-kernel"
    );
}
