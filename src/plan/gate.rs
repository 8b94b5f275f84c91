//! Target profiles and the dispatch gate (SPEC §1).

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// The hardware a plan is made for. Plans use its CU count; kernels run on
/// whatever device the backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetProfile {
    Gfx950,
    Gfx1250,
    Sm90,
}

impl TargetProfile {
    pub fn compute_units(self) -> usize {
        match self {
            TargetProfile::Gfx950 => 256,
            TargetProfile::Gfx1250 => 256,
            TargetProfile::Sm90 => 132,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TargetProfile::Gfx950 => "gfx950",
            TargetProfile::Gfx1250 => "gfx1250",
            TargetProfile::Sm90 => "sm90",
        }
    }
}

impl fmt::Display for TargetProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TargetProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gfx950" => Ok(TargetProfile::Gfx950),
            "gfx1250" => Ok(TargetProfile::Gfx1250),
            "sm90" => Ok(TargetProfile::Sm90),
            _ => Err(format!("unknown target profile `{s}`; known: gfx950, gfx1250, sm90")),
        }
    }
}
