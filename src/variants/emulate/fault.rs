//! Bugs planted in the CPU emulation for `mlabench selftest --backend cpu`:
//! the plans executed wrong in the ways kernels go wrong, so that a machine
//! without a GPU can show the harness's checks catching each one. A real
//! run never sets one (the flag that does is hidden).

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every merge adds parts of weight 0 too, so an empty part's NaN o
    /// poisons the sum (the LSE-merge rule SPEC section 1 requires, dropped).
    MergeKeepsEmpty,
    /// Launches after the first flip the last bit of one output element, as
    /// a missed barrier does: within every tolerance, different every time.
    Race,
    /// page64's split s also reads the first token of split s + 1.
    Page64SplitOverlap,
    /// A ps1 work item that is not its sequence's last reads one token more.
    Ps1ItemOverlap,
    /// MLA logits 1% too large.
    LogitScale,
    /// hca_persist's last finisher merges but does not reset its counter.
    HcaNoReset,
    /// ps1 masks on local positions (page64's rule) instead of global ones.
    Ps1LocalMask,
    /// v4_split's split ends round down while starts round up: tokens drop.
    V4SplitFloor,
    /// The V4 merge adds the attention sink twice.
    SinkTwice,
}

const NAMES: &[(Fault, &str)] = &[
    (Fault::MergeKeepsEmpty, "merge-keeps-empty"),
    (Fault::Race, "race"),
    (Fault::Page64SplitOverlap, "page64-split-overlap"),
    (Fault::Ps1ItemOverlap, "ps1-item-overlap"),
    (Fault::LogitScale, "logit-scale"),
    (Fault::HcaNoReset, "hca-no-reset"),
    (Fault::Ps1LocalMask, "ps1-local-mask"),
    (Fault::V4SplitFloor, "v4-split-floor"),
    (Fault::SinkTwice, "sink-twice"),
];

impl Fault {
    pub fn name(self) -> &'static str {
        NAMES.iter().find(|(f, _)| *f == self).map(|(_, n)| *n).unwrap_or("?")
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        NAMES.iter().find(|(_, n)| *n == s).map(|(f, _)| *f).ok_or_else(|| {
            let all: Vec<&str> = NAMES.iter().map(|(_, n)| *n).collect();
            format!("unknown CPU fault `{s}`; known: {}", all.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (f, n) in NAMES {
            assert_eq!(n.parse::<Fault>().unwrap(), *f);
            assert_eq!(f.to_string(), *n);
        }
        assert!("nope".parse::<Fault>().unwrap_err().contains("race"));
    }
}
