//! The crate's layout, checked from its sources: every `crate::` path in a
//! module points down the order routes -> protocols (openai, ollama, embed,
//! pull, responses, anthropic, tokenize) -> run -> app -> leaves, and the
//! leaves import one another without a cycle. A module not named in
//! [`ORDER`] is a leaf.

use std::collections::BTreeMap;
use std::path::Path;

/// (module, layer): a module may name only modules of a greater layer.
/// The crate root declares every module, so it sits above all.
const ORDER: [(&str, u8); 11] = [
    ("lib", 0),
    ("routes", 1),
    ("openai", 2),
    ("ollama", 2),
    ("embed", 2),
    ("pull", 2),
    ("responses", 2),
    ("anthropic", 2),
    ("tokenize", 2),
    ("run", 3),
    ("app", 4),
];
const LEAF: u8 = 5;

fn layer(module: &str) -> u8 {
    ORDER
        .iter()
        .find(|(m, _)| *m == module)
        .map_or(LEAF, |&(_, l)| l)
}

/// The modules `src` names through `crate::` outside comments, including
/// each of a `use crate::{a, b::c}` group.
fn crate_refs(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                out.extend(
                    group[..end]
                        .split(',')
                        .map(|p| p.trim().split("::").next().unwrap_or("").to_string())
                        .filter(|m| !m.is_empty()),
                );
            } else {
                let id: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(id);
            }
        }
    }
    out.retain(|m| m.chars().next().is_some_and(char::is_lowercase));
    out
}

/// What is wrong with the layout of `modules` (name -> source): each
/// upward or sideways reference among the ordered modules, and any cycle.
fn problems(modules: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    let mut edges: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, src) in modules {
        let mut refs = crate_refs(src);
        refs.sort();
        refs.dedup();
        refs.retain(|r| r != name && modules.contains_key(r));
        for r in &refs {
            let (from, to) = (layer(name), layer(r));
            if to <= from && !(from == LEAF && to == LEAF) {
                found.push(format!(
                    "{name} (layer {from}) names crate::{r} (layer {to}), which is not below it"
                ));
            }
        }
        edges.insert(name, refs);
    }
    // A cycle: depth-first search, a module met again on the path.
    fn visit<'a>(
        m: &'a str,
        edges: &'a BTreeMap<&str, Vec<String>>,
        path: &mut Vec<&'a str>,
        done: &mut Vec<&'a str>,
        found: &mut Vec<String>,
    ) {
        if done.contains(&m) {
            return;
        }
        if let Some(i) = path.iter().position(|p| *p == m) {
            found.push(format!("cycle: {} -> {m}", path[i..].join(" -> ")));
            return;
        }
        path.push(m);
        for next in edges.get(m).into_iter().flatten() {
            visit(next, edges, path, done, found);
        }
        path.pop();
        done.push(m);
    }
    let mut done = Vec::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

fn sources() -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        // This file is the check, not part of the layout (its test sources
        // name every module).
        if p.extension().is_some_and(|x| x == "rs") && name != "module_order" {
            out.insert(name, std::fs::read_to_string(&p).unwrap());
        }
    }
    out
}

#[test]
fn every_crate_path_points_down_the_module_order() {
    let modules = sources();
    for (m, _) in ORDER {
        assert!(modules.contains_key(m), "no src/{m}.rs");
    }
    let found = problems(&modules);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_check_catches_upward_sideways_and_cyclic_references() {
    let set = |files: &[(&str, &str)]| -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect()
    };
    // Down the order, a comment naming anything, and a leaf using a leaf: fine.
    let good = set(&[
        ("routes", "use crate::{openai, ollama::chat};"),
        ("openai", "use crate::run::drive; // crate::routes"),
        ("ollama", "let x = crate::app::App::new();"),
        ("run", "use crate::app::App;"),
        ("app", "use crate::api::ApiError;"),
        ("api", "use crate::tools::Spec;"),
        ("tools", ""),
    ]);
    assert!(problems(&good).is_empty(), "{:?}", problems(&good));
    // app -> run points up; openai -> ollama sideways; a grouped import of
    // routes from run; a cycle among leaves.
    for (from, src) in [
        ("app", "use crate::run::Run;"),
        ("openai", "use crate::ollama::chat;"),
        ("run", "use crate::{app::App, routes::router};"),
        ("tools", "fn f() { crate::api::parse(); }"),
        ("api", "use crate::routes;"),
    ] {
        let mut files = good.clone();
        files.insert(from.into(), src.into());
        assert!(!problems(&files).is_empty(), "{from}: {src} passed");
    }
}
