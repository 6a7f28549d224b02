//! The Hub's HTTP protocol, as much of it as a pull needs:
//!
//! - `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true`: the
//!   commit (`sha`) and the files (`siblings`: `rfilename`, `size`,
//!   `blobId`, `lfs.sha256`);
//! - `HEAD {endpoint}/{repo}/resolve/{commit}/{file}`, redirects not
//!   followed: `x-repo-commit`, the hash (`x-linked-etag` for an LFS file,
//!   else `etag`), the size (`x-linked-size`, else `content-length`) and,
//!   for an LFS file, the `location` that serves its bytes;
//! - `GET` of that location with `Range: bytes=N-` to resume.
//!
//! `HF_ENDPOINT` replaces the Hub (mirrors; the tests' local Hub) and
//! `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`) is sent as a bearer token to the
//! endpoint only, never to the host a redirect leads to. A 401 or 403 says
//! to set HF_TOKEN; every error names the repository or file and the URL.

use std::time::Duration;

use crate::verify::normalize_etag;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

pub struct Hub {
    pub endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// A file of a repository as the model-info API lists it.
#[derive(Clone, Debug, Default)]
pub struct Sibling {
    pub name: String,
    pub size: Option<u64>,
    /// The git blob id (SHA-1).
    pub blob_id: Option<String>,
    /// For an LFS file, the sha256 of its bytes.
    pub sha256: Option<String>,
}

#[derive(Clone, Debug)]
pub struct RepoInfo {
    pub commit: String,
    pub siblings: Vec<Sibling>,
}

/// What the resolve endpoint's headers say of one file.
#[derive(Clone, Debug)]
pub struct FileMeta {
    pub commit: Option<String>,
    /// Bare lower-case hash: sha256 (LFS) or git blob SHA-1.
    pub hash: String,
    pub size: u64,
    /// Where the bytes are fetched from.
    pub location: String,
}

pub type Body = ureq::BodyReader<'static>;

/// A response body to read from `start`.
pub struct Opened {
    pub start: u64,
    pub body: Body,
}

impl Hub {
    /// The Hub `HF_ENDPOINT` and `HF_TOKEN` name.
    pub fn from_env() -> Hub {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let token = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN"));
        Hub::new(&endpoint, token)
    }

    pub fn new(endpoint: &str, token: Option<String>) -> Hub {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("onebit/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            agent,
        }
    }

    fn auth<B>(&self, url: &str, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) if url.starts_with(&self.endpoint) => {
                req.header("Authorization", format!("Bearer {t}"))
            }
            _ => req,
        }
    }

    fn refused(&self, what: &str, url: &str, status: u16) -> String {
        match status {
            401 | 403 => {
                let why = if self.token.is_some() {
                    "HF_TOKEN is set, but its account has no access: accept the model's terms on its page, or set HF_TOKEN to a token that may read it"
                } else {
                    "the repository is gated or private: set HF_TOKEN to an access token of an account that may read it"
                };
                format!("{what}: the Hub answered {status} for {url}; {why}")
            }
            404 => format!("{what}: not found on the Hub ({url} answered 404)"),
            s => format!("{what}: {url} answered HTTP {s}"),
        }
    }

    /// The repository's commit at `rev` and its files.
    pub fn info(&self, repo: &str, rev: &str) -> Result<RepoInfo, String> {
        let url = format!(
            "{}/api/models/{repo}/revision/{rev}?blobs=true",
            self.endpoint
        );
        let resp = self
            .auth(&url, self.agent.get(&url))
            .call()
            .map_err(|e| format!("{repo}: cannot reach the Hub at {url}: {e}"))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(self.refused(repo, &url, status));
        }
        let text = resp
            .into_body()
            .read_to_string()
            .map_err(|e| format!("{repo}: reading {url}: {e}"))?;
        parse_info(repo, &url, &text)
    }

    /// HEAD of `file` at `commit`: its hash, size and where its bytes are.
    pub fn meta(&self, repo: &str, commit: &str, file: &str) -> Result<FileMeta, String> {
        let what = format!("{repo}/{file}");
        let mut url = format!("{}/{repo}/resolve/{commit}/{file}", self.endpoint);
        for _ in 0..5 {
            let resp = self
                .auth(
                    &url,
                    self.agent.head(&url).header("Accept-Encoding", "identity"),
                )
                .call()
                .map_err(|e| format!("{what}: cannot reach {url}: {e}"))?;
            let status = resp.status().as_u16();
            let h = |k: &str| {
                resp.headers()
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let location = h("location");
            if (300..400).contains(&status) {
                let Some(loc) = location else {
                    return Err(format!(
                        "{what}: {url} answered {status} without a location"
                    ));
                };
                // A relative redirect (a renamed repository) is followed for
                // the headers; an absolute one leads to the bytes.
                if loc.starts_with('/') {
                    url = format!("{}{loc}", origin(&url));
                    continue;
                }
                return file_meta(&what, &url, &h, loc);
            }
            if status != 200 {
                return Err(self.refused(&what, &url, status));
            }
            return file_meta(&what, &url, &h, url.clone());
        }
        Err(format!("{what}: more than 5 redirects from the Hub"))
    }

    /// GET of `location` from byte `from` (a Range request when `from > 0`),
    /// following redirects. `start` is where the body begins: `from` when the
    /// server honoured the range, 0 when it sent the whole file.
    pub fn open(&self, what: &str, location: &str, from: u64) -> Result<Opened, String> {
        let mut url = location.to_string();
        for _ in 0..5 {
            let mut req = self
                .auth(&url, self.agent.get(&url))
                .header("Accept-Encoding", "identity");
            if from > 0 {
                req = req.header("Range", format!("bytes={from}-"));
            }
            let resp = req
                .call()
                .map_err(|e| format!("{what}: cannot reach {url}: {e}"))?;
            let status = resp.status().as_u16();
            let h = |k: &str| {
                resp.headers()
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            match status {
                200 => {
                    return Ok(Opened {
                        start: 0,
                        body: resp.into_body().into_reader(),
                    })
                }
                206 => {
                    let cr = h("content-range").unwrap_or_default();
                    let start = cr
                        .strip_prefix("bytes ")
                        .and_then(|r| r.split('-').next())
                        .and_then(|s| s.trim().parse::<u64>().ok());
                    if start != Some(from) {
                        return Err(format!(
                            "{what}: asked {url} for bytes from {from}, it sent content-range {cr:?}"
                        ));
                    }
                    return Ok(Opened {
                        start: from,
                        body: resp.into_body().into_reader(),
                    });
                }
                300..=399 => {
                    let Some(loc) = h("location") else {
                        return Err(format!(
                            "{what}: {url} answered {status} without a location"
                        ));
                    };
                    url = if loc.starts_with('/') {
                        format!("{}{loc}", origin(&url))
                    } else {
                        loc
                    };
                }
                s => return Err(self.refused(what, &url, s)),
            }
        }
        Err(format!("{what}: more than 5 redirects from {location}"))
    }
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find('/') {
        Some(i) => &url[..after + i],
        None => url,
    }
}

fn file_meta(
    what: &str,
    url: &str,
    h: &dyn Fn(&str) -> Option<String>,
    location: String,
) -> Result<FileMeta, String> {
    let etag = h("x-linked-etag").or_else(|| h("etag")).ok_or_else(|| {
        format!("{what}: {url} sent neither x-linked-etag nor etag, so the file cannot be checked")
    })?;
    let size = h("x-linked-size")
        .or_else(|| h("content-length"))
        .and_then(|s| s.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("{what}: {url} sent neither x-linked-size nor content-length"))?;
    Ok(FileMeta {
        commit: h("x-repo-commit"),
        hash: normalize_etag(&etag),
        size,
        location,
    })
}

fn parse_info(repo: &str, url: &str, text: &str) -> Result<RepoInfo, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{repo}: {url} is not JSON: {e}"))?;
    let commit = v["sha"]
        .as_str()
        .ok_or_else(|| format!("{repo}: {url} has no `sha` (the commit)"))?
        .to_string();
    let siblings = v["siblings"]
        .as_array()
        .ok_or_else(|| format!("{repo}: {url} has no `siblings` list"))?
        .iter()
        .map(|s| {
            Ok(Sibling {
                name: s["rfilename"]
                    .as_str()
                    .ok_or_else(|| format!("{repo}: {url}: a sibling has no `rfilename`"))?
                    .to_string(),
                size: s["size"].as_u64(),
                blob_id: s["blobId"].as_str().map(str::to_ascii_lowercase),
                sha256: s["lfs"]["sha256"].as_str().map(str::to_ascii_lowercase),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    for s in &siblings {
        if s.name
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
            || s.name.starts_with('/')
        {
            return Err(format!(
                "{repo}: {url} lists a file named {:?}, which is not a relative path",
                s.name
            ));
        }
    }
    Ok(RepoInfo { commit, siblings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_refuses_escaping_names() {
        let j = r#"{"sha":"abc","siblings":[{"rfilename":"../x"}]}"#;
        let e = parse_info("o/r", "u", j).unwrap_err();
        assert!(e.contains("\"../x\""), "{e}");
        let ok =
            r#"{"sha":"abc","siblings":[{"rfilename":"a.gguf","size":3,"lfs":{"sha256":"AB"}}]}"#;
        let i = parse_info("o/r", "u", ok).unwrap();
        assert_eq!(i.commit, "abc");
        assert_eq!(i.siblings[0].sha256.as_deref(), Some("ab"));
        assert_eq!(origin("http://127.0.0.1:5/a/b"), "http://127.0.0.1:5");
    }
}
