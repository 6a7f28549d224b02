//! Which files of a repository a reference means, decided from the file
//! names alone (the Hub's list, or a snapshot's): for a GGUF repository the
//! model file(s) of one quant, every part of a split GGUF
//! (`-00001-of-0000N.gguf`), a vision projector (`mmproj*.gguf`) and chat
//! template files beside it; for a FastFlowLM pack (`model.q4nx` with a
//! `config.json` in one directory) the whole directory. A quant that is not
//! there is refused with the quants that are.

use std::collections::BTreeMap;

/// The quant a reference without one means: llama.cpp's `-hf` default.
pub const DEFAULT_QUANT: &str = "Q4_K_M";
/// The file that makes a directory a FastFlowLM pack, with its config.
pub const PACK_WEIGHTS: &str = "model.q4nx";
pub const PACK_CONFIG: &str = "config.json";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// GGUF model file(s) of one quant; more than one when split, in part
    /// order (the first is the one a loader opens).
    Gguf { quant: String },
    /// A pack directory (`""` for the repository's top).
    Pack { dir: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub kind: Kind,
    /// The model's own files: GGUF parts in order, or every file of the pack.
    pub model: Vec<String>,
    /// Files that come along: a projector, chat templates.
    pub companions: Vec<String>,
}

impl Selection {
    /// Every file to fetch.
    pub fn files(&self) -> impl Iterator<Item = &String> {
        self.model.iter().chain(&self.companions)
    }
}

/// The quant a GGUF file name states: the last `-`/`.`/`/`-separated token
/// of its path (split suffix and extension removed) that reads as a llama.cpp
/// quant name (`Q4_K_M`, `IQ2_XXS`, `TQ1_0`, `F16`, `BF16`, `MXFP4`...),
/// upper-cased.
pub fn quant_of(path: &str) -> Option<String> {
    let stem = strip_gguf(path)?;
    let stem = split_part(path).map_or(stem, |(base, _, _)| base);
    stem.rsplit(['-', '.', '/'])
        .map(|t| t.to_ascii_uppercase())
        .find(|t| is_quant(t))
}

fn is_quant(t: &str) -> bool {
    if matches!(t, "F32" | "F16" | "BF16" | "FP16" | "MXFP4") || t.starts_with("MXFP4_") {
        return true;
    }
    let rest = t
        .strip_prefix("IQ")
        .or_else(|| t.strip_prefix("TQ"))
        .or_else(|| t.strip_prefix('Q'));
    let Some(rest) = rest else { return false };
    let mut it = rest.split('_');
    let first = it.next().unwrap_or("");
    !first.is_empty()
        && first.chars().all(|c| c.is_ascii_digit())
        && it.all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric()))
}

fn strip_gguf(path: &str) -> Option<&str> {
    let n = path.len();
    (n > 5 && path[n - 5..].eq_ignore_ascii_case(".gguf")).then(|| &path[..n - 5])
}

/// `(base, k, n)` of a split GGUF part `BASE-0000k-of-0000n.gguf`.
pub fn split_part(path: &str) -> Option<(&str, u32, u32)> {
    let stem = strip_gguf(path)?;
    let (base, tail) = stem.rsplit_once("-of-")?;
    let (base, k) = base.rsplit_once('-')?;
    let ok = |s: &str| s.len() == 5 && s.chars().all(|c| c.is_ascii_digit());
    if !ok(k) || !ok(tail) {
        return None;
    }
    let (k, n): (u32, u32) = (k.parse().ok()?, tail.parse().ok()?);
    (k >= 1 && k <= n).then_some((base, k, n))
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn is_projector(path: &str) -> bool {
    base_name(path).to_ascii_lowercase().starts_with("mmproj")
}

fn is_template(path: &str) -> bool {
    let b = base_name(path);
    !path.contains('/') && (b.ends_with(".jinja") || b == "chat_template.json")
}

/// One GGUF model of a repository: its quant and files in part order.
#[derive(Clone, Debug)]
pub struct GgufModel {
    pub quant: Option<String>,
    pub files: Vec<String>,
    /// Parts a split model names but the list lacks (`-00002-of-00003`).
    pub missing: Vec<String>,
}

/// Every GGUF model among `names` (projectors excepted), split parts grouped.
pub fn gguf_models(names: &[&str]) -> Vec<GgufModel> {
    let mut groups: BTreeMap<String, (u32, Vec<(u32, String)>)> = BTreeMap::new();
    for &n in names {
        if strip_gguf(n).is_none() || is_projector(n) {
            continue;
        }
        match split_part(n) {
            Some((base, k, total)) => {
                let g = groups.entry(format!("{base}\0split")).or_default();
                g.0 = g.0.max(total);
                g.1.push((k, n.to_string()));
            }
            None => groups
                .entry(n.to_string())
                .or_default()
                .1
                .push((1, n.to_string())),
        }
    }
    groups
        .into_iter()
        .map(|(key, (total, mut parts))| {
            parts.sort();
            let mut missing = Vec::new();
            if let Some(base) = key.strip_suffix("\0split") {
                for k in 1..=total {
                    if !parts.iter().any(|(p, _)| *p == k) {
                        missing.push(format!("{base}-{k:05}-of-{total:05}.gguf"));
                    }
                }
            }
            let files: Vec<String> = parts.into_iter().map(|(_, n)| n).collect();
            GgufModel {
                quant: quant_of(&files[0]),
                files,
                missing,
            }
        })
        .collect()
}

/// Why a reference selects nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectError {
    /// The quant is not among the repository's; `available` lists them.
    NoSuchQuant {
        repo: String,
        quant: String,
        available: Vec<String>,
    },
    /// No quant was asked, the default is not there, and there are several.
    NeedQuant {
        repo: String,
        available: Vec<String>,
    },
    /// Neither a GGUF file nor a pack.
    NoModel { repo: String },
    /// A split model lacks parts.
    MissingParts { repo: String, missing: Vec<String> },
    /// A quant was asked of a pack repository.
    PackHasNoQuant { repo: String, quant: String },
}

impl std::fmt::Display for SelectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectError::NoSuchQuant { repo, quant, available } => write!(
                f,
                "{repo} has no GGUF file of quant {}; its quants: {}",
                quant.to_ascii_uppercase(),
                available.join(", ")
            ),
            SelectError::NeedQuant { repo, available } => write!(
                f,
                "{repo} has no {DEFAULT_QUANT} GGUF file (the default); name one of its quants as {repo}:QUANT: {}",
                available.join(", ")
            ),
            SelectError::NoModel { repo } => write!(
                f,
                "{repo} holds neither a .gguf file nor a FastFlowLM pack ({PACK_WEIGHTS} with {PACK_CONFIG})"
            ),
            SelectError::MissingParts { repo, missing } => write!(
                f,
                "{repo}: the split GGUF lacks parts {}",
                missing.join(", ")
            ),
            SelectError::PackHasNoQuant { repo, quant } => write!(
                f,
                "{repo} is a FastFlowLM pack, which has no quants to pick (asked {quant})"
            ),
        }
    }
}

impl std::error::Error for SelectError {}

/// The files `quant` (or the default) names among a repository's `names`.
pub fn select(repo: &str, names: &[&str], quant: Option<&str>) -> Result<Selection, SelectError> {
    let models = gguf_models(names);
    if models.is_empty() {
        return select_pack(repo, names, quant);
    }
    let mut available: Vec<String> = models.iter().filter_map(|m| m.quant.clone()).collect();
    available.sort();
    available.dedup();
    let want = quant.map(|q| q.to_ascii_uppercase());
    let chosen = match &want {
        Some(q) => models.iter().find(|m| m.quant.as_deref() == Some(q)),
        None => models
            .iter()
            .find(|m| m.quant.as_deref() == Some(DEFAULT_QUANT))
            .or_else(|| (models.len() == 1).then(|| &models[0])),
    };
    let Some(m) = chosen else {
        return Err(match want {
            Some(q) => SelectError::NoSuchQuant {
                repo: repo.into(),
                quant: q,
                available,
            },
            None => SelectError::NeedQuant {
                repo: repo.into(),
                available,
            },
        });
    };
    if !m.missing.is_empty() {
        return Err(SelectError::MissingParts {
            repo: repo.into(),
            missing: m.missing.clone(),
        });
    }
    let mut companions: Vec<String> = names
        .iter()
        .filter(|n| is_template(n))
        .map(|n| n.to_string())
        .collect();
    if let Some(p) = projector(names, m.quant.as_deref()) {
        companions.insert(0, p);
    }
    Ok(Selection {
        kind: Kind::Gguf {
            quant: m.quant.clone().unwrap_or_default(),
        },
        model: m.files.clone(),
        companions,
    })
}

/// The projector to fetch with a model of `quant`: one of that quant, else
/// F16, else BF16, else F32, else the first by name.
fn projector(names: &[&str], quant: Option<&str>) -> Option<String> {
    let mut p: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| is_projector(n) && strip_gguf(n).is_some())
        .collect();
    p.sort();
    let of = |q: &str| p.iter().find(|n| quant_of(n).as_deref() == Some(q));
    quant
        .and_then(of)
        .or_else(|| of("F16"))
        .or_else(|| of("BF16"))
        .or_else(|| of("F32"))
        .or(p.first())
        .map(|s| s.to_string())
}

fn select_pack(repo: &str, names: &[&str], quant: Option<&str>) -> Result<Selection, SelectError> {
    let mut dirs: Vec<&str> = names
        .iter()
        .filter(|n| base_name(n) == PACK_WEIGHTS)
        .map(|n| n.rsplit_once('/').map_or("", |(d, _)| d))
        .filter(|d| {
            let cfg = if d.is_empty() {
                PACK_CONFIG.to_string()
            } else {
                format!("{d}/{PACK_CONFIG}")
            };
            names.contains(&cfg.as_str())
        })
        .collect();
    dirs.sort();
    let Some(dir) = dirs.first().copied() else {
        return Err(SelectError::NoModel { repo: repo.into() });
    };
    if let Some(q) = quant {
        return Err(SelectError::PackHasNoQuant {
            repo: repo.into(),
            quant: q.into(),
        });
    }
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut model: Vec<String> = names
        .iter()
        .filter(|n| {
            n.strip_prefix(prefix.as_str())
                .is_some_and(|rest| !rest.contains('/') && !rest.starts_with('.'))
        })
        .map(|n| n.to_string())
        .collect();
    model.sort();
    Ok(Selection {
        kind: Kind::Pack { dir: dir.into() },
        model,
        companions: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPO: [&str; 9] = [
        ".gitattributes",
        "README.md",
        "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-0.5b-instruct-q8_0.gguf",
        "qwen2.5-0.5b-instruct-fp16-00001-of-00002.gguf",
        "qwen2.5-0.5b-instruct-fp16-00002-of-00002.gguf",
        "mmproj-model-f16.gguf",
        "mmproj-model-f32.gguf",
        "template.jinja",
    ];

    #[test]
    fn quant_names_are_read_from_the_file_name() {
        assert_eq!(
            quant_of("SmolLM2-135M-Instruct.Q4_1.gguf").as_deref(),
            Some("Q4_1")
        );
        assert_eq!(
            quant_of("gemma-3-270m-q4_k_m.gguf").as_deref(),
            Some("Q4_K_M")
        );
        assert_eq!(
            quant_of("Q8_0/m-00001-of-00003.gguf").as_deref(),
            Some("Q8_0")
        );
        assert_eq!(quant_of("x-UD-IQ2_XXS.gguf").as_deref(), Some("IQ2_XXS"));
        assert_eq!(quant_of("x-BF16.gguf").as_deref(), Some("BF16"));
        assert_eq!(quant_of("qwen2.5-0.5b.gguf"), None);
        assert_eq!(quant_of("model.Q4_K_M.bin"), None);
    }

    #[test]
    fn quant_is_picked_case_blind_with_the_default_and_companions() {
        let s = select("o/r", &REPO, Some("Q8_0")).unwrap();
        assert_eq!(s.model, ["qwen2.5-0.5b-instruct-q8_0.gguf"]);
        assert_eq!(s.companions, ["mmproj-model-f16.gguf", "template.jinja"]);
        let d = select("o/r", &REPO, None).unwrap();
        assert_eq!(d.model, ["qwen2.5-0.5b-instruct-q4_k_m.gguf"]);
        assert_eq!(d, select("o/r", &REPO, Some("q4_k_m")).unwrap());
    }

    #[test]
    fn split_models_take_every_part_in_order_and_refuse_a_gap() {
        let s = select("o/r", &REPO, Some("fp16")).unwrap();
        assert_eq!(
            s.model,
            [
                "qwen2.5-0.5b-instruct-fp16-00001-of-00002.gguf",
                "qwen2.5-0.5b-instruct-fp16-00002-of-00002.gguf"
            ]
        );
        let gap = [
            "m-Q4_K_M-00001-of-00003.gguf",
            "m-Q4_K_M-00003-of-00003.gguf",
        ];
        assert_eq!(
            select("o/r", &gap, None).unwrap_err(),
            SelectError::MissingParts {
                repo: "o/r".into(),
                missing: vec!["m-Q4_K_M-00002-of-00003.gguf".into()]
            }
        );
    }

    #[test]
    fn a_wrong_quant_lists_the_quants_there() {
        let e = select("o/r", &REPO, Some("Q2_K")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "o/r has no GGUF file of quant Q2_K; its quants: FP16, Q4_K_M, Q8_0"
        );
        let only = ["a-Q8_0.gguf", "a-Q6_K.gguf"];
        assert!(select("o/r", &only, None)
            .unwrap_err()
            .to_string()
            .contains("Q6_K, Q8_0"));
        assert_eq!(
            select("o/r", &["a-Q8_0.gguf"], None).unwrap().model,
            ["a-Q8_0.gguf"]
        );
    }

    #[test]
    fn a_pack_is_its_whole_directory() {
        let names = [
            ".gitattributes",
            "model.q4nx",
            "config.json",
            "tokenizer.json",
            "sub/other.txt",
        ];
        let s = select("o/p", &names, None).unwrap();
        assert_eq!(s.kind, Kind::Pack { dir: String::new() });
        assert_eq!(s.model, ["config.json", "model.q4nx", "tokenizer.json"]);
        assert!(matches!(
            select("o/p", &names, Some("Q4_0")),
            Err(SelectError::PackHasNoQuant { .. })
        ));
        assert!(matches!(
            select("o/p", &["model.q4nx", "README.md"], None),
            Err(SelectError::NoModel { .. })
        ));
    }
}
