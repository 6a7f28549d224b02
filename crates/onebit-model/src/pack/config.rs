//! Reading a pack's JSON files: which family the config names, the text
//! model's declarations (multimodal configs nest them under `text_config`),
//! and the BOS/EOS facts spread over config.json, tokenizer_config.json and
//! generation_config.json.

use serde_json::{Map, Value as Json};

use crate::families::{self, Family};
use crate::semantics::Sourced;

/// The family a config names by `model_type` or an `architectures` entry
/// (the outer config first, then `text_config`).
pub fn family_of(config: &Json) -> Option<&'static Family> {
    let names = |c: &Json| -> Vec<String> {
        let mut v: Vec<String> = c
            .get("model_type")
            .and_then(Json::as_str)
            .map(String::from)
            .into_iter()
            .collect();
        if let Some(a) = c.get("architectures").and_then(Json::as_array) {
            v.extend(a.iter().filter_map(Json::as_str).map(String::from));
        }
        v
    };
    let mut all = names(config);
    if let Some(t) = config.get("text_config") {
        all.extend(names(t));
    }
    all.iter().find_map(|n| families::by_hf_name(n))
}

/// Every `model_type` / `architectures` name a config states, for errors.
pub fn declared_names(config: &Json) -> String {
    let mut v = vec![];
    for c in [Some(config), config.get("text_config")]
        .into_iter()
        .flatten()
    {
        if let Some(m) = c.get("model_type") {
            v.push(format!("model_type {m}"));
        }
        if let Some(a) = c.get("architectures") {
            v.push(format!("architectures {a}"));
        }
    }
    if v.is_empty() {
        "neither model_type nor architectures".into()
    } else {
        v.join(", ")
    }
}

/// The text model's declarations: the outer config's own keys, with the
/// other components' configs (`vision_config`, `audio_config`, ... any key
/// ending in `_config`) removed, overlaid by `text_config`'s keys.
///
/// So a key the text config states decides; a key stated at the top level
/// applies unless the text config restates it; a key nested under another
/// component (`vision_config.use_qk_norm`) is never read.
pub fn text_root(config: &Json) -> Json {
    let Some(outer) = config.as_object() else {
        return config.clone();
    };
    let mut root: Map<String, Json> = outer
        .iter()
        .filter(|(k, _)| !k.ends_with("_config"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(Json::Object(t)) = outer.get("text_config") {
        for (k, v) in t {
            root.insert(k.clone(), v.clone());
        }
    }
    Json::Object(root)
}

/// A special token as a file states it: an id, or a text to look up.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenRef {
    Id(u32),
    Text(String),
}

/// BOS/EOS facts of a pack, each with its source.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecialFacts {
    pub bos: Sourced<Option<TokenRef>>,
    /// None: neither file states it.
    pub add_bos: Sourced<Option<bool>>,
    /// Every end-of-sequence token stated, in order, each once.
    pub eos: Sourced<Vec<TokenRef>>,
}

/// `bos_token` / `eos_token` in tokenizer_config.json: a string or `{content}`.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(String::from),
        _ => None,
    }
}

/// Ids from an int or a list of ints.
fn ids(v: &Json) -> Vec<u32> {
    match v {
        Json::Array(a) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        v => v.as_u64().map(|x| x as u32).into_iter().collect(),
    }
}

/// BOS from `config.json` (`bos_token_id`, `add_bos_token`), else
/// `tokenizer_config.json` (`bos_token`, `add_bos_token`); EOS from every
/// `eos_token_id` of config.json and generation_config.json plus
/// tokenizer_config.json's `eos_token`. A JSON null states nothing;
/// `add_bos_token: false` is a statement.
pub fn special_facts(
    config: &Json,
    tokenizer_config: Option<&Json>,
    generation_config: Option<&Json>,
) -> SpecialFacts {
    let tc = tokenizer_config.unwrap_or(&Json::Null);
    let stated = |j: &Json, k: &str| j.get(k).filter(|v| !v.is_null()).cloned();

    let bos = if let Some(id) = stated(config, "bos_token_id").and_then(|v| v.as_u64()) {
        Sourced::new(Some(TokenRef::Id(id as u32)), "config.json bos_token_id")
    } else if let Some(t) = stated(tc, "bos_token").as_ref().and_then(token_text) {
        Sourced::new(Some(TokenRef::Text(t)), "tokenizer_config.json bos_token")
    } else {
        Sourced::new(
            None,
            "neither config.json bos_token_id nor tokenizer_config.json bos_token",
        )
    };
    let add_bos = if let Some(b) = stated(config, "add_bos_token").and_then(|v| v.as_bool()) {
        Sourced::new(Some(b), "config.json add_bos_token")
    } else if let Some(b) = stated(tc, "add_bos_token").and_then(|v| v.as_bool()) {
        Sourced::new(Some(b), "tokenizer_config.json add_bos_token")
    } else {
        Sourced::new(
            None,
            "add_bos_token stated in neither config.json nor tokenizer_config.json",
        )
    };

    let mut eos: Vec<TokenRef> = Vec::new();
    let mut srcs = Vec::new();
    let push = |t: TokenRef, eos: &mut Vec<TokenRef>| {
        if !eos.contains(&t) {
            eos.push(t);
        }
    };
    for (file, j) in [
        ("config.json", Some(config)),
        ("generation_config.json", generation_config),
    ] {
        if let Some(v) = j.and_then(|j| stated(j, "eos_token_id")) {
            srcs.push(format!("{file} eos_token_id {v}"));
            for id in ids(&v) {
                push(TokenRef::Id(id), &mut eos);
            }
        }
    }
    if let Some(t) = stated(tc, "eos_token").as_ref().and_then(token_text) {
        srcs.push(format!("tokenizer_config.json eos_token {t:?}"));
        push(TokenRef::Text(t), &mut eos);
    }
    let src = if srcs.is_empty() {
        "no eos_token_id or eos_token stated".to_string()
    } else {
        srcs.join(" + ")
    };
    SpecialFacts {
        bos,
        add_bos,
        eos: Sourced::new(eos, src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn family_by_model_type_or_architectures_both_spellings() {
        let arch = |c: Json| family_of(&c).map(|f| f.arch);
        assert_eq!(
            arch(json!({"model_type": "hunyuan_v1_dense"})),
            Some("hunyuan-dense")
        );
        assert_eq!(
            arch(json!({"architectures": ["HunYuanDenseV1ForCausalLM"]})),
            Some("hunyuan-dense")
        );
        assert_eq!(
            arch(json!({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})),
            Some("gemma3")
        );
        assert_eq!(
            arch(json!({"model_type": "x", "text_config": {"model_type": "gemma3_text"}})),
            Some("gemma3")
        );
        assert_eq!(arch(json!({"model_type": "mamba"})), None);
    }

    #[test]
    fn text_root_overlays_text_config_and_drops_other_components() {
        let c = json!({
            "model_type": "gemma3",
            "use_qk_norm": false,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "vision_config": {"use_qk_norm": true, "hidden_size": 1152},
            "text_config": {"hidden_size": 2560}
        });
        let r = text_root(&c);
        assert_eq!(r["hidden_size"], 2560);
        assert_eq!(r["use_qk_norm"], false);
        assert_eq!(r["rope_scaling"]["factor"], 8.0);
        assert!(r.get("vision_config").is_none());
    }

    #[test]
    fn bos_from_config_else_tokenizer_config_string_or_object() {
        let f = special_facts(&json!({"bos_token_id": 2}), None, None);
        assert_eq!(f.bos.value, Some(TokenRef::Id(2)));
        assert_eq!(f.bos.source, "config.json bos_token_id");
        // Medgemma: config.json states neither; tokenizer_config.json both.
        let tc = json!({"bos_token": "<bos>", "add_bos_token": true});
        let f = special_facts(&json!({"bos_token_id": null}), Some(&tc), None);
        assert_eq!(f.bos.value, Some(TokenRef::Text("<bos>".into())));
        assert_eq!(f.bos.source, "tokenizer_config.json bos_token");
        assert_eq!(f.add_bos.value, Some(true));
        assert_eq!(f.add_bos.source, "tokenizer_config.json add_bos_token");
        let tc = json!({"bos_token": {"content": "<s>", "lstrip": false}});
        let f = special_facts(&json!({}), Some(&tc), None);
        assert_eq!(f.bos.value, Some(TokenRef::Text("<s>".into())));
    }

    #[test]
    fn add_bos_false_is_not_absent() {
        let f = special_facts(&json!({}), Some(&json!({"add_bos_token": false})), None);
        assert_eq!(f.add_bos.value, Some(false));
        let f = special_facts(&json!({}), Some(&json!({"add_bos_token": null})), None);
        assert_eq!(f.add_bos.value, None);
        // config.json's statement wins over tokenizer_config.json's.
        let f = special_facts(
            &json!({"add_bos_token": false}),
            Some(&json!({"add_bos_token": true})),
            None,
        );
        assert_eq!(f.add_bos.value, Some(false));
        assert_eq!(f.add_bos.source, "config.json add_bos_token");
    }

    #[test]
    fn stop_set_is_every_eos_id_int_or_list_from_both_files() {
        let f = special_facts(
            &json!({"eos_token_id": 1}),
            Some(&json!({"eos_token": {"content": "<eos>"}})),
            Some(&json!({"eos_token_id": [1, 106]})),
        );
        assert_eq!(
            f.eos.value,
            vec![
                TokenRef::Id(1),
                TokenRef::Id(106),
                TokenRef::Text("<eos>".into())
            ]
        );
        assert!(f
            .eos
            .source
            .contains("generation_config.json eos_token_id [1,106]"));
        let f = special_facts(&json!({"eos_token_id": [2, 7]}), None, None);
        assert_eq!(f.eos.value, vec![TokenRef::Id(2), TokenRef::Id(7)]);
    }
}
