//! The one place that writes a run's result files.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{csv, json, markdown, RunMeta};
use crate::result::{Row, Status};

pub const ROWS_CSV: &str = "rows.csv";
pub const ROWS_JSON: &str = "rows.json";
pub const SUMMARY_MD: &str = "summary.md";

/// How often rows.json and summary.md are rewritten during a run.
pub const FULL_WRITE_EVERY: Duration = Duration::from_secs(2);

/// Owns `results/<run-id>/`. Each row is appended to rows.csv as its case
/// ends, so a crash loses nothing already measured. rows.json and
/// summary.md are rewritten atomically (temp + rename: a reader never sees
/// half a file) at most every [`FULL_WRITE_EVERY`], right after a failing
/// row, and at the end: rewriting them after every row made a 2000-row
/// sweep spend most of its host time serializing (quadratic).
pub struct RunDir {
    path: PathBuf,
    meta: RunMeta,
    rows: Vec<Row>,
    full_every: Duration,
    last_full: Instant,
    /// rows.json and summary.md lag the rows.
    stale: bool,
    /// rows.csv does not hold exactly the rows (a resumed run before its
    /// first write): the next write rewrites it instead of appending.
    csv_stale: bool,
}

impl RunDir {
    /// Creates `root/<run_id>/` and writes the (empty) files. An existing
    /// run directory is an error: results are never overwritten.
    pub fn create(root: &Path, meta: RunMeta) -> anyhow::Result<RunDir> {
        Self::create_with(root, meta, false)
    }

    /// [`RunDir::create`] for a run id the user did not choose: a run started
    /// in the same instant gets the next free `-2`, `-3`, ... instead of an error.
    pub fn create_unique(root: &Path, meta: RunMeta) -> anyhow::Result<RunDir> {
        Self::create_with(root, meta, true)
    }

    fn create_with(root: &Path, mut meta: RunMeta, unique: bool) -> anyhow::Result<RunDir> {
        let base = meta.run_id.clone();
        let id = base.as_str();
        if id.is_empty() || id == "." || id == ".." || id.contains(['/', '\\']) {
            bail!("run id `{id}` is not a plain directory name; pick one without path separators");
        }
        fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let mut n = 1;
        let path = loop {
            let path = root.join(&meta.run_id);
            match fs::create_dir(&path) {
                Ok(()) => break path,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && unique && n < 1000 => {
                    n += 1;
                    meta.run_id = format!("{base}-{n}");
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    bail!(
                        "{} already exists; pass another run id or move the old results away",
                        path.display()
                    )
                }
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        };
        let mut dir = RunDir {
            path,
            meta,
            rows: Vec::new(),
            full_every: FULL_WRITE_EVERY,
            last_full: Instant::now(),
            stale: false,
            csv_stale: false,
        };
        dir.write_all()?;
        Ok(dir)
    }

    /// Reopens a run a deadline or a crash cut short: its meta and every row
    /// except errors (`status = error`: device lost, launch failures), which
    /// the caller runs again. Nothing is written until the first row or
    /// `finish`, so a resume the caller refuses leaves the files alone.
    pub fn resume(path: &Path) -> anyhow::Result<RunDir> {
        let json = path.join(ROWS_JSON);
        let text = fs::read_to_string(&json).with_context(|| {
            format!(
                "{}: not a run directory to resume (no readable rows.json)",
                path.display()
            )
        })?;
        let (meta, mut rows) =
            json::parse(&text).with_context(|| format!("{}: not an mlabench rows.json", json.display()))?;
        rows.retain(|r| r.status != Status::Error);
        Ok(RunDir {
            path: path.to_path_buf(),
            meta,
            rows,
            full_every: FULL_WRITE_EVERY,
            last_full: Instant::now(),
            stale: true,
            csv_stale: true,
        })
    }

    /// Reopens a finished run to render it again (`mlabench report`): every
    /// row, errors included.
    pub fn reopen(path: &Path) -> anyhow::Result<RunDir> {
        let json = path.join(ROWS_JSON);
        let text = fs::read_to_string(&json)
            .with_context(|| format!("{}: not a run directory (no readable rows.json)", path.display()))?;
        let (meta, rows) =
            json::parse(&text).with_context(|| format!("{}: not an mlabench rows.json", json.display()))?;
        Ok(RunDir {
            path: path.to_path_buf(),
            meta,
            rows,
            full_every: FULL_WRITE_EVERY,
            last_full: Instant::now(),
            stale: true,
            csv_stale: true,
        })
    }

    /// Rows to amend before `finish` rewrites the files.
    pub fn rows_mut(&mut self) -> &mut [Row] {
        &mut self.rows
    }

    /// Rewrites rows.json and summary.md at most this often (tests: zero).
    pub fn with_full_write_every(mut self, every: Duration) -> RunDir {
        self.full_every = every;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn meta(&self) -> &RunMeta {
        &self.meta
    }

    pub fn meta_mut(&mut self) -> &mut RunMeta {
        &mut self.meta
    }

    /// Appends a row to rows.csv; refreshes rows.json and summary.md when
    /// they are due or the row failed.
    pub fn push(&mut self, row: Row) -> anyhow::Result<()> {
        let failed = matches!(row.status, Status::Fail | Status::Error);
        self.rows.push(row);
        if self.csv_stale {
            return self.write_all();
        }
        let bytes = csv::render_rows(&self.rows[self.rows.len() - 1..])?;
        let path = self.path.join(ROWS_CSV);
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        f.write_all(&bytes)
            .with_context(|| format!("appending to {}", path.display()))?;
        self.stale = true;
        if failed || self.last_full.elapsed() >= self.full_every {
            self.write_full()?;
        }
        Ok(())
    }

    /// Applies late facts (e.g. the reference throughput) and rewrites
    /// every file.
    pub fn finish(&mut self, meta_update: impl FnOnce(&mut RunMeta)) -> anyhow::Result<()> {
        meta_update(&mut self.meta);
        self.write_all()
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    fn write_all(&mut self) -> anyhow::Result<()> {
        write_atomic(&self.path.join(ROWS_CSV), &csv::render(&self.rows)?)?;
        self.csv_stale = false;
        self.write_full()
    }

    /// rows.json and summary.md.
    fn write_full(&mut self) -> anyhow::Result<()> {
        self.last_full = Instant::now();
        self.stale = false;
        write_atomic(
            &self.path.join(ROWS_JSON),
            json::render(&self.meta, &self.rows)?.as_bytes(),
        )?;
        write_atomic(
            &self.path.join(SUMMARY_MD),
            markdown::render(&self.meta, &self.rows).as_bytes(),
        )
    }
}

impl Drop for RunDir {
    /// A run that ends early (an error, a panic) still leaves whole files.
    fn drop(&mut self) {
        // A resumed run that never wrote (refused, or nothing ran) stays as it was.
        if self.stale && !self.csv_stale {
            let _ = self.write_full();
        }
    }
}

/// Writes a sibling temp file, syncs it and renames it over `path`: the
/// rename is atomic on one file system, so `path` is always whole.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testutil::{meta, row, skipped};
    use crate::result::Status;

    fn csv_data_lines(dir: &RunDir) -> usize {
        let mut rd = ::csv::Reader::from_path(dir.path().join(ROWS_CSV)).unwrap();
        rd.records().collect::<Result<Vec<_>, _>>().unwrap().len()
    }

    fn json_rows(dir: &RunDir) -> serde_json::Value {
        let text = fs::read_to_string(dir.path().join(ROWS_JSON)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn files_follow_every_push() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = RunDir::create(&root.path().join("results"), meta())
            .unwrap()
            .with_full_write_every(Duration::ZERO);
        assert_eq!(dir.path(), root.path().join("results").join("20250101-000000"));
        assert_eq!(csv_data_lines(&dir), 0);
        assert!(fs::read_to_string(dir.path().join(SUMMARY_MD))
            .unwrap()
            .contains("0 passed"));

        dir.push(row("mla-a", "ps1", Status::Pass, "cuda-events")).unwrap();
        assert_eq!(csv_data_lines(&dir), 1);
        dir.push(skipped("mla-a", "page64")).unwrap();
        assert_eq!(csv_data_lines(&dir), 2);
        assert_eq!(json_rows(&dir)["rows"][1]["variant"], "page64");
        assert!(fs::read_to_string(dir.path().join(SUMMARY_MD))
            .unwrap()
            .contains("1 passed, 0 failed, 1 skipped"));

        assert_eq!(json_rows(&dir)["meta"]["reference_gflops"], serde_json::Value::Null);
        dir.finish(|m| m.reference_gflops = Some(3.5)).unwrap();
        assert_eq!(json_rows(&dir)["meta"]["reference_gflops"], 3.5);
        assert_eq!(dir.rows().len(), 2);

        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [ROWS_CSV, ROWS_JSON, SUMMARY_MD],
            "only the three files, no temp leftovers"
        );
    }

    #[test]
    fn csv_follows_every_row_and_the_rest_catches_up() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = RunDir::create(root.path(), meta())
            .unwrap()
            .with_full_write_every(Duration::from_secs(3600));
        dir.push(row("mla-a", "ps1", Status::Pass, "cuda-events")).unwrap();
        dir.push(skipped("mla-a", "page64")).unwrap();
        assert_eq!(csv_data_lines(&dir), 2, "rows.csv has every row at once");
        assert_eq!(json_rows(&dir)["rows"].as_array().unwrap().len(), 0, "rows.json waits");
        // A failing row is written everywhere at once.
        dir.push(row("mla-b", "ps1", Status::Fail, "cuda-events")).unwrap();
        assert_eq!(json_rows(&dir)["rows"].as_array().unwrap().len(), 3);
        assert!(fs::read_to_string(dir.path().join(SUMMARY_MD))
            .unwrap()
            .contains("1 failed"));
        dir.push(row("mla-c", "ps1", Status::Pass, "cuda-events")).unwrap();
        // The appended file equals the one written whole at the end.
        let appended = fs::read(dir.path().join(ROWS_CSV)).unwrap();
        assert_eq!(appended, csv::render(dir.rows()).unwrap());
        let path = dir.path().to_path_buf();
        drop(dir);
        let text = fs::read_to_string(path.join(ROWS_JSON)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["rows"].as_array().unwrap().len(), 4, "dropping the run flushes it");
    }

    #[test]
    fn resume_keeps_rows_but_errors() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = RunDir::create(root.path(), meta()).unwrap();
        dir.push(row("mla-a", "ps1", Status::Pass, "cuda-events")).unwrap();
        let mut lost = row("mla-b", "ps1", Status::Error, "cuda-events");
        lost.reason = "not run: the device was lost".into();
        dir.push(lost).unwrap();
        let path = dir.path().to_path_buf();
        drop(dir);
        let before = fs::read(path.join(ROWS_JSON)).unwrap();
        drop(RunDir::resume(&path).unwrap());
        assert_eq!(
            fs::read(path.join(ROWS_JSON)).unwrap(),
            before,
            "an unused resume writes nothing"
        );
        let mut again = RunDir::resume(&path).unwrap();
        assert_eq!(again.rows().len(), 1);
        assert_eq!(again.rows()[0].case_id, "mla-a");
        again.push(row("mla-b", "ps1", Status::Pass, "cuda-events")).unwrap();
        assert_eq!(csv_data_lines(&again), 2, "rows.csv rewritten without the error row");
        again.finish(|_| {}).unwrap();
        assert_eq!(json_rows(&again)["rows"].as_array().unwrap().len(), 2);
        assert!(RunDir::resume(&root.path().join("nope")).is_err());
    }

    #[test]
    fn never_overwrites_a_run_and_rejects_path_like_ids() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = RunDir::create(root.path(), meta()).unwrap();
        dir.push(row("mla-a", "ps1", Status::Pass, "cuda-events")).unwrap();
        let err = RunDir::create(root.path(), meta()).err().unwrap().to_string();
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(csv_data_lines(&dir), 1, "the first run's rows survive");
        let a = RunDir::create_unique(root.path(), meta()).unwrap();
        let b = RunDir::create_unique(root.path(), meta()).unwrap();
        assert_eq!(a.meta().run_id, "20250101-000000-2");
        assert_eq!(b.meta().run_id, "20250101-000000-3");
        assert_ne!(
            a.path(),
            b.path(),
            "two runs in the same instant never share a directory"
        );
        let mut m = meta();
        m.run_id = "../escape".into();
        assert!(RunDir::create(root.path(), m).is_err());
        assert!(!root.path().parent().unwrap().join("escape").exists());
    }
}
