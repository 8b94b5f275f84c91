//! What a run hands back to be checked: its output tensors, converted to
//! f32, and facts only the device can tell (hca_persist's counters).

/// An output tensor as a kernel or the emulation produced it.
#[derive(Clone, Debug)]
pub struct OutTensor {
    /// Matches the reference tensor's name (`o.r0`, `lse.r0`, `o`, `lse`).
    pub name: String,
    /// Elements per row (rows index dimension 0: query rows).
    pub row_len: usize,
    pub data: Vec<f32>,
}

impl OutTensor {
    /// Rows `rows` of the tensor, in that order (`compact`: the tensor
    /// already holds only those rows, in order).
    pub fn pick(&self, rows: &[usize], compact: bool) -> Vec<f32> {
        let mut v = Vec::with_capacity(rows.len() * self.row_len);
        for (k, &r) in rows.iter().enumerate() {
            let i = if compact { k } else { r };
            v.extend_from_slice(&self.data[i * self.row_len..(i + 1) * self.row_len]);
        }
        v
    }
}

/// The tensor named `name`, or an error a row can carry.
pub fn find<'a>(out: &'a [OutTensor], name: &str) -> Result<&'a OutTensor, String> {
    out.iter()
        .find(|t| t.name == name)
        .ok_or_else(|| format!("the run returned no `{name}` tensor"))
}

/// A pass/fail fact about device state after a launch.
#[derive(Clone, Debug)]
pub struct DeviceCheck {
    /// What was checked, e.g. `counters` or `counters.step2`.
    pub name: String,
    pub pass: bool,
    /// Why it failed (empty on pass).
    pub why: String,
}

impl DeviceCheck {
    /// hca_persist's row counters after a launch: `left` of them not back at zero.
    pub fn counters(name: String, left: usize) -> DeviceCheck {
        DeviceCheck {
            name,
            pass: left == 0,
            why: if left == 0 {
                String::new()
            } else {
                format!("{left} row counters non-zero after the launch; the last finisher must reset them (cleared for the next launch)")
            },
        }
    }
}
