//! `tokenizer.json` (HF tokenizers' format) and `tokenizer_config.json` rebuilt from a GGUF
//! file's `tokenizer.*` metadata: the vocabulary, merges, scores and token types, the
//! pre-tokenizer the file names in `tokenizer.ggml.pre`, the special token ids and the chat
//! template.
//!
//! Two tokenizer models are built, as transformers builds them from the same metadata:
//! `gpt2` (byte-level BPE) and `llama` (SentencePiece BPE with byte fallback, its merges taken
//! from the file or recovered from the vocabulary and scores).

use std::collections::HashMap;

use serde_json::{json, Map, Value as J};

use super::reader::{Array, Metadata};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The GPT-2 split used by byte-level BPE with `use_regex: true`.
const SPLIT_GPT2: &str = "gpt2";

/// Digits one by one, then the GPT-2 split (StarCoder's tokenizer and those trained like it).
const SPLIT_DIGITS_GPT2: &str = "digits+gpt2";

/// llama 3's pre-tokenizer split (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const SPLIT_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's pre-tokenizer split (single digits).
const SPLIT_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values zoo turns into an HF pre-tokenizer for byte-level BPE, grouped by
/// llama.cpp's pre-tokenizer type: the names in one group share one split.
const PRE_TOKENIZERS: &[(&str, &str)] = &[
    ("default", SPLIT_GPT2),
    ("gpt-2", SPLIT_GPT2),
    ("gpt2", SPLIT_GPT2),
    ("smollm", SPLIT_DIGITS_GPT2),
    ("starcoder", SPLIT_DIGITS_GPT2),
    ("refact", SPLIT_DIGITS_GPT2),
    ("command-r", SPLIT_DIGITS_GPT2),
    ("codeshell", SPLIT_DIGITS_GPT2),
    ("exaone", SPLIT_DIGITS_GPT2),
    ("minerva-7b", SPLIT_DIGITS_GPT2),
    ("llama3", SPLIT_LLAMA3),
    ("llama-v3", SPLIT_LLAMA3),
    ("llama-bpe", SPLIT_LLAMA3),
    ("falcon3", SPLIT_LLAMA3),
    ("smaug-bpe", SPLIT_LLAMA3),
    ("dbrx", SPLIT_LLAMA3),
    ("qwen2", SPLIT_QWEN2),
    ("deepseek-r1-qwen", SPLIT_QWEN2),
    ("megrez", SPLIT_QWEN2),
];

/// GPT-2's reversible byte-to-character table: printable Latin-1 bytes stand for themselves,
/// the other 68 bytes map to U+0100 onwards in byte order.
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// The (token, id) of BOS and of EOS when the post-processor adds them.
type Ends<'a> = (Option<(&'a str, usize)>, Option<(&'a str, usize)>);

/// What both tokenizer models read from the metadata.
struct Common<'a> {
    tokens: &'a [String],
    types: Vec<i32>,
    bos: Option<usize>,
    eos: Option<usize>,
    unk: Option<usize>,
    pad: Option<usize>,
}

impl Common<'_> {
    fn token(&self, id: Option<usize>) -> Option<&str> {
        id.map(|i| self.tokens[i].as_str())
    }

    /// HF's added tokens: control tokens and the named special tokens (BOS, EOS, UNK, PAD) as
    /// special, user-defined tokens as plain added tokens; `keep` vetoes control tokens.
    fn added_tokens(&self, keep: impl Fn(&str) -> bool) -> Vec<J> {
        let named = [self.bos, self.eos, self.unk, self.pad];
        let mut added = Vec::new();
        for (id, t) in self.tokens.iter().enumerate() {
            let ty = self.types.get(id).copied().unwrap_or(0);
            let special = if named.contains(&Some(id)) || (ty == CONTROL && keep(t)) {
                true
            } else if ty == USER_DEFINED {
                false
            } else {
                continue;
            };
            added.push(json!({
                "id": id,
                "content": t,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": special,
            }));
        }
        added
    }
}

/// `(tokenizer.json, tokenizer_config.json)` for the file, or `None` when the file stores no
/// tokenizer (`tokenizer.ggml.model` absent).
pub(crate) fn build(md: &Metadata) -> Result<Option<(J, J)>, String> {
    let Some(model) = md.get("tokenizer.ggml.model") else {
        return Ok(None);
    };
    let model = model
        .as_str()
        .ok_or_else(|| format!("tokenizer.ggml.model is {model}, not a string"))?;
    if model != "gpt2" && model != "llama" {
        return Err(format!(
            "tokenizer.ggml.model is {model:?}; zoo builds tokenizers of type \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece BPE)"
        ));
    }
    let tokens = match md.get_array("tokenizer.ggml.tokens") {
        Some(Array::String(t)) => t.as_slice(),
        Some(a) => {
            return Err(format!(
                "tokenizer.ggml.tokens is an array of {}, not of strings",
                a.item_type()
            ))
        }
        None => return Err(
            "tokenizer.ggml.tokens is missing; the file names a tokenizer but holds no vocabulary"
                .into(),
        ),
    };
    let types = match md.get_array("tokenizer.ggml.token_type") {
        None => Vec::new(),
        Some(Array::I32(t)) if t.len() == tokens.len() => t.clone(),
        Some(a) => {
            return Err(format!(
                "tokenizer.ggml.token_type must be {} i32 items (one per token), found {} {} items",
                tokens.len(),
                a.len(),
                a.item_type()
            ))
        }
    };
    let id_of = |key: &str| -> Result<Option<usize>, String> {
        match md.get(key) {
            None => Ok(None),
            Some(v) => {
                let id = v
                    .as_u64()
                    .ok_or_else(|| format!("{key} is {v}, not a token id"))?;
                if id >= tokens.len() as u64 {
                    return Err(format!(
                        "{key} is {id}, past the end of the {}-token vocabulary",
                        tokens.len()
                    ));
                }
                Ok(Some(id as usize))
            }
        }
    };
    let common = Common {
        tokens,
        types,
        bos: id_of("tokenizer.ggml.bos_token_id")?,
        eos: id_of("tokenizer.ggml.eos_token_id")?,
        unk: id_of("tokenizer.ggml.unknown_token_id")?,
        pad: id_of("tokenizer.ggml.padding_token_id")?,
    };
    let merges = match md.get_array("tokenizer.ggml.merges") {
        None => None,
        Some(Array::String(m)) => Some(split_merges(m)?),
        Some(a) => {
            return Err(format!(
                "tokenizer.ggml.merges is an array of {}, not of strings",
                a.item_type()
            ))
        }
    };
    // llama.cpp adds BOS to SentencePiece vocabularies unless the file says otherwise.
    let add_bos = md
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(model == "llama");
    let add_eos = md.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
    let template_ends = (
        add_bos
            .then_some(common.bos)
            .flatten()
            .map(|i| (tokens[i].as_str(), i)),
        add_eos
            .then_some(common.eos)
            .flatten()
            .map(|i| (tokens[i].as_str(), i)),
    );

    let (tokenizer, class) = if model == "gpt2" {
        let merges = merges.ok_or(
            "tokenizer.ggml.merges is missing; a byte-level BPE tokenizer needs its merges",
        )?;
        let pre = md.get_str("tokenizer.ggml.pre").unwrap_or("default");
        (
            byte_level(&common, merges, pre, template_ends)?,
            "GPT2Tokenizer",
        )
    } else {
        let merges = match merges {
            Some(m) => m,
            None => derive_merges(tokens, md)?,
        };
        (
            sentencepiece(md, &common, merges, template_ends),
            "LlamaTokenizer",
        )
    };

    let mut config = Map::new();
    config.insert("tokenizer_class".into(), json!(class));
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    config.insert("bos_token".into(), json!(common.token(common.bos)));
    config.insert("eos_token".into(), json!(common.token(common.eos)));
    config.insert("unk_token".into(), json!(common.token(common.unk)));
    config.insert("pad_token".into(), json!(common.token(common.pad)));
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    let arch = md.get_str("general.architecture").unwrap_or("llama");
    if let Some(n) = md.get_u64(&format!("{arch}.context_length")) {
        config.insert("model_max_length".into(), json!(n));
    }
    if let Some(v) = md.get("tokenizer.chat_template") {
        let t = v
            .as_str()
            .ok_or_else(|| format!("tokenizer.chat_template is {}, not a string", v.type_name()))?;
        config.insert("chat_template".into(), json!(t));
    }
    Ok(Some((tokenizer, J::Object(config))))
}

fn split_merges(merges: &[String]) -> Result<Vec<(String, String)>, String> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    format!("tokenizer.ggml.merges item {i} ({m:?}) is not two tokens separated by a space")
                })
        })
        .collect()
}

/// A SentencePiece BPE vocabulary stores no merges: every split of a token into two tokens of
/// the vocabulary is a merge, ranked by the merged token's score (best first), then by the
/// lengths of the two parts (longer first); ties keep vocabulary order, splits of one token
/// are ordered by the ids of their parts. This is the ranking transformers recovers.
fn derive_merges(tokens: &[String], md: &Metadata) -> Result<Vec<(String, String)>, String> {
    let scores = match md.get_array("tokenizer.ggml.scores") {
        Some(Array::F32(s)) if s.len() == tokens.len() => s,
        Some(a) => {
            return Err(format!(
                "tokenizer.ggml.scores must be {} f32 items (one per token), found {} {} items",
                tokens.len(),
                a.len(),
                a.item_type()
            ))
        }
        None => {
            return Err(
                "the SentencePiece vocabulary has neither tokenizer.ggml.merges nor tokenizer.ggml.scores to rank merges by"
                    .into(),
            )
        }
    };
    // Merges are ranked by score, so a NaN would leave them without an order.
    if let Some(i) = scores.iter().position(|s| s.is_nan()) {
        return Err(format!(
            "tokenizer.ggml.scores item {i} ({:?}) is NaN; the merges cannot be ranked",
            tokens[i]
        ));
    }
    // A token listed twice takes its last id and last score, but keeps its first position.
    let mut id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    let mut score: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if id.insert(t, i).is_none() {
            order.push(t);
        }
        score.insert(t, scores[i]);
    }
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for t in order {
        let s = score[t];
        let start = merges.len();
        for (at, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(at);
            if id.contains_key(l) && id.contains_key(r) {
                merges.push((l, r, s));
            }
        }
        merges[start..].sort_by_key(|(l, r, _)| (id[l], id[r]));
    }
    let key = |m: &(&str, &str, f32)| (m.2, m.0.chars().count(), m.1.chars().count());
    // Stable and descending: equal keys keep the order built above. Without NaN, `partial_cmp`
    // is a total order (and keeps -0.0 equal to 0.0, as transformers' sort does).
    merges.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(merges
        .into_iter()
        .map(|(l, r, _)| (l.to_string(), r.to_string()))
        .collect())
}

fn merges_json(merges: Vec<(String, String)>) -> J {
    J::Array(merges.into_iter().map(|(a, b)| json!([a, b])).collect())
}

fn vocab_json(tokens: &[String], spell: impl Fn(&str) -> String) -> Map<String, J> {
    let mut vocab = Map::new();
    for (id, t) in tokens.iter().enumerate() {
        vocab.insert(spell(t), json!(id));
    }
    vocab
}

/// Byte-level BPE (`tokenizer.ggml.model` = "gpt2") with the split `pre` names.
fn byte_level(
    common: &Common<'_>,
    merges: Vec<(String, String)>,
    pre: &str,
    ends: Ends<'_>,
) -> Result<J, String> {
    let split = PRE_TOKENIZERS
        .iter()
        .find(|(name, _)| *name == pre)
        .map(|(_, split)| *split)
        .ok_or_else(|| {
            format!(
                "tokenizer.ggml.pre is {pre:?}, a pre-tokenizer zoo does not know; known: {}",
                PRE_TOKENIZERS
                    .iter()
                    .map(|p| p.0)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    // Tokens are stored in the byte alphabet; one that is not (a mislabelled special token) is
    // respelled byte by byte, as HF's converter does, so that the vocabulary stays complete,
    // and is not made a special token.
    let alphabet = byte_alphabet();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let vocab = vocab_json(common.tokens, |t| {
        if in_alphabet(t) {
            t.to_string()
        } else {
            t.bytes().map(|b| alphabet[b as usize]).collect()
        }
    });
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match split {
        SPLIT_GPT2 => byte_level(true),
        SPLIT_DIGITS_GPT2 => json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)],
        }),
        regex => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ],
        }),
    };
    let post_processor = post_processor(ends.0, ends.1).unwrap_or_else(|| {
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
    });
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": common.added_tokens(in_alphabet),
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges_json(merges),
        },
    }))
}

/// SentencePiece BPE (`tokenizer.ggml.model` = "llama"): spaces become `▁`, one is prepended to
/// the text unless `tokenizer.ggml.add_space_prefix` is false, unknown characters fall back to
/// the `<0xNN>` byte tokens.
fn sentencepiece(
    md: &Metadata,
    common: &Common<'_>,
    merges: Vec<(String, String)>,
    ends: Ends<'_>,
) -> J {
    let prefix = md
        .get_bool("tokenizer.ggml.add_space_prefix")
        .unwrap_or(true);
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": common.added_tokens(|_| true),
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Metaspace",
            "replacement": "\u{2581}",
            "prepend_scheme": if prefix { "first" } else { "never" },
            "split": false,
        },
        "post_processor": post_processor(ends.0, ends.1),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab_json(common.tokens, str::to_string),
            "merges": merges_json(merges),
        },
    })
}

/// A template adding BOS and/or EOS around each sequence (`[bos] A [eos]`, and for pairs
/// `[bos] A [eos] [bos] B [eos]` with B's tokens of type 1); `None` when neither is added.
fn post_processor(bos: Option<(&str, usize)>, eos: Option<(&str, usize)>) -> Option<J> {
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let piece = |seq: &str, type_id: u32| {
        let mut v = Vec::new();
        if let Some((t, _)) = bos {
            v.push(json!({"SpecialToken": {"id": t, "type_id": type_id}}));
        }
        v.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some((t, _)) = eos {
            v.push(json!({"SpecialToken": {"id": t, "type_id": type_id}}));
        }
        v
    };
    let single = piece("A", 0);
    let mut pair = piece("A", 0);
    pair.extend(piece("B", 1));
    let mut specials = Map::new();
    for (t, id) in bos.into_iter().chain(eos) {
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    Some(
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}),
    )
}
