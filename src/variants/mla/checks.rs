//! The checks of an MLA decode kernel (ps1, page64): every rank's `o` and
//! `lse` against the reference of that rank's shard under the global mask,
//! and, under DCP, the ranks' outputs merged in f64 against the unsharded
//! attention, as is the merge a DCP step on several GPUs did on them.

use crate::case::MLA_D_V;
use crate::reference::{self, RefSet};
use crate::result::Check;
use crate::variants::checks::{pair, quant_noise, ref_heads};
use crate::variants::output::{find, OutTensor};
use crate::variants::Job;
use crate::workload::Workload;

pub fn decode(job: &Job, refs: &RefSet, out: &[OutTensor], quant: bool) -> Result<Vec<Check>, String> {
    let Workload::Mla(w) = job.workload else {
        return Err("an MLA check of a V4 workload".into());
    };
    let (tol, rows, d) = (&job.case.tol, &refs.rows, MLA_D_V);
    let world = refs.ranks.len();
    let mut cs = Vec::new();
    let mut ranks: Vec<(Vec<f64>, Vec<f64>)> = Vec::with_capacity(world);
    for (r, rr) in refs.ranks.iter().enumerate() {
        let o = find(out, &format!("o.r{r}"))?.pick(rows, false);
        let l = find(out, &format!("lse.r{r}"))?.pick(rows, false);
        let name = if world == 1 { String::new() } else { format!("r{r}") };
        cs.extend(pair(&name, &o, &rr.o, &l, &rr.lse, d, tol));
        ranks.push((
            o.iter().map(|&x| x as f64).collect(),
            l.iter().map(|&x| x as f64).collect(),
        ));
    }
    if world > 1 {
        // The kernel's rank outputs merged in f64 must equal the unsharded attention.
        let parts: Vec<(&[f64], &[f64])> = ranks.iter().map(|(o, l)| (o.as_slice(), l.as_slice())).collect();
        let (mo, ml) = reference::combine::combine(&parts, d);
        let mo32: Vec<f32> = mo.iter().map(|&x| x as f32).collect();
        let ml32: Vec<f32> = ml.iter().map(|&x| x as f32).collect();
        for mut c in pair("", &mo32, &refs.full.o, &ml32, &refs.full.lse, d, tol) {
            c.tensor = format!("{}.merged", c.tensor);
            cs.push(c);
        }
    }
    // A DCP step on a group of GPUs also merges on the devices (NCCL's
    // reduce-scatter in bf16): that output must match the unsharded attention too.
    if let (Ok(o), Ok(l)) = (find(out, "o.dcp"), find(out, "lse.dcp")) {
        let (o, l) = (o.pick(rows, false), l.pick(rows, false));
        cs.extend(pair("dcp", &o, &refs.full.o, &l, &refs.full.lse, d, tol));
    }
    if let (Some(unq), true) = (&refs.unquantized, quant) {
        let h = w.heads();
        let n = rows.len();
        cs.push(quant_noise(
            &ref_heads(&refs.full.o, n, refs.full.heads, h, d),
            &ref_heads(&unq.o, n, unq.heads, h, d),
        ));
    }
    Ok(cs)
}
