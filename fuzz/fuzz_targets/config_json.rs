//! Arbitrary bytes as `config.json`, `tokenizer_config.json` and `generation_config.json`: a typed
//! error or a config whose rope parameters normalise without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zoo_hub::config::{parse_json, GenerationConfig, PretrainedConfig, TokenizerConfig};

fuzz_target!(|data: &[u8]| {
    let p = Path::new("config.json");
    if let Ok(c) = parse_json::<PretrainedConfig>(p, data) {
        let _ = c.rope();
        let _ = c.require_usize("hidden_size");
        let _ = c.parse_as::<PretrainedConfig>();
    }
    if let Ok(t) = parse_json::<TokenizerConfig>(p, data) {
        let _ = t.template(None);
    }
    let _ = parse_json::<GenerationConfig>(p, data);
});
