//! Arbitrary bytes as `tokenizer.json` and `tokenizer_config.json`: a typed error, or a
//! tokenizer that encodes and decodes text (special tokens, non-ASCII, empty) without
//! panicking, and a chat template from the config that renders or errors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zoo_hub::config::{parse_json, TokenizerConfig};
use zoo_transformers::{ChatTemplate, Message, Tokenizer};

const TEXTS: [&str; 4] = [
    "Hello, World!",
    "",
    "Café 😀 naïve\n\ttabs",
    "[CLS] <s> </s> <|im_end|>",
];

fuzz_target!(|data: &[u8]| {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(tok) = Tokenizer::from_json(&json) {
            for text in TEXTS {
                if let Ok(ids) = tok.encode(text, true) {
                    let _ = tok.decode(&ids, false);
                    let _ = tok.decode(&ids, true);
                }
                let _ = tok.encode_truncated(text, 3);
            }
            let _ = tok.decode(&[0, 1, 2, u32::MAX], true);
        }
    }
    if let Ok(cfg) = parse_json::<TokenizerConfig>(Path::new("tokenizer_config.json"), data) {
        if let Ok(t) = ChatTemplate::from_tokenizer_config(&cfg) {
            let _ = t.apply(&[Message::new("user", "hi")], true);
        }
    }
});
