//! `tokenizer.json` (HF tokenizers' format) and `tokenizer_config.json` rebuilt from a GGUF
//! file's `tokenizer.*` metadata: the vocabulary, merges and token types, the pre-tokenizer the
//! file names in `tokenizer.ggml.pre`, the special token ids and the chat template.

use serde_json::{json, Map, Value as J};

use super::reader::{Array, GgufFile};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The GPT-2 split used by byte-level BPE with `use_regex: true`.
const SPLIT_GPT2: &str = "gpt2";

/// llama 3's pre-tokenizer split (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const SPLIT_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's pre-tokenizer split (single digits).
const SPLIT_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Digits one by one, then the GPT-2 split (StarCoder's tokenizer and those trained like it).
const SPLIT_DIGITS_GPT2: &str = "digits+gpt2";

/// `tokenizer.ggml.pre` values zoo turns into an HF pre-tokenizer, grouped by llama.cpp's
/// pre-tokenizer type: the names in one group share one split.
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

/// `(tokenizer.json, tokenizer_config.json)` for the file, or `None` when the file stores no
/// tokenizer (`tokenizer.ggml.model` absent).
pub(crate) fn build(file: &GgufFile) -> Result<Option<(J, J)>, String> {
    let md = &file.metadata;
    let Some(model) = md.get("tokenizer.ggml.model") else {
        return Ok(None);
    };
    let model = model
        .as_str()
        .ok_or_else(|| format!("tokenizer.ggml.model is {model}, not a string"))?;
    if model != "gpt2" {
        return Err(format!(
            "tokenizer.ggml.model is {model:?}; zoo builds tokenizers of type \"gpt2\" (byte-level BPE) only so far"
        ));
    }
    let tokens = match md.get_array("tokenizer.ggml.tokens") {
        Some(Array::String(t)) => t,
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
    let types: Vec<i32> = match md.get_array("tokenizer.ggml.token_type") {
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
    let merges = match md.get_array("tokenizer.ggml.merges") {
        Some(Array::String(m)) => m,
        Some(a) => {
            return Err(format!(
                "tokenizer.ggml.merges is an array of {}, not of strings",
                a.item_type()
            ))
        }
        None => {
            return Err(
                "tokenizer.ggml.merges is missing; a byte-level BPE tokenizer needs its merges"
                    .into(),
            )
        }
    };
    let pre = md.get_str("tokenizer.ggml.pre").unwrap_or("default");
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
    // respelled byte by byte, as HF's converter does, so that the vocabulary stays complete.
    let alphabet = byte_alphabet();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut vocab = Map::new();
    for (id, t) in tokens.iter().enumerate() {
        let spelled = if in_alphabet(t) {
            t.clone()
        } else {
            t.bytes().map(|b| alphabet[b as usize]).collect()
        };
        vocab.insert(spelled, json!(id));
    }
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            format!("tokenizer.ggml.merges item {i} ({m:?}) is not two tokens separated by a space")
        })?;
        merge_pairs.push(json!([a, b]));
    }

    let mut added = Vec::new();
    for (id, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
        // Control tokens outside the byte alphabet are llama.cpp mislabels, not real specials.
        let special = match ty {
            CONTROL if in_alphabet(t) => true,
            USER_DEFINED => false,
            _ => continue,
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

    let token_of = |key: &str| -> Result<Option<&String>, String> {
        match md.get(key) {
            None => Ok(None),
            Some(v) => {
                let id = v
                    .as_u64()
                    .ok_or_else(|| format!("{key} is {v}, not a token id"))?;
                tokens.get(id as usize).map(Some).ok_or_else(|| {
                    format!(
                        "{key} is {id}, past the end of the {}-token vocabulary",
                        tokens.len()
                    )
                })
            }
        }
    };
    let bos = token_of("tokenizer.ggml.bos_token_id")?;
    let eos = token_of("tokenizer.ggml.eos_token_id")?;
    let unk = token_of("tokenizer.ggml.unknown_token_id")?;
    let pad = token_of("tokenizer.ggml.padding_token_id")?;
    let add_bos = md.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
    let add_eos = md.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);

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

    let post_processor = post_processor(
        add_bos
            .then_some(bos)
            .flatten()
            .map(|t| (t.as_str(), vocab_id(tokens, t))),
        add_eos
            .then_some(eos)
            .flatten()
            .map(|t| (t.as_str(), vocab_id(tokens, t))),
    );

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
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
            "merges": merge_pairs,
        },
    });

    let mut config = Map::new();
    config.insert("tokenizer_class".into(), json!("GPT2Tokenizer"));
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    config.insert("bos_token".into(), json!(bos));
    config.insert("eos_token".into(), json!(eos));
    config.insert("unk_token".into(), json!(unk));
    config.insert("pad_token".into(), json!(pad));
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(n) = md.get_u64(&format!(
        "{}.context_length",
        md.get_str("general.architecture").unwrap_or("llama")
    )) {
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

fn vocab_id(tokens: &[String], t: &str) -> usize {
    tokens.iter().position(|x| x == t).unwrap_or(0)
}

/// A template adding BOS and/or EOS around each sequence (`[bos] A [eos]`, and for pairs
/// `[bos] A [eos] [bos] B [eos]` with B's tokens of type 1), or byte-level offsets only.
fn post_processor(bos: Option<(&str, usize)>, eos: Option<(&str, usize)>) -> J {
    if bos.is_none() && eos.is_none() {
        return json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
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
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}
