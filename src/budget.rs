//! Memory a case needs, from its lengths alone, before anything is built.
//!
//! A case too large for the machine used to die in the allocator or on an
//! i32 that wrapped, halfway through a run. Here every size is u64 with
//! checked arithmetic and every count the kernels keep in an i32 is checked
//! against it, so an absurd case becomes an error value the run can report.
//! Nothing of the case's size is allocated: the real planners are asked only
//! when their inputs are small enough to be cheap, else their outputs are
//! bounded.
//!
//! `host` is the peak over the stages of one case (build, reference, plan,
//! run, check), each holding what the earlier ones left plus its own scratch.
//! Caches carried over from the previous case and `--dump` are not counted.

use std::fmt;

use thiserror::Error;

use crate::case::{
    Case, CaseParams, Dtype, LayerType, MlaParams, V4Params, MLA_D_QK, MLA_D_V, V4_D, V4_D_ROPE, V4_REPLAY_GROWTH,
    V4_WINDOW,
};
use crate::variants::hca_persist::plan as hca;
use crate::variants::hca_persist::{self as hca_unit, HcaPersistPlan};
use crate::variants::heads;
use crate::variants::page64::{self as page64_unit, Page64Plan};
use crate::variants::ps1::worklist;
use crate::variants::ps1::{self as ps1_unit, Ps1Plan};
use crate::variants::v4_split::plan as pv4;
use crate::variants::v4_split::plan::SplitPlan;
use crate::variants::{self, dcp_combine, split_merge, v4_split, Decision, Plan};
use crate::workload::v4::POOL_ROW_CAP;

/// Bytes a case needs, by where they live, with the parts named for messages.
///
/// `parts` are those of the peak: their host bytes add up to `host`, their
/// device bytes to `device`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub host: u64,
    pub device: u64,
    pub parts: Vec<Part>,
}

/// One named group of buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub what: &'static str,
    pub host: u64,
    pub device: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SizeError {
    /// Size arithmetic overflowed u64.
    #[error("size overflow: {0}")]
    Overflow(String),
    /// A count the kernels' i32 ABI cannot hold (e.g. total KV tokens of a rank, pages, list entries, qo rows, T+1).
    #[error("unrepresentable: {0}")]
    Unrepresentable(String),
}

/// Which backend runs the case: it decides the host scratch and whether
/// there is device memory at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Cpu,
    Cuda,
}

#[derive(Clone, Debug)]
pub struct Options {
    /// As `--check-rows`: references cover this many sampled rows.
    pub check_rows: Option<usize>,
    pub target: Target,
    /// Checked launches per case; each one after the first keeps its outputs.
    pub repeat_checks: usize,
}

/// What `case` needs on the host and (CUDA) the device, or why it cannot run.
///
/// # Errors
/// [`SizeError::Unrepresentable`] when a count exceeds what the kernels'
/// i32 tables (or CUDA's grid) hold; [`SizeError::Overflow`] when a size
/// does not fit in u64.
pub fn footprint(case: &Case, opts: &Options) -> Result<Footprint, SizeError> {
    let live = match &case.params {
        CaseParams::Mla(p) => mla(case, p, opts)?,
        CaseParams::V4(p) => v4(case, p, opts)?,
    };
    live.finish(opts.target)
}

/// The largest batch (MLA: keeps ctx[..n]) or row count (V4: keeps positions[..n]) of this case that fits in `host`/`device` bytes, by bisection on `footprint` of a shrunk copy of the case; None if even 1 does not fit.
pub fn largest_fitting(case: &Case, opts: &Options, host_limit: u64, device_limit: u64) -> Option<usize> {
    let full = match &case.params {
        CaseParams::Mla(p) => p.batch.min(p.ctx.len()),
        CaseParams::V4(p) => p.rows.min(p.positions.len()),
    };
    // One copy, refilled from the original prefix at each probe.
    let mut shrunk = case.clone();
    let mut fits = |n: usize| {
        match (&mut shrunk.params, &case.params) {
            (CaseParams::Mla(s), CaseParams::Mla(p)) => {
                s.ctx.clear();
                s.ctx.extend_from_slice(&p.ctx[..n]);
                s.batch = n;
            }
            (CaseParams::V4(s), CaseParams::V4(p)) => {
                s.positions.clear();
                s.positions.extend_from_slice(&p.positions[..n]);
                s.rows = n;
                s.padded_rows = n.saturating_add(p.padded_rows.saturating_sub(p.rows));
            }
            _ => unreachable!("a clone keeps its family"),
        }
        footprint(&shrunk, opts)
            .map(|f| f.host <= host_limit && f.device <= device_limit)
            .unwrap_or(false)
    };
    if full == 0 || !fits(1) {
        return None;
    }
    if fits(full) {
        return Some(full);
    }
    // fits(lo) and !fits(hi) throughout, so lo ends on a boundary.
    let (mut lo, mut hi) = (1, full);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// "12.3 GiB" style formatting for messages.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} host", human(self.host))?;
        if self.device > 0 {
            write!(f, ", {} device", human(self.device))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Constants the sizes depend on, each with where it comes from.

const I32_MAX: u64 = i32::MAX as u64;
/// CUDA's grid: x up to 2^31 - 1 blocks, y and z up to 65535.
const GRID_X_MAX: u64 = (1 << 31) - 1;
const GRID_YZ_MAX: u64 = 65_535;
/// `reference::engine::{BLOCK, SPAN}` (private there): tokens per gathered
/// block and per parallel task.
const REF_BLOCK: u64 = 256;
const REF_SPAN: u64 = 8 * REF_BLOCK;
/// matrixmultiply packs at most KC x (MC + NC) = 256 x (64 + 1024) elements
/// per GEMM call (its defaults for f32 and f64).
const DGEMM_PACK: u64 = 256 * (64 + 1024) * 8;
const SGEMM_PACK: u64 = 256 * (64 + 1024) * 4;
/// The CUDA timer's L2 flush buffer is 2 x L2, allocated once per process;
/// the H200 reports 60 MiB (its flush buffer measured 120 MiB).
const L2_FLUSH: u64 = 2 * (60 << 20);
/// Device buffers are counted in the driver's 2 MiB pages.
const DEVICE_GRANULE: u64 = 2 << 20;
/// Above these counts the planners themselves would allocate and take time
/// in proportion (work lists per sequence, the [16, T+1] table, a piece per
/// row), so their outputs are bounded instead of computed.
const PLAN_CAP: usize = 1 << 16;
const PLAN_RANKS_CAP: usize = 64;
/// Above this many sampled rows the sample itself is not drawn; the stage
/// scratch is then bounded by checking every row.
const SAMPLE_CAP: usize = 1 << 22;
/// Bookkeeping of the reference per checked row (slots, visible counts,
/// the per-sequence map) and per group (map node, Group, its Vecs).
const REF_ROW_BOOK: u64 = 64;
const REF_GROUP_BOOK: u64 = 160;
/// ps1 planner scratch per sequence (lengths, qo, blocks, counters, the
/// per-sequence item lists of the check) and per item (pieces, the balanced
/// search's best and current fill, check refs); a rough bound.
const PLAN_SEQ_BOOK: u64 = 96;
const PLAN_ITEM_BOOK: u64 = 160;
/// A CPU-backend chunk's header in its collected Vec, and a V4 row's.
const CHUNK_HEADER: u64 = 72;
/// A workload's own struct, its params' labels and Vec headers (measured
/// at about 1.2 KiB for an 8-rank MLA workload), and one MLA shard's.
const HEADER_BYTES: u64 = 1 << 10;
const SHARD_HEADER: u64 = 256;
/// The case's report row (params map, repro command), its checks and their
/// messages, alive through the whole case.
const ROW_BYTES: u64 = 16 << 10;
/// `metrics::empty_rows_zero` lists the empty (row, head) pairs of a check
/// (8 bytes each) and the bad ones among them (16 bytes each), grown by push.
const EMPTY_PAIR: u64 = 2 * (8 + 16);

const F64: u64 = 8;
const F32: u64 = 4;
const I32: u64 = 4;
const U16: u64 = 2;
const USIZE: u64 = 8;
const DQK: u64 = MLA_D_QK as u64;
const DV: u64 = MLA_D_V as u64;
const VD: u64 = V4_D as u64;
/// Bytes of one V4 row in each of its four copies: packed (512 B), rope
/// (64 bf16), decoded and unquantized (512 f32 each).
const V4_ROW_BYTES: u64 = VD + V4_D_ROPE as u64 * U16 + VD * F32 + VD * F32;

type R<T> = Result<T, SizeError>;

fn u(x: usize) -> u64 {
    x as u64
}

fn mul(what: &str, xs: &[u64]) -> R<u64> {
    xs.iter()
        .try_fold(1u64, |a, &x| a.checked_mul(x))
        .ok_or_else(|| too_big(what, xs, " x "))
}

fn add(what: &str, xs: &[u64]) -> R<u64> {
    xs.iter()
        .try_fold(0u64, |a, &x| a.checked_add(x))
        .ok_or_else(|| too_big(what, xs, " + "))
}

fn too_big(what: &str, xs: &[u64], op: &str) -> SizeError {
    let terms: Vec<String> = xs.iter().map(u64::to_string).collect();
    SizeError::Overflow(format!("{what}: {} exceeds u64 ({})", terms.join(op), u64::MAX))
}

fn limit(what: &str, v: u128, max: u64, bound: &str, why: &str) -> R<()> {
    if v > u128::from(max) {
        return Err(SizeError::Unrepresentable(format!(
            "{what} {v} exceeds {bound} ({max}), {why}"
        )));
    }
    Ok(())
}

fn i32_fits(what: &str, v: u128, why: &str) -> R<()> {
    limit(what, v, I32_MAX, "i32", why)
}

/// Tasks that run at once: rayon runs one span or chunk per thread.
fn concurrent(tasks: u64) -> u64 {
    tasks.min(u(rayon::current_num_threads().max(1)))
}

/// Bytes of a Vec collected through `flat_map` from `rows` runs of
/// `per_row` elements (`PaddedHeads::strip`, the dcp_combine inputs): it
/// starts at one run (at least 4 elements) and doubles, so it ends holding
/// a power of two of them.
fn doubled(rows: u64, per_row: u64, elem: u64) -> R<u64> {
    if rows == 0 {
        return Ok(0);
    }
    let rows2 = rows
        .checked_next_power_of_two()
        .ok_or_else(|| too_big("rows rounded up to a power of two", &[rows], ""))?;
    mul("a Vec collected through flat_map", &[rows2, per_row.max(4), elem])
}

/// Tree nodes and leaves of the reference's span split of a `vis`-token list.
fn spans(vis: u64) -> u64 {
    vis.div_ceil(REF_SPAN).max(1)
}

/// One reference span task's own buffers for `m` (row, head) pairs:
/// Q, accumulator, running max and sum, the K block, the logits, GEMM packing.
fn span_task(m: u64, dq: u64, dv: u64) -> R<u64> {
    let w = "reference span buffers";
    let elems = add(
        w,
        &[
            mul(w, &[m, dq])?,
            mul(w, &[m, dv])?,
            mul(w, &[m, 2])?,
            REF_BLOCK * dq,
            mul(w, &[m, REF_BLOCK])?,
        ],
    )?;
    add(w, &[mul(w, &[elems, F64])?, DGEMM_PACK])
}

/// One CPU-backend attention task's own buffers: `m` query vectors over `n`
/// KV rows of `dk` values (Q, K, logits, visible counts, GEMM packing).
fn cpu_task(m: u64, n: u64, dk: u64) -> R<u64> {
    let w = "CPU emulation task buffers";
    add(
        w,
        &[
            mul(w, &[m, dk, F32])?,
            mul(w, &[n, dk, F32])?,
            mul(w, &[m, n, F32])?,
            mul(w, &[m, USIZE])?,
            SGEMM_PACK,
        ],
    )
}

// ---------------------------------------------------------------------------
// Named byte counts and the stages that hold them.

#[derive(Clone, Debug, Default)]
struct Parts(Vec<Part>);

impl Parts {
    fn host(&mut self, what: &'static str, bytes: u64) -> R<()> {
        self.put(what, bytes, 0)
    }

    /// One device buffer, in whole driver pages (at least one).
    fn device(&mut self, what: &'static str, bytes: u64) -> R<()> {
        let pages = bytes.max(1).div_ceil(DEVICE_GRANULE);
        self.put(what, 0, mul(what, &[pages, DEVICE_GRANULE])?)
    }

    fn put(&mut self, what: &'static str, host: u64, device: u64) -> R<()> {
        if host == 0 && device == 0 {
            return Ok(());
        }
        match self.0.iter_mut().find(|p| p.what == what) {
            Some(p) => {
                p.host = add(what, &[p.host, host])?;
                p.device = add(what, &[p.device, device])?;
            }
            None => self.0.push(Part { what, host, device }),
        }
        Ok(())
    }

    fn absorb(&mut self, other: &Parts) -> R<()> {
        for p in &other.0 {
            self.put(p.what, p.host, p.device)?;
        }
        Ok(())
    }

    fn host_total(&self) -> R<u64> {
        let v: Vec<u64> = self.0.iter().map(|p| p.host).collect();
        add("host bytes", &v)
    }

    fn device_total(&self) -> R<u64> {
        let v: Vec<u64> = self.0.iter().map(|p| p.device).collect();
        add("device bytes", &v)
    }

    /// Keeps whichever of `self` and `other` holds more host bytes.
    fn keep_larger(&mut self, other: Parts) -> R<()> {
        if other.host_total()? > self.host_total()? {
            *self = other;
        }
        Ok(())
    }

    fn keep_larger_device(&mut self, other: Parts) -> R<()> {
        if other.device_total()? > self.device_total()? {
            *self = other;
        }
        Ok(())
    }
}

/// What is alive when. The first four live from their stage to the end of
/// the case; each of the last five is one stage's scratch on top of them.
#[derive(Default)]
struct Live {
    workload: Parts,
    refs: Parts,
    plan: Parts,
    outputs: Parts,
    building: Parts,
    referencing: Parts,
    planning: Parts,
    running: Parts,
    checking: Parts,
    /// The backend runs (false when nothing runs or planning fails).
    runs: bool,
    /// The device buffers of the largest launch sequence (MLA: one rank's;
    /// on a group of GPUs, the fullest GPU's ranks and step buffers).
    device: Parts,
}

impl Live {
    fn finish(&self, target: Target) -> R<Footprint> {
        if self.workload.0.is_empty() {
            return Ok(Footprint::default()); // skipped or refused before the build
        }
        let mut row = Parts::default();
        row.host("run: report row, checks and messages", ROW_BYTES)?;
        let mut stages: Vec<Vec<&Parts>> = vec![
            vec![&row, &self.workload, &self.building],
            vec![&row, &self.workload, &self.refs, &self.referencing],
            vec![&row, &self.workload, &self.refs, &self.plan, &self.planning],
        ];
        if self.runs {
            let (w, r, p, o) = (&self.workload, &self.refs, &self.plan, &self.outputs);
            stages.push(vec![&row, w, r, p, o, &self.running]);
            stages.push(vec![&row, w, r, p, o, &self.checking]);
        }
        let mut peak = Parts::default();
        for sets in stages {
            let mut s = Parts::default();
            for p in sets {
                s.absorb(p)?;
            }
            peak.keep_larger(s)?;
        }
        if target == Target::Cuda && self.runs {
            peak.device("device: L2 flush buffer (2 x 60 MiB, per process)", L2_FLUSH)?;
            peak.absorb(&self.device)?;
        }
        Ok(Footprint {
            host: peak.host_total()?,
            device: peak.device_total()?,
            parts: peak.0,
        })
    }
}

/// Which query rows the references (and the CPU emulation) cover.
enum Checked {
    /// Every row, or a superset bound when the sample is too large to draw.
    All,
    /// The sorted sample `reference::sample_rows` draws.
    Sample(Vec<usize>),
}

impl Checked {
    /// The count of checked rows and which they are.
    fn new(total: usize, check_rows: Option<usize>, seed: u64) -> (u64, Checked) {
        let n = match check_rows {
            Some(n) if n < total => n,
            _ => total,
        };
        if n == total || n > SAMPLE_CAP {
            (u(n), Checked::All)
        } else {
            (
                u(n),
                Checked::Sample(crate::reference::sample_rows(total, check_rows, seed)),
            )
        }
    }

    /// Whether a checked row lies in `[a, b)` (the CPU backend's filter).
    fn any_in(&self, a: usize, b: usize) -> bool {
        match self {
            Checked::All => a < b,
            Checked::Sample(rows) => {
                let i = rows.partition_point(|&r| r < a);
                i < rows.len() && rows[i] < b
            }
        }
    }

    fn for_each(&self, total: usize, mut f: impl FnMut(usize) -> R<()>) -> R<()> {
        match self {
            Checked::All => (0..total).try_for_each(f),
            Checked::Sample(rows) => rows.iter().try_for_each(|&r| f(r)),
        }
    }
}

/// The reference engine's work over one set of groups.
#[derive(Clone, Copy, Debug, Default)]
struct View {
    /// Sum over groups of (span tree nodes x rows): the partials it allocates.
    tree_rows: u64,
    tasks: u64,
    max_rows: u64,
    groups: u64,
}

impl View {
    fn group(&mut self, rows: u64, vis: u64) -> R<()> {
        let s = spans(vis);
        let w = "reference span tree";
        self.tree_rows = add(w, &[self.tree_rows, mul(w, &[2 * s - 1, rows])?])?;
        self.tasks = add(w, &[self.tasks, s])?;
        self.max_rows = self.max_rows.max(rows);
        self.groups += 1;
        Ok(())
    }

    /// Scratch of one `engine::attend` over this view with `heads` heads.
    fn scratch(&self, heads: u64, dq: u64, dv: u64, checked: u64) -> R<Parts> {
        let mut s = Parts::default();
        s.host(
            "reference: span partials (f64)",
            mul("reference span partials", &[self.tree_rows, heads, dv + 1, F64])?,
        )?;
        s.host(
            "reference: per-thread K blocks, logits and GEMM packing",
            mul(
                "reference per-thread buffers",
                &[
                    concurrent(self.tasks),
                    span_task(mul("span rows", &[self.max_rows, heads])?, dq, dv)?,
                ],
            )?,
        )?;
        s.host(
            "reference: groups and row lists",
            add(
                "reference bookkeeping",
                &[
                    mul("rows", &[checked, REF_ROW_BOOK])?,
                    mul("groups", &[self.groups, REF_GROUP_BOOK])?,
                ],
            )?,
        )?;
        Ok(s)
    }
}

// ---------------------------------------------------------------------------
// MLA.

/// Tokens query row `i` of a length-`l` sequence sees, as `reference::mla::visible`.
fn mla_vis(l: usize, s_q: usize, i: usize) -> usize {
    (l + i + 1).saturating_sub(s_q).min(l)
}

/// Each sequence with checked rows: (sequence, checked rows, its last checked row).
fn mla_groups(p: &MlaParams, chk: &Checked, mut f: impl FnMut(usize, u64, usize) -> R<()>) -> R<()> {
    if p.s_q == 0 {
        return Ok(());
    }
    match chk {
        Checked::All => (0..p.batch).try_for_each(|b| f(b, u(p.s_q), p.s_q - 1)),
        Checked::Sample(rows) => {
            let mut k = 0;
            while k < rows.len() {
                let b = rows[k] / p.s_q;
                let mut j = k;
                while j < rows.len() && rows[j] / p.s_q == b {
                    j += 1;
                }
                f(b, u(j - k), rows[j - 1] % p.s_q)?;
                k = j;
            }
            Ok(())
        }
    }
}

/// One DCP rank's share: tokens and pages at the case's page size and at
/// the other one (a repage from the previous case keeps those alive).
#[derive(Clone, Copy, Default)]
struct Rank {
    tokens: u128,
    pages: u128,
    other_pages: u128,
    max_local: u64,
}

impl Rank {
    fn of(p: &MlaParams, r: Option<usize>, other_ps: usize) -> Rank {
        let mut k = Rank::default();
        let Some(r) = r else { return k };
        for &l in &p.ctx {
            let n = p.dcp.local_len(r, l);
            k.tokens += n as u128;
            k.pages += n.div_ceil(p.page_size) as u128;
            k.other_pages += n.div_ceil(other_ps) as u128;
            k.max_local = k.max_local.max(u(n));
        }
        k
    }
}

/// Pool pages a shard allocates for `used` pages: NaN slack included.
fn pool_pages(used: u64) -> u64 {
    used + used / 16 + 1
}

enum MlaRun {
    Ps1 {
        hk: u64,
        ranks: Option<Vec<worklist::WorkList>>,
    },
    Page64 {
        hk: u64,
        splits: Option<Vec<usize>>,
    },
    Combine,
    /// Planning fails: the run stops with an error before the backend.
    Fails,
}

fn mla_run(case: &Case, p: &MlaParams, dec: &Decision, h: usize) -> MlaRun {
    let small = p.batch <= PLAN_CAP && p.dcp.world <= PLAN_RANKS_CAP;
    let planned = || case.variant.unit().plan(case, dec, None).ok();
    match case.variant {
        dcp_combine::ID => MlaRun::Combine,
        ps1_unit::ID if small => match planned().as_ref().and_then(Plan::of::<Ps1Plan>) {
            Some(Ps1Plan {
                kernel_heads, ranks, ..
            }) => MlaRun::Ps1 {
                hk: u(*kernel_heads),
                ranks: Some(ranks.clone()),
            },
            None => MlaRun::Fails,
        },
        page64_unit::ID if small => match planned().as_ref().and_then(Plan::of::<Page64Plan>) {
            Some(Page64Plan {
                kernel_heads, splits, ..
            }) => MlaRun::Page64 {
                hk: u(*kernel_heads),
                splits: Some(splits.clone()),
            },
            None => MlaRun::Fails,
        },
        ps1_unit::ID => match heads::kernel_heads(h, p.s_q) {
            Ok(hk) => MlaRun::Ps1 { hk: u(hk), ranks: None },
            Err(_) => MlaRun::Fails,
        },
        page64_unit::ID => match heads::page64_heads(h) {
            Ok(hk) => MlaRun::Page64 {
                hk: u(hk),
                splits: None,
            },
            Err(_) => MlaRun::Fails,
        },
        _ => MlaRun::Fails,
    }
}

/// A ps1 rank's work list in counts: items, partial rows, reduce items, CTAs.
struct Ps1Counts {
    items: u64,
    partial_rows: u64,
    reduce: u64,
    ctas: u64,
}

fn mla(case: &Case, p: &MlaParams, opts: &Options) -> R<Live> {
    let mut live = Live::default();
    // The build refuses these before allocating; a world or interleave of 0
    // has no shards to size.
    if p.ctx.len() != p.batch || !matches!(p.page_size, 1 | 64) || p.dcp.world == 0 || p.dcp.interleave == 0 {
        return Ok(live);
    }
    let cuda = opts.target == Target::Cuda;
    let fp8 = p.dtype == Dtype::Fp8;
    let eb: u64 = if fp8 { 1 } else { 2 };
    let (b, w, s_q, ps) = (u(p.batch), u(p.dcp.world), u(p.s_q), u(p.page_size));
    let h = mul("gathered heads (heads_local x dcp_world)", &[u(p.heads_local), w])?;
    let tq128 = u128::from(b) * u128::from(s_q);
    i32_fits("query rows (batch x s_q)", tq128, "the kernels' qo_indptr type")?;
    let tq = tq128 as u64;
    i32_fits(
        "sequences (batch + 1)",
        u128::from(b) + 1,
        "work items and indptrs index sequences in i32",
    )?;
    if case.variant == ps1_unit::ID {
        i32_fits(
            "persistent CTAs (cus)",
            case.cus as u128 + 1,
            "work_indptr has one i32 entry per CTA",
        )?;
    }
    let l_tot: u128 = p.ctx.iter().map(|&l| l as u128).sum();
    i32_fits("sum of context lengths", l_tot, "the kernels' g_kv_indptr type")?;
    let l_tot = l_tot as u64;
    let l_max = p.ctx.iter().copied().max().unwrap_or(0);
    // dcp::local_len multiplies them in usize.
    mul("dcp_world x interleave", &[w, u(p.dcp.interleave)])?;

    let dec = variants::decide(case);
    if dec.skip.is_some() {
        return Ok(live);
    }
    let run = mla_run(case, p, &dec, h as usize);
    live.runs = !matches!(run, MlaRun::Fails);
    let hk = match &run {
        MlaRun::Ps1 { hk, .. } | MlaRun::Page64 { hk, .. } => *hk,
        _ => h,
    };
    let (n_rows, chk) = Checked::new(tq as usize, opts.check_rows, case.seed);
    let sets = u(opts.repeat_checks.max(1));

    if cuda && live.runs {
        match &run {
            MlaRun::Page64 { .. } => limit(
                "batch",
                u128::from(b),
                GRID_YZ_MAX,
                "CUDA's grid z limit",
                "page64's grid is (HK/16, n_splits, batch)",
            )?,
            MlaRun::Combine => {
                i32_fits("DCP world", u128::from(w), "dcp_combine takes W as int")?;
                limit(
                    "checked rows x heads",
                    u128::from(n_rows) * u128::from(h),
                    GRID_X_MAX,
                    "CUDA's grid x limit",
                    "dcp_combine launches one block per (row, head)",
                )?;
            }
            _ => {}
        }
    }

    // The workload (workload/mla.rs::build): Q and KV three ways, indptrs.
    let wl = &mut live.workload;
    let q_elems = mul("Q elements", &[tq, h, DQK])?;
    let kv_elems = mul("KV elements", &[l_tot, DQK])?;
    wl.host("workload: context lengths", mul("context lengths", &[b, USIZE])?)?;
    wl.host("workload: Q (stored)", mul("Q bytes", &[q_elems, eb])?)?;
    wl.host("workload: Q (decoded f32)", mul("Q decoded", &[q_elems, F32])?)?;
    wl.host("workload: KV (stored)", mul("KV bytes", &[kv_elems, eb])?)?;
    wl.host("workload: KV (decoded f32)", mul("KV decoded", &[kv_elems, F32])?)?;
    if fp8 {
        wl.host("workload: Q (unquantized f32)", mul("Q source", &[q_elems, F32])?)?;
        wl.host("workload: KV (unquantized f32)", mul("KV source", &[kv_elems, F32])?)?;
    }
    wl.host("workload: qo_indptr and g_kv_indptr", mul("indptrs", &[b + 1, 2, I32])?)?;
    wl.host(
        "workload: headers and labels",
        add("headers", &[HEADER_BYTES, mul("shard headers", &[w, SHARD_HEADER])?])?,
    )?;
    if !fp8 {
        // bf16 rounds a source that is dropped after: it is alive with both results.
        let mut q = Parts::default();
        q.host(
            "build: Q source before bf16 rounding",
            mul("Q source", &[q_elems, F32])?,
        )?;
        let mut kv = Parts::default();
        kv.host(
            "build: KV source before bf16 rounding",
            mul("KV source", &[kv_elems, F32])?,
        )?;
        live.building.keep_larger(q)?;
        live.building.keep_larger(kv)?;
    }

    // The references (runner.rs::build_refs): per rank, unsharded, unquantized.
    let ref_outs = w + 1 + u64::from(fp8);
    let ref_one = add(
        "one reference output",
        &[mul("reference o and lse", &[n_rows, h, DV + 1, F64])?, n_rows * USIZE],
    )?;
    live.refs
        .host("references: o and lse (f64)", mul("references", &[ref_one, ref_outs])?)?;
    live.refs.host("references: checked row ids", n_rows * USIZE)?;
    let full_view = {
        let mut v = View::default();
        mla_groups(p, &chk, |bb, rows, i| v.group(rows, u(mla_vis(p.ctx[bb], p.s_q, i))))?;
        v
    };
    if w > 1 || fp8 {
        live.referencing.keep_larger(full_view.scratch(h, DQK, DV, n_rows)?)?;
    }

    // Ranks past `eff` hold no token (r * S reaches every length); they are
    // sized once and counted `w - eff` times.
    let s = u(p.dcp.interleave);
    let eff = if l_max == 0 { 0 } else { w.min(u(l_max).div_ceil(s)) };
    let other_ps = if p.page_size == 1 { 64 } else { 1 };
    let passes = (0..eff as usize)
        .map(|r| (Some(r), 1))
        .chain((w > eff).then_some((None, w - eff)));
    let mut repage = Parts::default();
    let mut shard_scratch = Parts::default();
    let mut cpu_ranks = Parts::default();
    let mut cpu_rank_peak = Parts::default();
    let mut cuda_rank_peak = Parts::default();
    let mut plan_scratch = Parts::default();
    // A step on a group of GPUs (`-g<N>`, CUDA only) loads every rank of a
    // GPU at once: its device parts add up per GPU instead of one rank's.
    let group = match (case.dcp_devices, &run) {
        (Some(n), MlaRun::Ps1 { .. } | MlaRun::Page64 { .. }) if cuda && n > 0 && w % u(n) == 0 => Some(u(n)),
        _ => None,
    };
    let mut gpu_dev = vec![Parts::default(); group.unwrap_or(0) as usize];
    let cpus = u(case.cus);
    for (r, k) in passes {
        let rk = Rank::of(p, r, other_ps);
        let idx = r.unwrap_or(eff as usize);
        let what = match r {
            Some(r) => format!("pages of DCP rank {r}"),
            None => "pages of an empty DCP rank".into(),
        };
        i32_fits(&what, rk.pages, "the kernels' kv_indptr type")?;
        let pages = rk.pages as u64;
        let num_pages = pool_pages(pages);
        i32_fits(
            "pool pages",
            u128::from(num_pages),
            "page ids are i32 kv_indices entries",
        )?;
        let pool = mul("KV pool", &[num_pages, ps, DQK, eb])?;
        let tables = add(
            "page tables",
            &[b * USIZE, (b + 1) * I32, mul("kv_indices", &[pages, I32])?, b * I32],
        )?;
        live.workload.host(
            "workload: DCP shard KV pools (NaN slack included)",
            mul("pools", &[pool, k])?,
        )?;
        live.workload
            .host("workload: DCP page tables", mul("page tables", &[tables, k])?)?;
        let mut sh = Parts::default();
        sh.host(
            "build: shard scratch (page permutation, page counts)",
            add("shard scratch", &[b * USIZE * 2, mul("perm", &[num_pages, I32])?])?,
        )?;
        shard_scratch.keep_larger(sh)?;
        // The other page size's shards, alive while a repage builds these.
        let other = rk.other_pages.min(u128::from(u64::MAX)) as u64;
        let other_pool = mul("repaged pool", &[pool_pages(other), u(other_ps), DQK, eb, k])?;
        repage.host("repage: the previous page size's pools", other_pool)?;
        repage.host(
            "repage: the previous page size's page tables",
            mul(
                "repaged tables",
                &[add("t", &[b * 20 + 4, mul("idx", &[other, I32])?])?, k],
            )?,
        )?;

        // This rank's reference under the global mask.
        let mut view = View::default();
        mla_groups(p, &chk, |bb, rows, i| {
            let vis = mla_vis(p.ctx[bb], p.s_q, i);
            let local = r.map_or(0, |r| p.dcp.local_len(r, vis));
            view.group(rows, u(local))
        })?;
        live.referencing.keep_larger(view.scratch(h, DQK, DV, n_rows)?)?;

        // Plan, backend and device per rank; ranks run one after another.
        let rank_out = mul("rank outputs before stripping", &[tq, hk, DV + 1, F32])?;
        let mut cpu = Parts::default();
        let mut host_cuda = Parts::default();
        let mut dev = Parts::default();
        let q_pad = mul("padded Q", &[tq, hk, DQK, eb])?;
        if matches!(run, MlaRun::Ps1 { .. } | MlaRun::Page64 { .. }) {
            cpu_ranks.host(
                "cpu: per-rank outputs at kernel heads (poisoned)",
                mul("rank outputs", &[rank_out, k])?,
            )?;
            // mla_rank's padded Q upload, then the o/lse downloads (bf16 and f32).
            let dl = add(
                "downloads",
                &[
                    mul("o download", &[tq, hk, DV, U16 + F32])?,
                    mul("lse download", &[tq, hk, F32])?,
                ],
            )?;
            host_cuda.host("cuda: padded Q or o/lse downloads of a rank", q_pad.max(dl))?;
            dev.device("device: Q at kernel heads", q_pad)?;
            dev.device("device: the rank's KV pool", pool)?;
            dev.device("device: kv_indptr", (b + 1) * I32)?;
            dev.device("device: kv_indices", mul("kv_indices", &[pages.max(1), I32])?)?;
            dev.device("device: kv_last_page_len", b * I32)?;
            dev.device("device: qo_indptr", (b + 1) * I32)?;
            dev.device("device: g_kv_indptr", (b + 1) * I32)?;
            dev.device("device: o (bf16)", mul("o", &[tq, hk, DV, U16])?)?;
            dev.device("device: lse", mul("lse", &[tq, hk, F32])?)?;
        }
        match &run {
            MlaRun::Ps1 { ranks, .. } => {
                let c = match ranks {
                    Some(ranks) => {
                        let wl = &ranks[idx];
                        Ps1Counts {
                            items: u(wl.items.len()),
                            partial_rows: u(wl.num_partial_rows),
                            reduce: u(wl.reduce.len()),
                            ctas: u(wl.num_ctas),
                        }
                    }
                    // Every CTA ends with at most one cut, so there are at most
                    // `ctas` extra items, each split sequence has at most twice
                    // its cuts in chunks, and at most 16 (max_splits) of them.
                    None => Ps1Counts {
                        items: add("ps1 items", &[b, cpus])?,
                        partial_rows: mul("ps1 partial rows", &[tq, u(worklist::MAX_SPLITS)])?
                            .min(mul("ps1 partial rows", &[2, cpus, s_q])?),
                        reduce: b.min(cpus),
                        ctas: cpus,
                    },
                };
                let item = std::mem::size_of::<worklist::WorkItem>() as u64;
                let red = std::mem::size_of::<worklist::ReduceItem>() as u64;
                live.plan.host(
                    "plan: ps1 work lists",
                    mul(
                        "work lists",
                        &[
                            add(
                                "work list",
                                &[(c.ctas + 1) * I32, mul("items", &[c.items, item])?, c.reduce * red * 2],
                            )?,
                            k,
                        ],
                    )?,
                )?;
                let mut ps = Parts::default();
                ps.host(
                    "plan: ps1 planner scratch (rough)",
                    add(
                        "planner scratch",
                        &[
                            mul("per sequence", &[b, PLAN_SEQ_BOOK])?,
                            mul("per item", &[c.items, PLAN_ITEM_BOOK])?,
                            c.partial_rows,
                            c.ctas * 16,
                        ],
                    )?,
                )?;
                plan_scratch.keep_larger(ps)?;
                // CPU: the chunks of items with a checked row, and their tasks.
                let (mut chunks, mut tasks, mut task_max) = (0u64, 0u64, 0u64);
                match ranks {
                    Some(ranks) => {
                        for it in &ranks[idx].items {
                            let (a, e) = (it.q_start as usize, it.q_end as usize);
                            if !chk.any_in(a, e) {
                                continue;
                            }
                            let rows = u(e - a);
                            let len = u((it.kv_end - it.kv_start).max(0) as usize);
                            let m = mul("chunk rows", &[rows, hk])?;
                            chunks = add("chunks", &[chunks, mul("chunk", &[m, DV + 1, F32])?, CHUNK_HEADER])?;
                            tasks += 1;
                            task_max = task_max.max(cpu_task(m, len, DQK)?);
                        }
                    }
                    None => {
                        let items = add("items", &[full_view.groups, cpus])?;
                        let m = mul("chunk rows", &[s_q, hk])?;
                        chunks = mul(
                            "chunks",
                            &[items, add("chunk", &[mul("c", &[m, DV + 1, F32])?, CHUNK_HEADER])?],
                        )?;
                        tasks = items;
                        task_max = cpu_task(m, rk.max_local, DQK)?;
                    }
                }
                cpu.host("cpu: chunks of checked items", chunks)?;
                cpu.host(
                    "cpu: per-thread Q, K and logits",
                    mul("cpu tasks", &[concurrent(tasks), task_max])?,
                )?;
                host_cuda.host(
                    "cuda: work items as i32",
                    add(
                        "work items",
                        &[
                            mul("items", &[c.items.max(c.ctas), 8 * I32 * 2])?,
                            c.reduce * 4 * I32 * 2,
                        ],
                    )?,
                )?;
                dev.device("device: work_indptr", (c.ctas + 1) * I32)?;
                dev.device("device: work items", mul("items", &[c.items.max(c.ctas), 8 * I32])?)?;
                dev.device("device: reduce items", c.reduce.max(1) * 4 * I32)?;
                let parts = c.partial_rows.max(1);
                dev.device("device: partial o (f32)", mul("partials", &[parts, hk, DV, F32])?)?;
                dev.device("device: partial lse", mul("partial lse", &[parts, hk, F32])?)?;
            }
            MlaRun::Page64 { splits, .. } => {
                let ns = match splits {
                    Some(v) => u(v[idx]),
                    None => u(page64_unit::rank_splits(
                        p.batch,
                        rk.tokens as usize,
                        hk as usize,
                        p.s_q,
                        p.dtype,
                        case.cus,
                    )),
                }
                .max(1);
                // page64_split_ranges: ceil(pages / n) pages per split.
                let chunk = rk.max_local.div_ceil(64).div_ceil(ns) * 64;
                if cuda {
                    i32_fits(
                        "page64 split bound (pages rounded up to splits, in tokens)",
                        u128::from(chunk) * u128::from(ns),
                        "page64_fwd computes s * chunk in int",
                    )?;
                }
                let tasks = mul("page64 tasks", &[full_view.groups, ns])?;
                let m = mul("chunk rows", &[s_q, hk])?;
                cpu.host(
                    "cpu: chunks of checked sequences",
                    mul(
                        "chunks",
                        &[tasks, add("chunk", &[mul("c", &[m, DV + 1, F32])?, CHUNK_HEADER + 32])?],
                    )?,
                )?;
                cpu.host(
                    "cpu: per-thread Q, K and logits",
                    mul(
                        "cpu tasks",
                        &[concurrent(tasks), cpu_task(m, rk.max_local.min(chunk), DQK)?],
                    )?,
                )?;
                let parts = if ns > 1 {
                    mul("page64 partial rows", &[tq, ns])?
                } else {
                    1
                };
                dev.device("device: partial o (f32)", mul("partials", &[parts, hk, DV, F32])?)?;
                dev.device("device: partial lse", mul("partial lse", &[parts, hk, F32])?)?;
            }
            MlaRun::Combine | MlaRun::Fails => {}
        }
        cpu_rank_peak.keep_larger(cpu)?;
        cuda_rank_peak.keep_larger(host_cuda)?;
        match group {
            Some(n) => {
                // Ranks g*kg .. (g+1)*kg on GPU g; this pass is rank r, or
                // the `k` empty ranks from `eff` on.
                let kg = w / n;
                let (lo, hi) = match r {
                    Some(r) => (u(r), u(r) + 1),
                    None => (eff, eff + k),
                };
                for (g, parts) in gpu_dev.iter_mut().enumerate() {
                    let (a, z) = (u(g) * kg, (u(g) + 1) * kg);
                    for _ in lo.max(a)..hi.min(z) {
                        parts.absorb(&dev)?;
                    }
                }
            }
            None => live.device.keep_larger_device(dev)?,
        }
    }
    if let Some(n) = group {
        let shape = crate::dcp_step::StepShape {
            gpus: n as usize,
            world: w as usize,
            rows: tq as usize,
            heads: h as usize,
            kernel_heads: hk as usize,
            q_elem: eb as usize,
            reduce_elem: case.dcp_reduce.bytes(),
        };
        let bufs = shape.buffers().named();
        for mut parts in gpu_dev {
            for &(what, bytes) in &bufs {
                parts.device(what, u(bytes))?;
            }
            live.device.keep_larger_device(parts)?;
        }
        // The bus bandwidth measured as the group opens, before any rank loads.
        let mut probe = Parts::default();
        probe.device(
            "device: NCCL bandwidth probe at group open",
            u(crate::dcp_step::BANDWIDTH_PROBE_BYTES) * 2,
        )?;
        live.device.keep_larger_device(probe)?;
    }
    live.building.keep_larger(shard_scratch.clone())?;
    repage.absorb(&shard_scratch)?;
    live.referencing.keep_larger(repage)?;
    live.planning = plan_scratch;
    if matches!(run, MlaRun::Page64 { .. }) {
        live.plan
            .host("plan: page64 split counts", mul("split counts", &[w, USIZE])?)?;
    }

    // Outputs: the ranks' o and lse as `strip` collects them.
    let per_row = mul("o and lse row", &[h, DV + 1, F32])?;
    match &run {
        MlaRun::Ps1 { .. } | MlaRun::Page64 { .. } => {
            let o = doubled(tq, mul("o row", &[h, DV])?, F32)?;
            let set = mul("rank outputs", &[add("rank o and lse", &[o, doubled(tq, h, F32)?])?, w])?;
            live.outputs
                .host("outputs: per-rank o and lse (f32)", mul("outputs", &[set, sets])?)?;
            if cuda {
                live.running = cuda_rank_peak;
            } else {
                live.running = cpu_ranks;
                live.running.absorb(&cpu_rank_peak)?;
            }
            live.running.host("outputs: the buffer a growing strip leaves", o / 2)?;
            let mut chk_parts = Parts::default();
            chk_parts.host(
                "checks: rank outputs as f64",
                mul("rank outputs f64", &[w, n_rows, h, DV + 1, F64])?,
            )?;
            chk_parts.host("checks: picked rows (f32)", mul("picked", &[n_rows, per_row])?)?;
            if w > 1 {
                chk_parts.host(
                    "checks: merged ranks (f64 and f32)",
                    mul("merged", &[n_rows, h, DV + 1, F64 + F32])?,
                )?;
            }
            live.checking = chk_parts;
        }
        MlaRun::Combine => {
            // CombineInputs: each rank's o and lse, collected through flat_map.
            let o = doubled(w, mul("rank o", &[n_rows, h, DV])?, U16)?;
            live.plan.host(
                "plan: dcp_combine inputs (bf16 o, f32 lse)",
                add(
                    "combine inputs",
                    &[o, doubled(w, mul("rank lse", &[n_rows, h])?, F32)?, n_rows * USIZE],
                )?,
            )?;
            live.planning.host("plan: the buffer a growing collect leaves", o / 2)?;
            live.outputs
                .host("outputs: o and lse (f32)", mul("outputs", &[n_rows, per_row, sets])?)?;
            if cuda {
                live.running
                    .host("cuda: o download (bf16)", mul("o download", &[n_rows, h, DV, U16])?)?;
            } else {
                live.running.host(
                    "cpu: rank inputs decoded (f32)",
                    mul("decoded ranks", &[w, n_rows, h, DV, F32])?,
                )?;
            }
            live.checking.host(
                "checks: picked rows, rank inputs and their f64 combine",
                add(
                    "combine checks",
                    &[
                        mul("picked", &[n_rows, per_row])?,
                        mul("parts", &[w, n_rows, h, DV + 1, F64])?,
                        mul("combined", &[n_rows, h, DV + 1, F64])?,
                    ],
                )?,
            )?;
            live.device = Parts::default();
            live.device
                .device("device: per-rank o (bf16)", mul("o_r", &[w, n_rows, h, DV, U16])?)?;
            live.device
                .device("device: per-rank lse", mul("lse_r", &[w, n_rows, h, F32])?)?;
            live.device
                .device("device: o (bf16)", mul("o", &[n_rows, h, DV, U16])?)?;
            live.device.device("device: lse", mul("lse", &[n_rows, h, F32])?)?;
        }
        MlaRun::Fails => {}
    }
    if fp8 && case.variant != dcp_combine::ID {
        let mut q = Parts::default();
        q.host(
            "checks: quantization-noise copies",
            mul("quant check", &[n_rows, h, DV, F32 + F64 + F64])?,
        )?;
        live.checking.keep_larger(q)?;
    }
    live.checking.host(
        "checks: empty (row, head) lists",
        mul("empty pairs", &[n_rows, h, EMPTY_PAIR])?,
    )?;
    Ok(live)
}

// ---------------------------------------------------------------------------
// V4.

/// One V4 workload (the first run or a replay step), in counts.
#[derive(Default)]
struct Step {
    /// Sum of list lengths (kv_indices without the junk prefix).
    entries: u128,
    pool_rows: u64,
    /// Largest per-row scratch of the list builder (CSA's shuffle, HCA's list).
    row_scratch: u64,
    seqs: u64,
    /// List lengths of the checked rows (the reference's groups).
    view: View,
    max_checked_len: u64,
    /// Sum over checked rows of their lengths, for the split partials.
    checked_lens: Vec<u64>,
}

/// KV list length of a row at `pos`, as `variants::v4_row_len`, checked.
fn v4_len(p: &V4Params, pos: u64) -> u64 {
    let n = pos + 1;
    n.min(V4_WINDOW as u64)
        + match p.layer {
            LayerType::Swa => 0,
            LayerType::Csa => (n / 4).min(u(p.index_topk)),
            LayerType::Hca => n / 128,
        }
}

/// Position of row `i` in replay step `s` (workload/v4.rs::build).
fn v4_pos(p: &V4Params, s: usize, i: usize) -> R<u64> {
    let x = u(p.positions[i]);
    if s == 0 {
        return Ok(x);
    }
    let grown = add(
        "replayed position",
        &[x, mul("replay growth", &[u(s), u(V4_REPLAY_GROWTH)])?],
    )?;
    Ok(grown.min(u(p.max_model_len).saturating_sub(1)))
}

/// None when the build refuses the positions (a verify run that is not consecutive).
fn v4_step(p: &V4Params, s: usize, chk: &Checked, keep_lens: bool) -> R<Option<Step>> {
    let mut st = Step::default();
    let verify = p.verify.max(1);
    let (mut win_total, mut comp_total, mut comp_max) = (0u128, 0u128, 0u64);
    let mut i = 0;
    while i < p.rows {
        let end = (i + verify).min(p.rows);
        let first = v4_pos(p, s, i)?;
        for j in i + 1..end {
            if s == 0 && v4_pos(p, s, j - 1)?.checked_add(1) != Some(v4_pos(p, s, j)?) {
                return Ok(None);
            }
        }
        let last = v4_pos(p, s, end - 1)?;
        if last == u64::MAX {
            return Err(too_big("position + 1", &[last, 1], " + "));
        }
        let lo = (first + 1).saturating_sub(V4_WINDOW as u64);
        win_total += u128::from(last + 1 - lo.min(last + 1));
        let comp = match p.layer {
            LayerType::Swa => 0,
            LayerType::Csa => (last + 1) / 4,
            LayerType::Hca => (last + 1) / 128,
        };
        comp_total += u128::from(comp);
        comp_max = comp_max.max(comp);
        for j in i..end {
            let pos = v4_pos(p, s, j)?;
            st.entries += u128::from(v4_len(p, pos));
            let n = pos + 1;
            let scratch = match p.layer {
                LayerType::Swa => 0,
                LayerType::Csa => (n / 4 + (n / 4).min(u(p.index_topk))) as u128 * 8,
                LayerType::Hca => (n / 128) as u128 * 8,
            };
            st.row_scratch = st.row_scratch.max(scratch.min(u128::from(u64::MAX)) as u64);
        }
        st.seqs += 1;
        i = end;
    }
    i32_fits(
        "V4 list entries plus indptr_offset",
        st.entries + p.indptr_offset as u128,
        "the kernels' kv_indptr type",
    )?;
    let shared = win_total + comp_total > POOL_ROW_CAP as u128;
    let logical = win_total + if shared { u128::from(comp_max) } else { comp_total };
    let pool_rows = logical + logical / 16 + 1;
    i32_fits("V4 pool rows", pool_rows, "pool row ids are i32 kv_indices entries")?;
    st.pool_rows = pool_rows as u64;
    chk.for_each(p.rows, |r| {
        let len = v4_len(p, v4_pos(p, s, r)?);
        st.max_checked_len = st.max_checked_len.max(len);
        if keep_lens {
            st.checked_lens.push(len);
        }
        st.view.group(1, len)
    })?;
    Ok(Some(st))
}

enum V4Run {
    /// v4_split (also hca_persist's fallback) with `n` splits; `indptr` entries in its CSR.
    Split {
        n: u64,
        indptr: u64,
    },
    Hca {
        parts: u64,
        pieces: u64,
    },
    Merge {
        n: u64,
    },
    Fails,
}

/// The split count `v4_split_plan` gives, without building its [16, T+1] table.
fn v4_split_n(case: &Case, p: &V4Params) -> u64 {
    let bound = pv4::kv_len_bound(p.layer, p.index_topk, p.max_model_len);
    let hk = p.kernel_heads();
    let table = 1..=pv4::MAX_SPLITS;
    u(match case.v4.splits {
        _ if p.rows > p.padded_rows => pv4::kernel_pick_splits(p.rows, hk, bound, case.cus),
        Some(n) if table.contains(&n) => n,
        Some(_) => pv4::kernel_pick_splits(p.rows, hk, bound, case.cus),
        None => pv4::heuristic_splits(p.rows, hk, bound, case.cus),
    })
}

fn v4_run(case: &Case, p: &V4Params, dec: &Decision, total: u128) -> V4Run {
    let small = p.padded_rows <= PLAN_CAP;
    let split = |n: u64| V4Run::Split {
        n,
        indptr: u(p.padded_rows.max(p.rows)) + 1,
    };
    match case.variant {
        split_merge::ID => V4Run::Merge { n: v4_split_n(case, p) },
        v4_split::ID | hca_unit::ID if small => {
            let Ok(plan) = case.variant.unit().plan(case, dec, None) else {
                return V4Run::Fails;
            };
            if let Some(sp) = plan.of::<SplitPlan>() {
                V4Run::Split {
                    n: u(sp.n),
                    indptr: u(sp.split_indptr.len()),
                }
            } else if let Some(HcaPersistPlan { plan, .. }) = plan.of::<HcaPersistPlan>() {
                V4Run::Hca {
                    parts: u(plan.partitions),
                    pieces: u(plan.pieces.len()),
                }
            } else {
                V4Run::Fails
            }
        }
        hca_unit::ID if dec.fallback.is_none() => {
            if case.v4.partitions == 0 {
                return V4Run::Fails;
            }
            let total = total.min(usize::MAX as u128) as usize;
            let parts = hca::hca_effective_partitions(case.v4.partitions, total, case.cus, p.kernel_heads());
            V4Run::Hca {
                parts: u(parts),
                pieces: u(p.rows) + u(parts),
            }
        }
        v4_split::ID | hca_unit::ID => split(v4_split_n(case, p)),
        _ => V4Run::Fails,
    }
}

/// Host bytes of an hca plan and the scratch of building and checking it.
fn hca_plan_bytes(rows: u64, parts: u64, pieces: u64) -> R<(u64, u64)> {
    let piece = std::mem::size_of::<hca::Piece>() as u64;
    let w = "hca plan";
    let plan = add(
        w,
        &[
            (parts + 1) * USIZE,
            mul(w, &[pieces, piece, 2])?,
            mul(w, &[rows, USIZE])?,
        ],
    )?;
    let scratch = add(
        w,
        &[
            mul(w, &[rows, USIZE + USIZE + 24])?,
            mul(w, &[pieces, USIZE])?,
            2 * parts,
        ],
    )?;
    Ok((plan, scratch))
}

fn v4(case: &Case, p: &V4Params, opts: &Options) -> R<Live> {
    let mut live = Live::default();
    if p.positions.len() != p.rows || p.padded_rows < p.rows {
        return Ok(live); // the build refuses these before allocating
    }
    let cuda = opts.target == Target::Cuda;
    let (nr, t) = (u(p.rows), u(p.padded_rows));
    let (h, hk) = (u(p.heads), u(p.kernel_heads()));
    i32_fits(
        "padded rows T",
        u128::from(t) + 1,
        "kv_indptr has T+1 i32 entries and the kernels take rows as int",
    )?;
    // Sized before any planner multiplies rows by heads.
    let q = mul("V4 Q", &[t, hk, V4_ROW_BYTES])?;
    let dec = variants::decide(case);
    if dec.skip.is_some() {
        return Ok(live);
    }
    let splits = case.variant == split_merge::ID
        || case.variant == v4_split::ID
        || (case.variant == hca_unit::ID && dec.fallback.is_some());
    if splits {
        i32_fits(
            "split table entries (16 x T)",
            u128::from(t) * pv4::MAX_SPLITS as u128,
            "the uniform split table holds n * i in i32",
        )?;
    }
    let (n_rows, chk) = Checked::new(p.rows, opts.check_rows, case.seed);
    let steps_n = p.replay;
    let mut steps = Vec::with_capacity(steps_n.min(1 << 16) + 1);
    for s in 0..=steps_n {
        match v4_step(p, s, &chk, s == 0 && case.variant == split_merge::ID)? {
            Some(st) => steps.push(st),
            None if s == 0 => return Ok(live),
            None => {}
        }
    }
    let main = &steps[0];
    let run = v4_run(case, p, &dec, main.entries);
    live.runs = !matches!(run, V4Run::Fails);
    let sets = u(opts.repeat_checks.max(1));
    let offset = u(p.indptr_offset);

    if cuda && live.runs {
        match &run {
            V4Run::Split { .. } => {
                let launch = u(crate::variants::v4::launch_rows(p, case.v4.eager));
                limit(
                    "launched rows",
                    u128::from(launch),
                    GRID_YZ_MAX,
                    "CUDA's grid y limit",
                    "v4_split's grid is (head groups, rows, n)",
                )?;
                limit(
                    "launched rows x kernel heads",
                    u128::from(launch) * u128::from(hk),
                    GRID_X_MAX,
                    "CUDA's grid x limit",
                    "split_merge launches one block per (row, head)",
                )?;
            }
            V4Run::Hca { .. } => limit(
                "hca_persist partitions",
                case.v4.partitions as u128,
                GRID_YZ_MAX,
                "CUDA's grid y limit",
                "hca_persist's grid is (head groups, partitions)",
            )?,
            V4Run::Merge { .. } => limit(
                "checked rows x heads",
                u128::from(n_rows) * u128::from(h),
                GRID_X_MAX,
                "CUDA's grid x limit",
                "split_merge launches one block per (row, head)",
            )?,
            V4Run::Fails => {}
        }
    }

    // The workloads (workload/v4.rs::build): the first run and every replay
    // step, each with its own Q, pool and lists. Steps are built inside the
    // first run's build, so its pool permutation is alive through them.
    let seq_vec = |st: &Step| st.seqs * 16;
    let scratch = |st: &Step, step: bool| -> R<Parts> {
        let mut s = Parts::default();
        let list = (st.entries + p.indptr_offset as u128) as u64;
        s.host("build: pool row permutation", mul("permutation", &[st.pool_rows, I32])?)?;
        s.host(
            "build: list scratch (a row's candidates, junk, regrowth)",
            add(
                "list scratch",
                &[
                    st.row_scratch,
                    offset * I32,
                    mul("list regrowth", &[list, I32])?,
                    seq_vec(st),
                ],
            )?,
        )?;
        if step {
            s.host(
                "build: a step's params and sink",
                add("step params", &[nr * USIZE, mul("sink", &[hk, F32])?])?,
            )?;
        }
        Ok(s)
    };
    let mut max_pool = 0u64;
    let mut max_list = 0u64;
    let mut step_scratch = Parts::default();
    for (s, st) in steps.iter().enumerate() {
        let list = (st.entries + p.indptr_offset as u128) as u64;
        max_pool = max_pool.max(st.pool_rows);
        max_list = max_list.max(list);
        let wl = &mut live.workload;
        wl.host("workload: V4 Q (packed, rope, decoded, unquantized)", q)?;
        wl.host(
            "workload: V4 pool rows (packed, rope, decoded, unquantized)",
            mul("V4 pool", &[st.pool_rows, V4_ROW_BYTES])?,
        )?;
        // kv_indices grows by extend: up to twice its length.
        wl.host(
            "workload: V4 kv_indptr and kv_indices",
            add("V4 lists", &[(t + 1) * I32, mul("kv_indices", &[list, I32, 2])?])?,
        )?;
        wl.host("workload: headers and labels", HEADER_BYTES)?;
        wl.host(
            "workload: V4 positions and sink",
            add("positions and sink", &[nr * USIZE, mul("sink", &[hk, F32])?])?,
        )?;
        if s > 0 {
            step_scratch.keep_larger(scratch(st, true)?)?;
        }
    }
    live.building = scratch(main, false)?;
    if steps.len() > 1 {
        step_scratch.host(
            "build: pool row permutation",
            mul("permutation", &[main.pool_rows, I32])?,
        )?;
        step_scratch.host("build: sequence ranges", seq_vec(main))?;
        live.building.keep_larger(step_scratch)?;
    }

    // References: with and without quantization, and one per replay step.
    let ref_one = add(
        "one reference output",
        &[mul("reference o and lse", &[n_rows, hk, VD + 1, F64])?, n_rows * USIZE],
    )?;
    let k = u(steps.len());
    live.refs
        .host("references: o and lse (f64)", mul("references", &[ref_one, k + 1])?)?;
    live.refs.host("references: checked row ids", n_rows * USIZE)?;
    for st in &steps {
        let mut s = st.view.scratch(hk, VD, VD, n_rows)?;
        // attend merges the sink into a second o while the engine's is alive.
        s.host(
            "reference: o before the sink merge (f64)",
            add(
                "sink merge",
                &[mul("o", &[n_rows, hk, VD + 1, F64])?, mul("sink", &[hk, F64])?],
            )?,
        )?;
        live.referencing.keep_larger(s)?;
    }

    // Plan, backend, checks and device.
    let per_row = mul("o and lse row", &[h, VD + 1, F32])?;
    let outs = mul("V4 outputs", &[t, per_row])?;
    // v4_outputs and the CPU emulation strip every step's o and lse.
    let o_strip = doubled(t, mul("o row", &[h, VD])?, F32)?;
    let strips = add("stripped o and lse", &[o_strip, doubled(t, h, F32)?])?;
    let table = mul("split table", &[t + 1, u(pv4::MAX_SPLITS), I32])?;
    let inputs = |dev: &mut Parts| -> R<()> {
        dev.device("device: V4 Q (packed)", mul("q", &[t, hk, VD])?)?;
        dev.device("device: V4 Q rope", mul("q rope", &[t, hk, u(V4_D_ROPE), U16])?)?;
        dev.device("device: V4 pool (packed)", mul("pool", &[max_pool, VD])?)?;
        dev.device(
            "device: V4 pool rope",
            mul("pool rope", &[max_pool, u(V4_D_ROPE), U16])?,
        )?;
        dev.device("device: kv_indptr", (t + 1) * I32)?;
        dev.device("device: kv_indices", mul("kv_indices", &[max_list.max(1), I32])?)?;
        dev.device("device: sink", mul("sink", &[hk, F32])?)?;
        dev.device("device: o (bf16)", mul("o", &[t, hk, VD, U16])?)?;
        dev.device("device: lse", mul("lse", &[t, hk, F32])?)
    };
    let downloads = add(
        "downloads",
        &[
            mul("o download", &[t, hk, VD, U16 + F32])?,
            mul("lse download", &[t, hk, F32])?,
        ],
    )?;
    // A CPU emulation of every row in `rows_run` with `pieces` pieces of at
    // most `piece` tokens each: poisoned outputs, finished rows, per-thread buffers.
    let cpu_rows = |rows_run: u64, pieces: u64, piece: u64| -> R<Parts> {
        let mut c = Parts::default();
        c.host(
            "cpu: outputs at kernel heads (poisoned)",
            mul("poisoned outputs", &[t, hk, VD + 1, F32])?,
        )?;
        c.host(
            "cpu: finished rows and the row list",
            mul(
                "finished rows",
                &[
                    rows_run,
                    add("row", &[mul("r", &[hk, VD + 1, F32])?, CHUNK_HEADER + USIZE])?,
                ],
            )?,
        )?;
        let task = add(
            "cpu task",
            &[
                cpu_task(hk, piece, VD)?,
                mul("pieces", &[pieces + 1, hk, VD + 1, F32])?,
                VD * F32,
            ],
        )?;
        c.host(
            "cpu: per-thread Q, K, logits and pieces",
            mul("cpu tasks", &[concurrent(rows_run), task])?,
        )?;
        Ok(c)
    };
    let ref_checks = mul("check copies", &[n_rows, h, VD + 1, F32 + F64])?;
    match run {
        V4Run::Split { n, indptr } => {
            live.plan.host("plan: split CSR", indptr * I32)?;
            live.planning.host("plan: the [16, T+1] split table", table)?;
            live.outputs.host(
                "outputs: o and lse of every step (f32)",
                mul("outputs", &[strips, k, sets])?,
            )?;
            let rows_run = n_rows + if case.v4.eager { 0 } else { t - nr };
            if cuda {
                live.running.host("cuda: o and lse downloads", downloads)?;
            } else {
                for st in &steps {
                    let piece = st.max_checked_len.div_ceil(n);
                    live.running.keep_larger(cpu_rows(rows_run, n, piece)?)?;
                }
            }
            live.running
                .host("outputs: the buffer a growing strip leaves", o_strip / 2)?;
            let mut dev = Parts::default();
            inputs(&mut dev)?;
            dev.device("device: split CSR", indptr * I32)?;
            let slots = mul("split slots", &[n, t])?.max(1);
            dev.device("device: partial o (f32)", mul("partials", &[slots, hk, VD, F32])?)?;
            dev.device("device: partial lse", mul("partial lse", &[slots, hk, F32])?)?;
            live.device = dev;
            let copies = if k > 1 { 2 } else { 1 };
            live.checking.host(
                "checks: picked rows and reference copies",
                mul("checks", &[ref_checks, copies])?,
            )?;
        }
        V4Run::Hca { parts, pieces } => {
            let (plan, plan_scratch) = hca_plan_bytes(nr, parts, pieces)?;
            live.plan.host("plan: hca_persist partition plan", plan)?;
            live.planning
                .host("plan: hca planner scratch", add("hca", &[plan_scratch, nr * USIZE])?)?;
            live.outputs.host(
                "outputs: o and lse of every step (f32)",
                mul("outputs", &[strips, k, sets])?,
            )?;
            if cuda {
                live.running
                    .host("cuda: o and lse downloads, counters", add("dl", &[downloads, t * I32])?)?;
            } else {
                for st in &steps {
                    let total = (st.entries.min(u128::from(u64::MAX)) as u64).max(1);
                    let p_eff = u(hca::hca_effective_partitions(
                        case.v4.partitions.max(1),
                        total.min(usize::MAX as u64) as usize,
                        case.cus,
                        p.kernel_heads(),
                    ));
                    // A row meets at most one partition per partition length, plus its ends.
                    let part_len = total / p_eff.max(1);
                    let per_row = match st.max_checked_len.checked_div(part_len) {
                        Some(q) => p_eff.min(q + 2),
                        None => p_eff,
                    };
                    let mut c = cpu_rows(n_rows, per_row, st.max_checked_len)?;
                    let (pl, ps) = hca_plan_bytes(nr, p_eff, nr + p_eff)?;
                    c.host("cpu: a replay step's hca plan", add("replan", &[pl, ps, nr * USIZE])?)?;
                    live.running.keep_larger(c)?;
                }
            }
            live.running
                .host("outputs: the buffer a growing strip leaves", o_strip / 2)?;
            let mut dev = Parts::default();
            inputs(&mut dev)?;
            let ws = mul("workspace slots", &[2, u(case.v4.partitions)])?;
            dev.device("device: hca workspace o_acc (f32)", mul("o_acc", &[ws, hk, VD, F32])?)?;
            dev.device("device: hca workspace lse_acc", mul("lse_acc", &[ws, hk, F32])?)?;
            dev.device("device: hca row counters", t.max(1) * I32)?;
            live.device = dev;
            let copies = if k > 1 { 2 } else { 1 };
            live.checking.host(
                "checks: picked rows and reference copies",
                mul("checks", &[ref_checks, copies])?,
            )?;
        }
        V4Run::Merge { n } => {
            // split_merge_inputs: the split partials of the reference, then
            // their f32 copy for the kernel.
            live.plan.host(
                "plan: split_merge inputs (f32 partials)",
                add(
                    "split_merge inputs",
                    &[
                        mul("partials", &[n_rows, n, h, VD + 1, F32])?,
                        n_rows * USIZE,
                        mul("sink", &[h, F32])?,
                    ],
                )?,
            )?;
            let mut split_view = View::default();
            for &len in &main.checked_lens {
                split_view.group(1, len.div_ceil(n))?;
            }
            let mut pl = split_view.scratch(hk, VD, VD, n_rows)?;
            pl.host(
                "plan: reference split partials (f64)",
                mul("split partials", &[ref_one, n])?,
            )?;
            pl.host(
                "plan: the [16, T+1] split table and its row",
                add("table", &[table, (t + 1) * I32])?,
            )?;
            live.planning = pl;
            live.outputs
                .host("outputs: o and lse (f32)", mul("outputs", &[outs, sets])?)?;
            if cuda {
                live.running.host(
                    "cuda: o and lse downloads",
                    add(
                        "dl",
                        &[
                            (n_rows + 1) * I32,
                            mul("o download", &[n_rows, h, VD, U16 + F32])?,
                            mul("lse", &[n_rows, h, F32])?,
                        ],
                    )?,
                )?;
            }
            let mut dev = Parts::default();
            dev.device("device: partial o (f32)", mul("po", &[n_rows, n, h, VD, F32])?)?;
            dev.device("device: partial lse", mul("pl", &[n_rows, n, h, F32])?)?;
            dev.device("device: split CSR", (n_rows + 1) * I32)?;
            dev.device("device: sink", mul("sink", &[h, F32])?)?;
            dev.device("device: o (bf16)", mul("o", &[n_rows, h, VD, U16])?)?;
            dev.device("device: lse", mul("lse", &[n_rows, h, F32])?)?;
            live.device = dev;
            live.checking
                .host("checks: picked rows and reference copies", ref_checks)?;
        }
        V4Run::Fails => {}
    }
    let mut qc = Parts::default();
    qc.host(
        "checks: quantization-noise copies",
        mul("quant check", &[n_rows, h, VD, F32 + F64 + F64])?,
    )?;
    live.checking.keep_larger(qc)?;
    live.checking.host(
        "checks: empty (row, head) lists",
        mul("empty pairs", &[n_rows, h, EMPTY_PAIR])?,
    )?;
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self, Inputs, RefOut};
    use crate::workload::{self, Elems, MlaWorkload, V4Workload, Workload};

    /// Slack the estimate may exceed twice the real sizes by: per-thread
    /// buffers (K blocks, GEMM packing) and bookkeeping of tiny cases.
    const SLACK: u64 = 64 << 20;

    fn cases(toml: &str) -> Vec<Case> {
        crate::scenario::cases_of(toml)
    }

    fn opts(check_rows: Option<usize>, target: Target) -> Options {
        Options {
            check_rows,
            target,
            repeat_checks: 1,
        }
    }

    /// `footprint` on a fixed two-thread pool, so per-thread sizes do not
    /// depend on the machine the tests run on.
    fn est(case: &Case, o: &Options) -> Result<Footprint, SizeError> {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
            .install(|| footprint(case, o))
    }

    #[test]
    fn a_gpu_group_twin_holds_every_rank_of_its_gpu_at_once() {
        // W = 8 on 2 GPUs: 4 ranks a GPU, loaded together, against the
        // emulation's one rank at a time. 16 x 262144 tokens make a rank's
        // pool (604 MB) larger than the bandwidth probe's 512 MiB.
        let cs = cases(
            "[[mla]]\nbatch = 16\ncontext = 262144\nheads_local = 16\ns_q = 1\ndcp_world = 8\ndcp_devices = 2\nvariants = [\"page64\"]\ndtype = \"bf16\"\n",
        );
        let emu = cs.iter().find(|c| c.dcp_devices.is_none()).expect("the emulated case");
        let grp = cs.iter().find(|c| c.dcp_devices == Some(2)).expect("its -g2 twin");
        let o = opts(Some(4), Target::Cuda);
        let (e, g) = (est(emu, &o).unwrap(), est(grp, &o).unwrap());
        let shape = crate::dcp_step::StepShape {
            gpus: 2,
            world: 8,
            rows: 16,
            heads: 128,
            kernel_heads: 128,
            q_elem: 2,
            reduce_elem: 2,
        };
        let bufs = shape.buffers().named();
        let step: u64 = bufs.iter().map(|&(_, n)| n as u64).sum();
        // Both carry the L2 flush buffer once.
        let rank = e.device - L2_FLUSH;
        assert!(rank > 512 << 20, "{rank}");
        // Each of the step's buffers is rounded up to the driver's granule.
        let want = L2_FLUSH + 4 * rank + step;
        let granules = bufs.len() as u64 * DEVICE_GRANULE;
        assert!(
            (want..=want + granules).contains(&g.device),
            "group {} vs {want}",
            g.device
        );
        // The CPU backend runs the same twin rank after rank.
        let oc = opts(Some(4), Target::Cpu);
        assert_eq!(est(grp, &oc).unwrap().device, est(emu, &oc).unwrap().device);
    }

    fn bytes<T>(v: &[T]) -> u64 {
        std::mem::size_of_val(v) as u64
    }

    fn elems(e: &Elems) -> u64 {
        e.as_bytes().len() as u64
    }

    fn mla_bytes(w: &MlaWorkload) -> u64 {
        let mut n = bytes(&w.p.ctx) + elems(&w.q) + bytes(&w.q_vals) + elems(&w.kv) + bytes(&w.kv_vals);
        n += w.q_src.as_deref().map_or(0, bytes) + w.kv_src.as_deref().map_or(0, bytes);
        n += bytes(&w.g_kv_indptr) + bytes(&w.qo_indptr);
        for sh in &w.shards {
            n += bytes(&sh.local_lens) + elems(&sh.pool) + bytes(&sh.kv_indptr);
            n += bytes(&sh.kv_indices) + bytes(&sh.kv_last_page_len);
        }
        n
    }

    fn v4_bytes(w: &V4Workload) -> u64 {
        let mut n = bytes(&w.p.positions) + bytes(&w.q_packed) + bytes(&w.q_rope) + bytes(&w.q_vals);
        n += bytes(&w.q_src) + bytes(&w.pool_packed) + bytes(&w.pool_rope) + bytes(&w.pool_vals);
        n += bytes(&w.pool_src) + bytes(&w.kv_indptr) + bytes(&w.kv_indices) + bytes(&w.sink);
        n + w.steps.iter().map(v4_bytes).sum::<u64>()
    }

    fn ref_bytes(r: &RefOut) -> u64 {
        bytes(&r.rows) + bytes(&r.o) + bytes(&r.lse)
    }

    /// What `runner::build_refs` keeps for this case (plus the merge
    /// variants' inputs, which are built from it), in bytes.
    fn refs_and_inputs(case: &Case, wl: &Workload, check_rows: Option<usize>) -> u64 {
        let total = match &case.params {
            CaseParams::Mla(p) => p.total_q(),
            CaseParams::V4(p) => p.rows,
        };
        let rows = reference::sample_rows(total, check_rows, case.seed);
        let mut n = bytes(&rows);
        match wl {
            Workload::Mla(w) => {
                let ranks: Vec<RefOut> = (0..w.p.dcp.world)
                    .map(|r| reference::mla::rank(w, r, &rows, Inputs::Dequantized).unwrap())
                    .collect();
                let full = if w.p.dcp.world == 1 {
                    ranks[0].clone()
                } else {
                    reference::mla::full(w, &rows, Inputs::Dequantized).unwrap()
                };
                n += ranks.iter().map(ref_bytes).sum::<u64>() + ref_bytes(&full);
                if w.p.dtype == Dtype::Fp8 {
                    n += ref_bytes(&reference::mla::full(w, &rows, Inputs::Unquantized).unwrap());
                }
                if case.variant == dcp_combine::ID {
                    // bf16 o and f32 lse of every rank, and the rows.
                    n += ranks
                        .iter()
                        .map(|r| r.o.len() as u64 * 2 + r.lse.len() as u64 * 4)
                        .sum::<u64>();
                    n += bytes(&rows);
                }
            }
            Workload::V4(w) => {
                n += ref_bytes(&reference::v4::attend(w, &rows, Inputs::Dequantized));
                n += ref_bytes(&reference::v4::attend(w, &rows, Inputs::Unquantized));
                for s in &w.steps {
                    n += ref_bytes(&reference::v4::attend(s, &rows, Inputs::Dequantized));
                }
                if case.variant == split_merge::ID {
                    let p = &w.p;
                    let bound = pv4::kv_len_bound(p.layer, p.index_topk, p.max_model_len);
                    let sn = pv4::v4_split_plan(p.rows, p.padded_rows, w.heads, bound, case.cus, case.v4.splits).n;
                    let parts = reference::v4::split_partials(w, &rows, sn);
                    n += parts.iter().map(ref_bytes).sum::<u64>();
                    n += (rows.len() * sn * p.heads * (V4_D + 1) * 4) as u64;
                }
            }
        }
        n
    }

    /// Builds every case and its references, and checks that the estimate
    /// covers their real sizes and stays within twice them plus `SLACK`.
    fn check_bounds(cs: &[Case], check_rows: Option<usize>) {
        for case in cs {
            let wl = workload::build(case).unwrap();
            let actual = match &wl {
                Workload::Mla(w) => mla_bytes(w),
                Workload::V4(w) => v4_bytes(w),
            } + refs_and_inputs(case, &wl, check_rows);
            for target in [Target::Cpu, Target::Cuda] {
                let f = est(case, &opts(check_rows, target)).unwrap();
                assert!(
                    f.host >= actual,
                    "{} {target:?} rows {check_rows:?}: estimate {} is below the real {} ({:#?})",
                    case.key(),
                    f.host,
                    actual,
                    f.parts
                );
                assert!(
                    f.host <= 2 * actual + SLACK,
                    "{} {target:?} rows {check_rows:?}: estimate {} is over twice the real {} ({:#?})",
                    case.key(),
                    f.host,
                    actual,
                    f.parts
                );
                assert_eq!(f.host, f.parts.iter().map(|p| p.host).sum::<u64>(), "parts add up");
                assert_eq!(f.device, f.parts.iter().map(|p| p.device).sum::<u64>(), "parts add up");
                assert_eq!(
                    f.device == 0,
                    target == Target::Cpu,
                    "{}: device memory only on CUDA",
                    case.key()
                );
            }
        }
    }

    const MLA: &str = r#"
        seed = 3
        [[mla]]
        batch = 3
        context = { list = [700, 1500, 2100] }
        heads_local = 16
        s_q = [1, 4]
        dtype = ["bf16", "fp8"]
        variants = ["ps1", "page64", "dcp_combine"]

        [[mla]]
        label = "dcp"
        batch = 2
        context = { list = [900, 1700] }
        heads_local = [8, 2]
        dcp_world = [2, 8]
        interleave = 2
        s_q = [1, 4]
        dtype = ["bf16", "fp8"]
        variants = ["ps1", "page64", "dcp_combine"]
    "#;

    #[test]
    fn mla_estimates_cover_real_workloads_and_references_tightly() {
        // heads_local 2 only with DCP 8 and 8 only with DCP 2: 16 gathered heads.
        let cs: Vec<Case> = cases(MLA)
            .into_iter()
            .filter(|c| c.mla().is_some_and(|p| p.heads() == 16))
            .filter(|c| variants::decide(c).skip.is_none())
            .collect();
        let pages: std::collections::BTreeSet<usize> = cs.iter().map(|c| c.mla().unwrap().page_size).collect();
        let worlds: std::collections::BTreeSet<usize> = cs.iter().map(|c| c.mla().unwrap().dcp.world).collect();
        assert_eq!(pages.into_iter().collect::<Vec<_>>(), vec![1, 64]);
        assert_eq!(worlds.into_iter().collect::<Vec<_>>(), vec![1, 2, 8]);
        assert!(cs.len() >= 12, "{} cases", cs.len());
        check_bounds(&cs, None);
        check_bounds(&cs[..6], Some(5));
    }

    const V4: &str = r#"
        seed = 5
        [[v4]]
        layer = ["swa", "csa", "hca"]
        rows = 16
        pad_rows = 4
        heads = [16, 128]
        position = { random = { min = 100, max = 6000 } }
        verify = [1, 2]
        index_topk = 64
        indptr_offset = [0, 5]
        replay = 2
        variants = ["v4_split", "hca_persist", "split_merge"]
    "#;

    #[test]
    fn v4_estimates_cover_real_workloads_with_replay_and_offsets() {
        let all = cases(V4);
        // One case per (layer, variant) keeps it fast; offsets and verify vary.
        let mut seen = std::collections::BTreeSet::new();
        let cs: Vec<Case> = all
            .into_iter()
            .enumerate()
            .filter(|(i, c)| {
                let p = c.v4().unwrap();
                (p.heads == 128 || i % 3 == 0)
                    && seen.insert((p.layer.to_string(), c.variant, p.heads, p.indptr_offset > 0))
            })
            .map(|(_, c)| c)
            .collect();
        assert!(cs.iter().any(|c| c.v4().unwrap().indptr_offset == 5));
        assert!(cs.iter().all(|c| c.v4().unwrap().replay == 2));
        assert!(
            cs.iter()
                .any(|c| c.variant == hca_unit::ID && variants::decide(c).fallback.is_none()),
            "an hca_persist case that runs its own plan"
        );
        check_bounds(&cs, None);
        check_bounds(&cs[..4], Some(3));
    }

    fn mla_case(variant: &str) -> Case {
        let toml = format!(
            "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 16\nvariants = [\"{variant}\"]\ndtype = \"bf16\"\n"
        );
        cases(&toml).remove(0)
    }

    fn v4_mut(c: &mut Case) -> &mut V4Params {
        match &mut c.params {
            CaseParams::V4(p) => p,
            CaseParams::Mla(_) => unreachable!(),
        }
    }

    fn mla_mut(c: &mut Case) -> &mut MlaParams {
        match &mut c.params {
            CaseParams::Mla(p) => p,
            CaseParams::V4(_) => unreachable!(),
        }
    }

    #[test]
    fn a_hundred_million_sequences_are_sized_without_building_them() {
        let mut c = mla_case("ps1");
        let p = mla_mut(&mut c);
        p.batch = 100_000_000;
        p.ctx = vec![1; p.batch];
        let t0 = std::time::Instant::now();
        let f = est(&c, &opts(Some(16), Target::Cpu)).unwrap();
        // Q alone: 1e8 rows x 16 heads x 576 x (2 + 4) bytes.
        assert!(f.host >= 100_000_000 * 16 * 576 * 6, "{}", human(f.host));
        assert!(f.host < 100_000_000 * 16 * 576 * 40, "{}", human(f.host));
        assert!(t0.elapsed().as_secs() < 60, "took {:?}", t0.elapsed());
        // page64's grid holds 65535 sequences in z.
        let mut pg = mla_case("page64");
        mla_mut(&mut pg).ctx = std::mem::take(&mut mla_mut(&mut c).ctx);
        mla_mut(&mut pg).batch = 100_000_000;
        let e = est(&pg, &opts(Some(16), Target::Cuda)).unwrap_err();
        assert!(matches!(e, SizeError::Unrepresentable(_)), "{e}");
        assert!(
            e.to_string().contains("batch 100000000") && e.to_string().contains("65535"),
            "{e}"
        );
        assert!(
            est(&pg, &opts(Some(16), Target::Cpu)).is_ok(),
            "the CPU backend has no grid"
        );
        // 22 query tokens each: 2.2e9 query rows pass i32.
        let mut dc = mla_case("dcp_combine");
        mla_mut(&mut dc).ctx = std::mem::take(&mut mla_mut(&mut pg).ctx);
        mla_mut(&mut dc).batch = 100_000_000;
        mla_mut(&mut dc).s_q = 22;
        let e = est(&dc, &opts(None, Target::Cpu)).unwrap_err();
        assert_eq!(
            e,
            SizeError::Unrepresentable(
                "query rows (batch x s_q) 2200000000 exceeds i32 (2147483647), the kernels' qo_indptr type".into()
            )
        );
    }

    #[test]
    fn a_context_of_two_to_the_forty_is_unrepresentable() {
        let mut c = mla_case("ps1");
        mla_mut(&mut c).ctx[1] = 1 << 40;
        let e = est(&c, &opts(None, Target::Cpu)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unrepresentable: sum of context lengths 1099511627840 exceeds i32 (2147483647), the kernels' g_kv_indptr type"
        );
        // Under i32 in tokens, but the pool's NaN slack (1/16 more pages)
        // takes its page ids past it.
        mla_mut(&mut c).ctx[1] = (1 << 31) - 100;
        let e = est(&c, &opts(None, Target::Cpu)).unwrap_err();
        assert_eq!(
            e,
            SizeError::Unrepresentable(
                "pool pages 2281701338 exceeds i32 (2147483647), page ids are i32 kv_indices entries".into()
            )
        );
    }

    #[test]
    fn hca_lists_of_positions_near_two_to_the_forty_are_unrepresentable() {
        let mut c = cases(
            "[[v4]]\nlayer = \"hca\"\nrows = 4\npad_rows = 2\nheads = 128\nposition = 1000\nvariants = [\"hca_persist\"]\n",
        )
        .remove(0);
        v4_mut(&mut c).positions = (0..4).map(|i| (1 << 40) + i * 7).collect();
        v4_mut(&mut c).max_model_len = 1 << 41;
        let e = est(&c, &opts(None, Target::Cuda)).unwrap_err();
        let SizeError::Unrepresentable(m) = &e else {
            panic!("{e}")
        };
        // 4 rows of 128 + 2^40/128 entries each.
        assert!(
            m.starts_with("V4 list entries plus indptr_offset 34359738880 exceeds i32"),
            "{m}"
        );
        // A window-only layer at the same positions lists 128 tokens a row: fine.
        v4_mut(&mut c).layer = LayerType::Swa;
        c.variant = v4_split::ID;
        assert!(est(&c, &opts(None, Target::Cuda)).is_ok());
    }

    #[test]
    fn sizes_past_u64_are_overflow_errors() {
        let mut c = mla_case("dcp_combine");
        mla_mut(&mut c).heads_local = 1 << 56;
        let e = est(&c, &opts(None, Target::Cpu)).unwrap_err();
        let SizeError::Overflow(m) = &e else { panic!("{e}") };
        assert!(
            m.contains("exceeds u64 (18446744073709551615)") && m.contains("72057594037927936"),
            "{m}"
        );
        // The same case on CUDA: dcp_combine's grid refuses it first.
        assert!(matches!(
            est(&c, &opts(None, Target::Cuda)),
            Err(SizeError::Unrepresentable(_))
        ));
        // V4 with absurd heads: T x heads x row bytes.
        let mut v = cases("[[v4]]\nlayer = \"swa\"\nrows = 2\nheads = 16\nposition = 10\nvariants = [\"v4_split\"]\n")
            .remove(0);
        v4_mut(&mut v).heads = 1 << 60;
        assert!(matches!(est(&v, &opts(None, Target::Cpu)), Err(SizeError::Overflow(_))));
        // A huge pad: the [16, T+1] table of v4_split cannot hold it.
        v4_mut(&mut v).heads = 16;
        v4_mut(&mut v).padded_rows = 1 << 40;
        let e = est(&v, &opts(None, Target::Cpu)).unwrap_err();
        assert!(e.to_string().contains("padded rows T"), "{e}");
        v4_mut(&mut v).padded_rows = 1 << 28;
        let e = est(&v, &opts(None, Target::Cpu)).unwrap_err();
        assert!(e.to_string().contains("split table entries (16 x T) 4294967296"), "{e}");
    }

    #[test]
    fn largest_fitting_finds_the_boundary_of_32_long_sequences_in_24_gib() {
        let c =
            cases("[[mla]]\nbatch = 32\ncontext = 262144\nheads_local = 16\ndtype = \"bf16\"\nvariants = [\"ps1\"]\n")
                .remove(0);
        let o = opts(Some(16), Target::Cpu);
        let limit = 24u64 << 30;
        let whole = est(&c, &o).unwrap();
        assert!(whole.host > limit, "32 x 256k bf16 is {}", human(whole.host));
        let n = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
            .install(|| largest_fitting(&c, &o, limit, u64::MAX))
            .unwrap();
        assert!((1..32).contains(&n), "{n}");
        let at = |k: usize| {
            let mut s = c.clone();
            mla_mut(&mut s).ctx.truncate(k);
            mla_mut(&mut s).batch = k;
            est(&s, &o).unwrap().host
        };
        assert!(
            at(n) <= limit && at(n + 1) > limit,
            "{n}: {} / {}",
            human(at(n)),
            human(at(n + 1))
        );
        // Roughly linear in the batch: each sequence holds about 1.2 GiB.
        assert!((12..=22).contains(&n), "{n}");
        assert_eq!(
            largest_fitting(&c, &o, u64::MAX, 0),
            Some(32),
            "no device on the CPU backend"
        );
        assert_eq!(largest_fitting(&c, &o, 1 << 20, u64::MAX), None);
    }

    #[test]
    fn largest_fitting_shrinks_v4_rows_to_a_device_limit() {
        let c = cases(
            "[[v4]]\nlayer = \"hca\"\nrows = 64\npad_rows = 8\nheads = 128\nmax_model_len = 2097152\nposition = { random = { min = 1000, max = 200000 } }\nvariants = [\"v4_split\"]\n",
        )
        .remove(0);
        let o = opts(Some(4), Target::Cuda);
        let whole = est(&c, &o).unwrap();
        let at = |k: usize| {
            let mut s = c.clone();
            let p = v4_mut(&mut s);
            p.positions.truncate(k);
            p.rows = k;
            p.padded_rows = k + 8;
            est(&s, &o).unwrap().device
        };
        // The L2 flush and one page per buffer stay; pools and partials
        // shrink (at a 2M context's bound 64 rows x 128 heads split; at 1M
        // they take whole rows and write no partials).
        assert!(
            at(1) + (40 << 20) < whole.device,
            "{} of {}",
            human(at(1)),
            human(whole.device)
        );
        let limit = (at(1) + whole.device) / 2;
        let n = largest_fitting(&c, &o, u64::MAX, limit).unwrap();
        assert!(n < 64 && at(n) <= limit && at(n + 1) > limit, "{n}");
        assert_eq!(largest_fitting(&c, &o, u64::MAX, at(1) - 1), None);
    }

    #[test]
    fn cuda_holds_one_rank_at_a_time_plus_the_l2_flush() {
        let c = cases(
            "[[mla]]\nbatch = 2\ncontext = { list = [5000, 9000] }\nheads_local = 2\ndcp_world = 8\ndtype = \"fp8\"\nvariants = [\"ps1\"]\n",
        )
        .remove(0);
        let Workload::Mla(w) = workload::build(&c).unwrap() else {
            unreachable!()
        };
        let f = est(&c, &opts(None, Target::Cuda)).unwrap();
        let part = |name: &str| f.parts.iter().find(|p| p.what == name).map(|p| p.device).unwrap();
        let largest = w.shards.iter().map(|s| elems(&s.pool)).max().unwrap();
        assert_eq!(
            part("device: the rank's KV pool"),
            largest.div_ceil(DEVICE_GRANULE) * DEVICE_GRANULE
        );
        assert_eq!(part("device: L2 flush buffer (2 x 60 MiB, per process)"), 120 << 20);
        // Q padded from 16 to the kernel's 16 heads, one rank: 2 rows x 16 x 576 bytes.
        assert_eq!(part("device: Q at kernel heads"), DEVICE_GRANULE);
        assert!(f.device < 200 << 20, "{}", human(f.device));
    }

    #[test]
    fn repeated_checks_keep_more_outputs() {
        let c = cases(
            "[[v4]]\nlayer = \"swa\"\nrows = 64\npad_rows = 0\nheads = 128\nposition = 5000\nvariants = [\"v4_split\"]\n",
        )
        .remove(0);
        let one = est(&c, &opts(Some(2), Target::Cpu)).unwrap();
        let mut o = opts(Some(2), Target::Cpu);
        o.repeat_checks = 3;
        let three = est(&c, &o).unwrap();
        let out = |f: &Footprint| f.parts.iter().find(|p| p.what.starts_with("outputs:")).map(|p| p.host);
        // 64 rows (a power of two: strip's capacity is exact) x 128 heads x 513 x 4 bytes.
        let set = 64 * 128 * 513 * 4;
        assert_eq!(out(&one), Some(set));
        assert_eq!(out(&three), Some(3 * set));
        assert_eq!(three.host - one.host, 2 * set);
    }

    #[test]
    fn skipped_and_malformed_cases_need_nothing() {
        let mut c = cases(
            "[[mla]]\nbatch = 2\ncontext = 64\nheads_local = 8\ndcp_world = 8\ns_q = 4\ndtype = \"fp8\"\nvariants = [\"page64\"]\n",
        )
        .remove(0);
        assert!(
            variants::decide(&c).skip.is_some(),
            "the gate rejects page64 under DCP with s_q > 1"
        );
        assert_eq!(est(&c, &opts(None, Target::Cuda)).unwrap(), Footprint::default());
        c.variant = ps1_unit::ID;
        mla_mut(&mut c).batch = 3; // ctx has 2 entries: the build refuses it
        assert_eq!(est(&c, &opts(None, Target::Cpu)).unwrap(), Footprint::default());
    }

    #[test]
    fn human_uses_binary_units_with_one_decimal() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1024), "1.0 KiB");
        assert_eq!(human(1536 << 10), "1.5 MiB");
        assert_eq!(human((123 << 30) / 10), "12.3 GiB");
        assert_eq!(human(u64::MAX), "16.0 EiB");
        let f = Footprint {
            host: 3 << 30,
            device: 1 << 20,
            parts: vec![],
        };
        assert_eq!(f.to_string(), "3.0 GiB host, 1.0 MiB device");
    }
}
