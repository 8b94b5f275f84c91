//! `--dump DIR`: one .safetensors file per (case, variant) holding the inputs
//! the kernel saw, its outputs and the reference, for offline debugging with
//! `safetensors.torch.load_file` or `safetensors.numpy.load_file`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use safetensors::tensor::{Dtype, TensorView};

use super::run_dir::write_atomic;
use crate::case::Case;
use crate::reference::RefSet;
use crate::result::Row;
use crate::variants::OutTensor;
use crate::workload::{Elems, Workload};

/// Borrowed tensor data; bf16 and fp8 stay raw bits (fp8 as U8: safetensors
/// readers disagree on F8 names, and the bytes are what the kernel read).
#[derive(Clone, Copy, Debug)]
pub enum DumpData<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    Bf16Bits(&'a [u16]),
    U8(&'a [u8]),
    I32(&'a [i32]),
}

impl DumpData<'_> {
    fn len(&self) -> usize {
        match self {
            DumpData::F32(v) => v.len(),
            DumpData::F64(v) => v.len(),
            DumpData::Bf16Bits(v) => v.len(),
            DumpData::U8(v) => v.len(),
            DumpData::I32(v) => v.len(),
        }
    }

    fn dtype(&self) -> Dtype {
        match self {
            DumpData::F32(_) => Dtype::F32,
            DumpData::F64(_) => Dtype::F64,
            DumpData::Bf16Bits(_) => Dtype::BF16,
            DumpData::U8(_) => Dtype::U8,
            DumpData::I32(_) => Dtype::I32,
        }
    }

    /// Little-endian bytes, as the format requires.
    fn to_le_bytes(self) -> Vec<u8> {
        match self {
            DumpData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DumpData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DumpData::Bf16Bits(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DumpData::U8(v) => v.to_vec(),
            DumpData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// One named tensor. Scalars (scales) use shape `[1]`.
#[derive(Clone, Debug)]
pub struct DumpTensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: DumpData<'a>,
}

/// Writes `tensors` and string `metadata` (case id, status, repro...) to
/// `path`, atomically. Fails on a shape that does not match its data or a
/// repeated name, instead of writing a file that loads wrong.
pub fn write_safetensors(
    path: &Path,
    tensors: &[DumpTensor],
    metadata: BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let mut seen = HashSet::new();
    for t in tensors {
        if !seen.insert(t.name.as_str()) {
            bail!("dump {}: tensor `{}` appears twice", path.display(), t.name);
        }
        let n: usize = t.shape.iter().product();
        if n != t.data.len() {
            bail!(
                "dump {}: tensor `{}` has shape {:?} ({n} elements) but {} elements of data",
                path.display(),
                t.name,
                t.shape,
                t.data.len()
            );
        }
    }
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| t.data.to_le_bytes()).collect();
    let mut views = Vec::with_capacity(tensors.len());
    for (t, b) in tensors.iter().zip(&bytes) {
        let view = TensorView::new(t.data.dtype(), t.shape.clone(), b)
            .with_context(|| format!("dump {}: tensor `{}`", path.display(), t.name))?;
        views.push((t.name.as_str(), view));
    }
    let info: Option<HashMap<String, String>> = (!metadata.is_empty()).then(|| metadata.into_iter().collect());
    let file = safetensors::serialize(views, &info).with_context(|| format!("serializing {}", path.display()))?;
    write_atomic(path, &file)
}

/// `DIR/<case_id>__<variant>.safetensors`, with characters that are unsafe
/// in file names (path separators, shell and Windows specials) replaced by `_`.
pub fn dump_path(dir: &Path, case_id: &str, variant: &str) -> PathBuf {
    let safe = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '=' | '+') {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    dir.join(format!("{}__{}.safetensors", safe(case_id), safe(variant)))
}

/// `--dump`: one .safetensors per (case, variant) with inputs, outputs and
/// reference, loadable with `safetensors.torch.load_file`.
pub fn case(dir: &Path, case: &Case, wl: &Workload, refs: &RefSet, out: &[OutTensor], row: &Row) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    fn t<'a>(name: &str, shape: Vec<usize>, data: DumpData<'a>) -> DumpTensor<'a> {
        DumpTensor {
            name: name.to_string(),
            shape,
            data,
        }
    }
    let mut ts: Vec<DumpTensor> = Vec::new();
    let scales: Vec<f32>;
    match wl {
        Workload::Mla(w) => {
            let h = w.heads();
            ts.push(match &w.q {
                Elems::Bf16(v) => t("q", vec![w.p.total_q(), h, 576], DumpData::Bf16Bits(v)),
                Elems::Fp8(v) => t("q", vec![w.p.total_q(), h, 576], DumpData::U8(v)),
            });
            scales = vec![w.q_scale, w.kv_scale, w.p.sm_scale as f32];
            ts.push(t("scales_q_kv_sm", vec![3], DumpData::F32(&scales)));
            ts.push(t("qo_indptr", vec![w.qo_indptr.len()], DumpData::I32(&w.qo_indptr)));
            ts.push(t(
                "g_kv_indptr",
                vec![w.g_kv_indptr.len()],
                DumpData::I32(&w.g_kv_indptr),
            ));
            for sh in &w.shards {
                let r = sh.rank;
                let shape = vec![sh.num_pages, w.p.page_size, 576];
                ts.push(match &sh.pool {
                    Elems::Bf16(v) => t(&format!("kv_pool.r{r}"), shape, DumpData::Bf16Bits(v)),
                    Elems::Fp8(v) => t(&format!("kv_pool.r{r}"), shape, DumpData::U8(v)),
                });
                ts.push(t(
                    &format!("kv_indptr.r{r}"),
                    vec![sh.kv_indptr.len()],
                    DumpData::I32(&sh.kv_indptr),
                ));
                ts.push(t(
                    &format!("kv_indices.r{r}"),
                    vec![sh.kv_indices.len()],
                    DumpData::I32(&sh.kv_indices),
                ));
                ts.push(t(
                    &format!("kv_last_page_len.r{r}"),
                    vec![sh.kv_last_page_len.len()],
                    DumpData::I32(&sh.kv_last_page_len),
                ));
            }
            for (r, rr) in refs.ranks.iter().enumerate() {
                ts.push(t(
                    &format!("ref.o.r{r}"),
                    vec![rr.rows.len(), rr.heads, rr.d_v],
                    DumpData::F64(&rr.o),
                ));
                ts.push(t(
                    &format!("ref.lse.r{r}"),
                    vec![rr.rows.len(), rr.heads],
                    DumpData::F64(&rr.lse),
                ));
            }
        }
        Workload::V4(w) => {
            ts.push(t("q_packed", vec![w.t, w.heads, 512], DumpData::U8(&w.q_packed)));
            ts.push(t("q_rope", vec![w.t, w.heads, 64], DumpData::Bf16Bits(&w.q_rope)));
            ts.push(t("unified_kv", vec![w.pool_rows, 512], DumpData::U8(&w.pool_packed)));
            ts.push(t(
                "unified_kv_rope",
                vec![w.pool_rows, 64],
                DumpData::Bf16Bits(&w.pool_rope),
            ));
            ts.push(t("kv_indptr", vec![w.kv_indptr.len()], DumpData::I32(&w.kv_indptr)));
            ts.push(t("kv_indices", vec![w.kv_indices.len()], DumpData::I32(&w.kv_indices)));
            ts.push(t("attn_sink", vec![w.sink.len()], DumpData::F32(&w.sink)));
        }
    }
    let rows_i32: Vec<i32> = refs.rows.iter().map(|&r| r as i32).collect();
    ts.push(t("checked_rows", vec![rows_i32.len()], DumpData::I32(&rows_i32)));
    ts.push(t(
        "ref.o",
        vec![refs.full.rows.len(), refs.full.heads, refs.full.d_v],
        DumpData::F64(&refs.full.o),
    ));
    ts.push(t(
        "ref.lse",
        vec![refs.full.rows.len(), refs.full.heads],
        DumpData::F64(&refs.full.lse),
    ));
    for o in out {
        let rows = o.data.len() / o.row_len.max(1);
        ts.push(t(
            &format!("out.{}", o.name),
            vec![rows, o.row_len],
            DumpData::F32(&o.data),
        ));
    }
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("case".to_string(), case.key());
    meta.insert("status".to_string(), format!("{:?}", row.status));
    meta.insert("repro".to_string(), row.repro.clone());
    let path = dir.join(format!("{}__{}.safetensors", case.id, case.variant));
    write_safetensors(&path, &ts, meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::SafeTensors;

    #[test]
    fn round_trip_keeps_bytes_shapes_and_dtypes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("case__ps1.safetensors");
        let o = [1.5f32, -0.0, f32::NAN, f32::NEG_INFINITY, 3.25, 1e-30];
        let r = [0.1f64, -2.0, f64::NEG_INFINITY];
        let q = [0x3f80u16, 0xbf80, 0x7fc0, 0x0001];
        let kv = [0u8, 0x38, 0x7e, 0xff, 0x80, 0x01];
        let idx = [0i32, -1, 7, i32::MAX];
        let scale = [0.0625f32];
        let t = |name: &str, shape: Vec<usize>, data| DumpTensor {
            name: name.to_string(),
            shape,
            data,
        };
        let tensors = vec![
            t("out.o", vec![2, 3], DumpData::F32(&o)),
            t("ref.lse", vec![3], DumpData::F64(&r)),
            t("q", vec![1, 2, 2], DumpData::Bf16Bits(&q)),
            t("kv_pool.r0", vec![3, 2], DumpData::U8(&kv)),
            t("kv_indices", vec![4], DumpData::I32(&idx)),
            t("q_scale", vec![1], DumpData::F32(&scale)),
        ];
        let mut meta = BTreeMap::new();
        meta.insert("case".to_string(), "mla-b4/ps1".to_string());
        write_safetensors(&path, &tensors, meta).unwrap();

        let buf = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&buf).unwrap();
        assert_eq!(st.len(), tensors.len());
        for want in &tensors {
            let got = st.tensor(&want.name).unwrap();
            assert_eq!(got.dtype(), want.data.dtype(), "{}", want.name);
            assert_eq!(got.shape(), want.shape.as_slice(), "{}", want.name);
            assert_eq!(got.data(), want.data.to_le_bytes().as_slice(), "{}", want.name);
        }
        let back: Vec<f32> = st
            .tensor("out.o")
            .unwrap()
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back[0], 1.5);
        assert!(back[2].is_nan());
        assert_eq!(st.tensor("kv_indices").unwrap().data()[4..8], (-1i32).to_le_bytes());
        let (_, header) = SafeTensors::read_metadata(&buf).unwrap();
        assert_eq!(header.metadata().as_ref().unwrap()["case"], "mla-b4/ps1");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind: {leftovers:?}");
    }

    #[test]
    fn bad_shapes_and_duplicate_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let v = [1.0f32, 2.0, 3.0];
        let bad = [DumpTensor {
            name: "o".into(),
            shape: vec![2, 2],
            data: DumpData::F32(&v),
        }];
        let err = write_safetensors(&path, &bad, BTreeMap::new()).unwrap_err().to_string();
        assert!(err.contains("shape [2, 2] (4 elements) but 3"), "{err}");
        let dup = [
            DumpTensor {
                name: "o".into(),
                shape: vec![3],
                data: DumpData::F32(&v),
            },
            DumpTensor {
                name: "o".into(),
                shape: vec![3],
                data: DumpData::F32(&v),
            },
        ];
        assert!(write_safetensors(&path, &dup, BTreeMap::new())
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(!path.exists());
    }

    #[test]
    fn dump_paths_are_single_file_names() {
        let p = dump_path(Path::new("dumps"), "mla/b4 ctx=8k:s*", "ps1");
        assert_eq!(p, Path::new("dumps").join("mla_b4_ctx=8k_s___ps1.safetensors"));
    }
}
