//! A model reference as a user types it: `ORG/REPO`, `ORG/REPO:QUANT`, with
//! an optional `hf.co/` or `huggingface.co/` in front. Parsing either gives
//! a repository id the Hub accepts (two names of letters, digits, `-`, `_`
//! and `.`, neither starting with `.` or `-`, no `..`) or an error that
//! says what was expected; the quant is kept as typed and compared without
//! regard to case.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ref {
    /// `ORG/REPO`.
    pub repo: String,
    /// The quant asked for (`Q4_K_M`, `q8_0`), if any.
    pub quant: Option<String>,
}

/// Prefixes that name the Hub itself; stripped.
const HUB_PREFIXES: [&str; 4] = [
    "https://huggingface.co/",
    "huggingface.co/",
    "https://hf.co/",
    "hf.co/",
];

impl Ref {
    /// Parses a reference; the error names the text and the form expected.
    pub fn parse(text: &str) -> Result<Ref, String> {
        let expected = "expected ORG/REPO[:QUANT] or hf.co/ORG/REPO[:QUANT]";
        let mut s = text.trim();
        for p in HUB_PREFIXES {
            if let Some(rest) = s.strip_prefix(p) {
                s = rest;
                break;
            }
        }
        let (repo, quant) = match s.rsplit_once(':') {
            Some((r, q)) => {
                if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!(
                        "model reference {text:?}: the quant {q:?} is not a quant name (letters, digits, _); {expected}"
                    ));
                }
                (r, Some(q.to_string()))
            }
            None => (s, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 || !parts.iter().all(|p| valid_name(p)) {
            return Err(format!("model reference {text:?}: {expected}"));
        }
        Ok(Ref {
            repo: repo.to_string(),
            quant,
        })
    }

    /// True when `text` reads as a reference rather than a file path: it
    /// parses, and does not end in `.gguf` (a missing file is reported as
    /// a missing file).
    pub fn looks_like(text: &str) -> bool {
        !text.to_ascii_lowercase().ends_with(".gguf") && Ref::parse(text).is_ok()
    }

    /// The store's directory name for the repository: `models--ORG--REPO`.
    pub fn cache_dir_name(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

fn valid_name(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 96
        && !p.starts_with(['.', '-'])
        && !p.contains("..")
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{}", self.repo, q.to_ascii_uppercase()),
            None => f.write_str(&self.repo),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_parse_to_repo_and_quant() {
        let r = Ref::parse("hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m").unwrap();
        assert_eq!(r.repo, "Qwen/Qwen2.5-0.5B-Instruct-GGUF");
        assert_eq!(r.quant.as_deref(), Some("q4_k_m"));
        assert_eq!(r.to_string(), "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M");
        let r = Ref::parse("FastFlowLM/Gemma3-1B-NPU2").unwrap();
        assert_eq!(r.quant, None);
        assert_eq!(r.cache_dir_name(), "models--FastFlowLM--Gemma3-1B-NPU2");
        assert_eq!(
            Ref::parse("huggingface.co/a/b:Q8_0").unwrap(),
            Ref::parse("a/b:Q8_0").unwrap()
        );
    }

    #[test]
    fn paths_and_bad_forms_are_refused_by_name() {
        for bad in [
            "/abs/model.gguf",
            "./rel/x",
            "a/b/c",
            "a",
            "../b",
            "a/..",
            "a/b:",
            "a/b:Q4 K",
            "-a/b",
        ] {
            let e = Ref::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(!Ref::looks_like("models/smol.gguf"));
        assert!(Ref::looks_like("org/repo-GGUF"));
    }
}
