//! `mlabench selftest`: the harness tests its own checks. A catalog of
//! planted bugs (selftest/bugs.toml), each applied alone, must make rows
//! fail that pass without it. This module is the catalog and the verdicts;
//! running the planted copies is `app::selftest`.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

use crate::result::{Row, Status};

/// selftest/bugs.toml.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    #[serde(rename = "bug")]
    pub bugs: Vec<Bug>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bug {
    pub name: String,
    /// The kind of hole it probes (`empty partials`, `race`, ...).
    pub class: String,
    pub what: String,
    /// The same mistake planted in the CPU emulation (a `--cpu-fault` name).
    pub cpu_fault: Option<String>,
    /// Argument lists for `mlabench run`: the rows that must catch it.
    pub runs: Vec<Vec<String>>,
    /// Edits to a copy of kernels/ (the GPU form).
    #[serde(default)]
    pub patch: Vec<Patch>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    /// Relative to the kernels dir.
    pub file: String,
    /// Text that must occur exactly once.
    pub find: String,
    pub replace: String,
}

/// Which planted form a selftest runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Form {
    /// Kernel patches, run on the GPU.
    Gpu,
    /// Faults in the CPU emulation.
    Cpu,
}

impl Bug {
    /// Whether this bug has a planted form for `form`.
    pub fn has(&self, form: Form) -> bool {
        match form {
            Form::Gpu => !self.patch.is_empty(),
            Form::Cpu => self.cpu_fault.is_some(),
        }
    }
}

/// Parses and checks a catalog: unique names, something to run, a planted
/// form, patches that say what to find.
pub fn parse(text: &str) -> Result<Catalog, String> {
    let c: Catalog = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    let mut seen = std::collections::HashSet::new();
    for b in &c.bugs {
        let at = |m: &str| format!("bug `{}`: {m}", b.name);
        if !seen.insert(b.name.as_str()) {
            return Err(at("the name is used twice"));
        }
        if b.runs.is_empty() || b.runs.iter().any(|r| r.is_empty()) {
            return Err(at(
                "`runs` needs at least one non-empty argument list (a scenario first)",
            ));
        }
        if b.patch.is_empty() && b.cpu_fault.is_none() {
            return Err(at(
                "plants nothing: give a `patch` (GPU form), a `cpu_fault` (CPU form), or both",
            ));
        }
        if let Some(p) = b.patch.iter().find(|p| p.find.is_empty() || p.find == p.replace) {
            return Err(at(&format!("a patch of {} finds nothing or changes nothing", p.file)));
        }
        if let Some(f) = &b.cpu_fault {
            f.parse::<crate::variants::Fault>().map_err(|e| at(&e))?;
        }
    }
    Ok(c)
}

/// `source` with `p` applied; the text to find must occur exactly once, or
/// the catalog no longer matches the kernels it plants into.
pub fn apply(source: &str, p: &Patch) -> Result<String, String> {
    match source.matches(p.find.as_str()).count() {
        1 => Ok(source.replacen(&p.find, &p.replace, 1)),
        0 => Err(format!(
            "{}: the text to replace is not there (the kernel changed; update selftest/bugs.toml)",
            p.file
        )),
        n => Err(format!(
            "{}: the text to replace occurs {n} times; make `find` unique",
            p.file
        )),
    }
}

/// What a planted bug did to rows that pass without it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Caught {
    /// Rows that passed in the control and fail or error now.
    pub rows: usize,
    /// Rows that passed in the control and ran again.
    pub of: usize,
    /// Failed rows by the metric that tripped first.
    pub by: BTreeMap<String, usize>,
}

impl Caught {
    /// `lse_max_abs 14, cos_diff 3`.
    pub fn metrics(&self) -> String {
        let mut v: Vec<(&String, &usize)> = self.by.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    }
}

/// Judges a planted run's rows against the control run's: a row is caught
/// when it passed there and fails or errors here. Rows the control did not
/// pass (skips, forced xfails) prove nothing either way.
pub fn judge(control: &[Row], planted: &[Row]) -> Caught {
    let passed: HashMap<(&str, &str), ()> = control
        .iter()
        .filter(|r| r.status == Status::Pass)
        .map(|r| ((r.case_id.as_str(), r.variant.as_str()), ()))
        .collect();
    let mut c = Caught::default();
    for r in planted {
        if !passed.contains_key(&(r.case_id.as_str(), r.variant.as_str())) {
            continue;
        }
        c.of += 1;
        let metric = match r.status {
            Status::Fail => r
                .checks
                .iter()
                .find(|k| k.level == "kernel" && !k.pass)
                .map_or("check", |k| k.tripped())
                .to_string(),
            Status::Error => "error".to_string(),
            _ => continue,
        };
        c.rows += 1;
        *c.by.entry(metric).or_insert(0) += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::row;

    #[test]
    fn the_shipped_catalog_parses_and_covers_the_five_classes() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/selftest/bugs.toml")).unwrap();
        let c = parse(&text).unwrap();
        for class in ["empty partials", "race", "split boundary", "lse only", "replay"] {
            let bugs: Vec<&Bug> = c.bugs.iter().filter(|b| b.class == class).collect();
            assert!(bugs.iter().any(|b| b.has(Form::Gpu)), "a GPU bug of class {class}");
            assert!(bugs.iter().any(|b| b.has(Form::Cpu)), "a CPU bug of class {class}");
        }
    }

    #[test]
    fn every_patch_applies_to_todays_kernels_exactly_once() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/selftest/bugs.toml")).unwrap();
        for b in parse(&text).unwrap().bugs {
            let mut files: HashMap<String, String> = HashMap::new();
            for p in &b.patch {
                let path = format!("{}/kernels/{}", env!("CARGO_MANIFEST_DIR"), p.file);
                let src = files
                    .remove(&p.file)
                    .unwrap_or_else(|| std::fs::read_to_string(&path).unwrap());
                let out = apply(&src, p).unwrap_or_else(|e| panic!("bug {}: {e}", b.name));
                assert_ne!(out, src);
                files.insert(p.file.clone(), out);
            }
        }
    }

    #[test]
    fn apply_needs_exactly_one_match() {
        let p = |find: &str| Patch {
            file: "k.cu".into(),
            find: find.into(),
            replace: "B".into(),
        };
        assert_eq!(apply("xAy", &p("A")).unwrap(), "xBy");
        assert!(apply("xy", &p("A")).unwrap_err().contains("not there"));
        assert!(apply("AxA", &p("A")).unwrap_err().contains("2 times"));
    }

    #[test]
    fn bad_catalogs_name_the_bug_and_the_fix() {
        let one =
            |extra: &str| format!("[[bug]]\nname = \"b\"\nclass = \"c\"\nwhat = \"w\"\nruns = [[\"s.toml\"]]\n{extra}");
        assert!(parse(&one("")).unwrap_err().contains("plants nothing"));
        assert!(parse(&one("cpu_fault = \"nope\""))
            .unwrap_err()
            .contains("unknown CPU fault"));
        let twice = format!("{}\ncpu_fault = \"race\"\n{}\ncpu_fault = \"race\"", one(""), one(""));
        assert!(parse(&twice).unwrap_err().contains("used twice"));
        assert!(parse("[[bug]]\nname = 1").is_err());
    }

    #[test]
    fn only_rows_that_passed_without_the_bug_count() {
        let control = vec![
            row("a", "ps1", Status::Pass, "cuda-events"),
            row("b", "ps1", Status::Pass, "cuda-events"),
            row("c", "ps1", Status::XFail, "cuda-events"),
            row("d", "ps1", Status::Pass, "cuda-events"),
        ];
        let mut planted = vec![
            row("a", "ps1", Status::Fail, "cuda-events"),
            row("b", "ps1", Status::Error, "cuda-events"),
            row("c", "ps1", Status::Fail, "cuda-events"),
            row("d", "ps1", Status::Pass, "cuda-events"),
        ];
        planted[0].checks[0].why = "cos_diff 3e-2 >= 1e-5".into();
        let c = judge(&control, &planted);
        assert_eq!((c.rows, c.of), (2, 3), "the xfail row of the control proves nothing");
        assert_eq!(c.by.get("cos_diff"), Some(&1));
        assert_eq!(c.by.get("error"), Some(&1));
        assert_eq!(c.metrics(), "cos_diff 1, error 1");
    }
}
