//! An implementation's declaration: its name, the contract it implements,
//! what it can run, and the command that starts its worker. Read from a
//! file (`--impl FILE`, one `[impl]` table) or from a scenario's `[[impl]]`
//! tables; every error names the file, the key and the fix.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::case::Dtype;

/// The contracts an external implementation can take on (docs/protocol.md
/// gives each one's tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Contract {
    /// MLA decode of one DCP rank: paged pool, bf16 or fp8 with per-tensor scales.
    MlaDecode,
    /// DeepSeek-V4 decode over native FP8 rows with attention sink.
    V4Decode,
    /// The LSE merge of per-rank `(o, lse)`.
    DcpCombine,
    /// The LSE merge of split partials with the sink.
    SplitMerge,
}

impl Contract {
    pub fn name(self) -> &'static str {
        match self {
            Contract::MlaDecode => "mla_decode",
            Contract::V4Decode => "v4_decode",
            Contract::DcpCombine => "dcp_combine",
            Contract::SplitMerge => "split_merge",
        }
    }

    fn parse(s: &str) -> Option<Contract> {
        [
            Contract::MlaDecode,
            Contract::V4Decode,
            Contract::DcpCombine,
            Contract::SplitMerge,
        ]
        .into_iter()
        .find(|c| c.name() == s)
    }
}

/// Which positions an MLA decode kernel masks on when `s_q > 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mask {
    /// Bottom-right on the rank's local positions (what page64 and most
    /// public kernels do): wrong under DCP with `s_q > 1`.
    Local,
    /// Causal on global positions, from the DCP geometry (what ps1 does).
    Global,
}

/// What an implementation says it can run; the gate holds cases to it.
#[derive(Clone, Debug, Serialize)]
pub struct Caps {
    pub page_sizes: Vec<usize>,
    pub dtypes: Vec<Dtype>,
    /// Gathered query heads it takes (`None`: any).
    pub heads: Option<Vec<usize>>,
    pub max_s_q: usize,
    pub mask: Mask,
    /// V4: whether it applies the attention sink (the contract needs it).
    pub sink: bool,
    /// V4: whether it takes the contract's split plan (it may split on its own either way).
    pub splits: bool,
    /// DCP interleaves a global-mask kernel takes (`None`: any).
    pub interleave: Option<Vec<usize>>,
    /// Whether it returns the LSE; one that does not is checked on `o` alone.
    pub lse: bool,
}

/// One declared implementation.
#[derive(Clone, Debug, Serialize)]
pub struct ImplDecl {
    pub name: String,
    pub contract: Contract,
    pub caps: Caps,
    /// argv of the worker; the first element is the program.
    pub command: Vec<String>,
    /// Where the worker starts (the declaring file's directory's repository
    /// root is not guessed: relative paths are taken from the current directory).
    pub cwd: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    /// Seconds one request may take before the worker counts as hung.
    pub timeout_s: f64,
    /// Seconds the worker may take to start and answer the hello.
    pub start_timeout_s: f64,
    /// Whether two runs on the same inputs give the same bits.
    pub deterministic: bool,
    /// The file that declared it, for messages.
    pub source: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(rename = "impl")]
    imp: RawImpl,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImpl {
    name: Option<String>,
    contract: Option<String>,
    command: Option<Vec<String>>,
    cwd: Option<PathBuf>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    timeout_s: Option<f64>,
    start_timeout_s: Option<f64>,
    deterministic: Option<bool>,
    caps: Option<RawCaps>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCaps {
    page_sizes: Option<Vec<usize>>,
    dtypes: Option<Vec<String>>,
    heads: Option<Vec<usize>>,
    max_s_q: Option<usize>,
    mask: Option<String>,
    sink: Option<bool>,
    splits: Option<bool>,
    interleave: Option<Vec<usize>>,
    lse: Option<bool>,
}

/// Reads a `--impl FILE` declaration.
pub fn load(path: &Path) -> Result<ImplDecl, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the file: {e}"))?;
    let raw: RawFile = toml::from_str(&text).map_err(|e| {
        format!(
            "{}; an implementation file holds one [impl] table (docs/protocol.md)",
            e.to_string().trim_end()
        )
    })?;
    validate(raw.imp, &path.display().to_string())
}

/// Checks a declaration; `source` names where it came from.
pub fn validate(raw: RawImpl, source: &str) -> Result<ImplDecl, String> {
    let name = raw
        .name
        .ok_or("key `impl.name`: missing; give the implementation a name, e.g. name = \"mykernel\"")?;
    let ok_name =
        !name.is_empty() && name.len() <= 40 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok_name {
        return Err(format!(
            "key `impl.name`: `{name}` must be 1-40 letters, digits, `_` or `-` (it names report rows)"
        ));
    }
    let contract = raw
        .contract
        .ok_or("key `impl.contract`: missing; one of mla_decode, v4_decode, dcp_combine, split_merge")?;
    let contract = Contract::parse(&contract).ok_or_else(|| {
        format!(
            "key `impl.contract`: unknown contract `{contract}`; use mla_decode, v4_decode, dcp_combine or split_merge"
        )
    })?;
    let command = raw
        .command
        .filter(|c| !c.is_empty() && !c[0].is_empty())
        .ok_or("key `impl.command`: missing or empty; give the worker's argv, e.g. [\"python3\", \"worker.py\"]")?;
    let positive = |v: Option<f64>, key: &str, default: f64| -> Result<f64, String> {
        match v {
            None => Ok(default),
            Some(t) if t.is_finite() && t > 0.0 => Ok(t),
            Some(t) => Err(format!("key `impl.{key}`: {t} is not a positive number of seconds")),
        }
    };
    let timeout_s = positive(raw.timeout_s, "timeout_s", 120.0)?;
    let start_timeout_s = positive(raw.start_timeout_s, "start_timeout_s", 120.0)?;
    let rc = raw.caps.unwrap_or(RawCaps {
        page_sizes: None,
        dtypes: None,
        heads: None,
        max_s_q: None,
        mask: None,
        sink: None,
        splits: None,
        interleave: None,
        lse: None,
    });
    let dtypes = match rc.dtypes {
        None => vec![Dtype::Bf16],
        Some(v) if v.is_empty() => return Err("key `impl.caps.dtypes`: empty; list bf16 and/or fp8".into()),
        Some(v) => v
            .iter()
            .map(|s| match s.as_str() {
                "bf16" => Ok(Dtype::Bf16),
                "fp8" => Ok(Dtype::Fp8),
                _ => Err(format!(
                    "key `impl.caps.dtypes`: unknown dtype `{s}`; use bf16 (bf16 Q and KV) or fp8 (e4m3 Q and KV, per-tensor scales)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let page_sizes = rc.page_sizes.unwrap_or_else(|| vec![1, 64]);
    if page_sizes.is_empty() || page_sizes.iter().any(|p| !matches!(p, 1 | 64)) {
        return Err(format!(
            "key `impl.caps.page_sizes`: {page_sizes:?}; the MLA contract has page sizes 1 and 64"
        ));
    }
    if let Some(h) = &rc.heads {
        if h.is_empty() || h.iter().any(|&x| x == 0 || x > 128) {
            return Err(format!(
                "key `impl.caps.heads`: {h:?}; list head counts from 1 to 128, or leave the key out for any"
            ));
        }
    }
    let max_s_q = rc.max_s_q.unwrap_or(1);
    if max_s_q == 0 {
        return Err("key `impl.caps.max_s_q`: must be at least 1".into());
    }
    let mask = match rc.mask.as_deref() {
        None | Some("local") => Mask::Local,
        Some("global") => Mask::Global,
        Some(m) => {
            return Err(format!(
                "key `impl.caps.mask`: `{m}`; use local (bottom-right on the rank's positions) or global (DCP global positions)"
            ))
        }
    };
    if rc.lse == Some(false) && contract != Contract::V4Decode {
        return Err(format!(
            "key `impl.caps.lse`: false is only taken for v4_decode; {} is checked through its LSE",
            contract.name()
        ));
    }
    let mut env = Vec::new();
    for (k, v) in raw.env {
        env.push((k, v));
    }
    Ok(ImplDecl {
        name,
        contract,
        caps: Caps {
            page_sizes,
            dtypes,
            heads: rc.heads,
            max_s_q,
            mask,
            sink: rc.sink.unwrap_or(true),
            splits: rc.splits.unwrap_or(false),
            interleave: rc.interleave,
            lse: rc.lse.unwrap_or(true),
        },
        command,
        cwd: raw.cwd,
        env,
        timeout_s,
        start_timeout_s,
        deterministic: raw.deterministic.unwrap_or(true),
        source: source.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ImplDecl, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| e.to_string())?;
        validate(raw.imp, "t.toml")
    }

    #[test]
    fn a_full_declaration_reads_back() {
        let d = parse(
            "[impl]\nname = \"fm\"\ncontract = \"mla_decode\"\ncommand = [\"python3\", \"w.py\"]\ntimeout_s = 5\n\
             [impl.caps]\npage_sizes = [64]\ndtypes = [\"bf16\"]\nheads = [16, 128]\nmax_s_q = 8\nmask = \"local\"\n",
        )
        .unwrap();
        assert_eq!(d.name, "fm");
        assert_eq!(d.contract, Contract::MlaDecode);
        assert_eq!(d.caps.page_sizes, [64]);
        assert_eq!(d.caps.heads, Some(vec![16, 128]));
        assert_eq!((d.caps.max_s_q, d.caps.mask, d.timeout_s), (8, Mask::Local, 5.0));
    }

    #[test]
    fn errors_name_the_key_and_the_fix() {
        let cases = [
            ("[impl]\ncontract = \"mla_decode\"\ncommand = [\"x\"]\n", "impl.name"),
            ("[impl]\nname = \"a b\"\ncontract = \"mla_decode\"\ncommand = [\"x\"]\n", "impl.name"),
            ("[impl]\nname = \"a\"\ncontract = \"mla\"\ncommand = [\"x\"]\n", "unknown contract `mla`"),
            ("[impl]\nname = \"a\"\ncontract = \"mla_decode\"\ncommand = []\n", "impl.command"),
            (
                "[impl]\nname = \"a\"\ncontract = \"mla_decode\"\ncommand = [\"x\"]\n[impl.caps]\npage_sizes = [16]\n",
                "page sizes 1 and 64",
            ),
            (
                "[impl]\nname = \"a\"\ncontract = \"mla_decode\"\ncommand = [\"x\"]\n[impl.caps]\nmask = \"causal\"\n",
                "impl.caps.mask",
            ),
            (
                "[impl]\nname = \"a\"\ncontract = \"mla_decode\"\ncommand = [\"x\"]\ntimeout_s = -1\n",
                "impl.timeout_s",
            ),
            (
                "[impl]\nname = \"a\"\ncontract = \"mla_decode\"\ncommand = [\"x\"]\n[impl.caps]\ndtypes = [\"fp16\"]\n",
                "impl.caps.dtypes",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        assert!(parse("[impl]\nname = \"a\"\nbogus = 1\n")
            .unwrap_err()
            .contains("bogus"));
    }
}
