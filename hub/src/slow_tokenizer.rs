//! `tokenizer.json` for checkpoints that ship a slow tokenizer's files instead, as diffusion
//! repos ship CLIP's: `vocab.json` + `merges.txt` with `tokenizer_class: "CLIPTokenizer"`.
//!
//! The JSON is the one transformers' `CLIPTokenizer` builds over the same files: NFC, runs of
//! whitespace to one space, lowercase; CLIP's regex split (contractions, letters, single
//! digits, other symbols) then byte-level symbols; BPE with `</w>` ending each word; the
//! start and end tokens around every text. Added tokens are `added_tokens_decoder` of
//! `tokenizer_config.json` when it lists them, else the special tokens.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::config::{read_json, TokenizerConfig};
use crate::error::{HubError, Result};

/// The classes whose files this module reads.
pub const CLASSES: &[&str] = &["CLIPTokenizer", "CLIPTokenizerFast"];

/// CLIP's pre-tokenizing split, as transformers writes it.
const CLIP_SPLIT: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// The `tokenizer.json` of a CLIP tokenizer from `vocab.json` and `merges.txt`.
pub fn clip(vocab_path: &Path, merges_path: &Path, config: &TokenizerConfig) -> Result<Value> {
    let vocab: Map<String, Value> = read_json(vocab_path)?;
    let bad = |path: &Path, reason: String| HubError::Json {
        path: path.to_path_buf(),
        reason,
    };
    if let Some((token, _)) = vocab.iter().find(|(_, id)| !id.is_u64()) {
        return Err(bad(
            vocab_path,
            format!("token {token:?} maps to a non-integer id; vocab.json maps tokens to ids"),
        ));
    }
    let text = std::fs::read_to_string(merges_path).map_err(|source| HubError::Io {
        path: merges_path.to_path_buf(),
        source,
    })?;
    let mut merges = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // The first line is `#version: 0.2`; transformers skips every line starting with '#'.
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (a, b) = line.split_once(' ').ok_or_else(|| {
            bad(
                merges_path,
                format!(
                    "line {}: {line:?} is not two symbols separated by a space",
                    n + 1
                ),
            )
        })?;
        for part in [a, b] {
            if !vocab.contains_key(part) {
                return Err(bad(
                    merges_path,
                    format!("line {}: {part:?} is not in vocab.json", n + 1),
                ));
            }
        }
        merges.push(json!([a, b]));
    }
    let token = |t: &Option<crate::config::SpecialToken>, default: &str| -> String {
        t.as_ref()
            .map_or(default.to_string(), |t| t.content().to_string())
    };
    let bos = token(&config.bos_token, "<|startoftext|>");
    let eos = token(&config.eos_token, "<|endoftext|>");
    let unk = token(&config.unk_token, "<|endoftext|>");
    let pad = token(&config.pad_token, "<|endoftext|>");
    let mut next_id = vocab.len() as u64;
    let mut id_of = |t: &str| -> u64 {
        vocab.get(t).and_then(Value::as_u64).unwrap_or_else(|| {
            next_id += 1;
            next_id - 1
        })
    };
    let added: Vec<Value> = match config
        .extra
        .get("added_tokens_decoder")
        .and_then(Value::as_object)
    {
        Some(listed) if !listed.is_empty() => {
            let mut out = Vec::new();
            for (id, t) in listed {
                let id: u64 = id.parse().map_err(|_| HubError::Json {
                    path: vocab_path.with_file_name("tokenizer_config.json"),
                    reason: format!("added_tokens_decoder key {id:?} is not a token id"),
                })?;
                let field =
                    |k: &str, default: bool| t.get(k).and_then(Value::as_bool).unwrap_or(default);
                out.push(json!({
                    "id": id,
                    "content": t.get("content").and_then(Value::as_str).unwrap_or_default(),
                    "single_word": field("single_word", false),
                    "lstrip": field("lstrip", false),
                    "rstrip": field("rstrip", false),
                    "normalized": field("normalized", false),
                    "special": field("special", true),
                }));
            }
            out
        }
        _ => {
            let mut seen: Vec<String> = Vec::new();
            let mut out = Vec::new();
            for t in [&bos, &eos, &unk, &pad] {
                if seen.contains(t) {
                    continue;
                }
                seen.push(t.clone());
                out.push(json!({
                    "id": id_of(t), "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true,
                }));
            }
            out
        }
    };
    let id = |t: &str| -> Result<u64> {
        vocab
            .get(t)
            .and_then(Value::as_u64)
            .or_else(|| {
                added
                    .iter()
                    .find(|a| a["content"] == t)
                    .and_then(|a| a["id"].as_u64())
            })
            .ok_or_else(|| {
                bad(
                    vocab_path,
                    format!("the special token {t:?} is neither in vocab.json nor an added token"),
                )
            })
    };
    let (bos_id, eos_id) = (id(&bos)?, id(&eos)?);
    id(&unk)?;
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFC"},
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
            {"type": "Lowercase"},
        ]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": CLIP_SPLIT}, "behavior": "Removed", "invert": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        ]},
        "post_processor": {
            "type": "RobertaProcessing",
            "sep": [eos, eos_id],
            "cls": [bos, bos_id],
            "trim_offsets": false,
            "add_prefix_space": false,
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "</w>",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}
