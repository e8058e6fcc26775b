//! Arbitrary bytes as a device-map JSON (transformers' `hf_device_map`, or a plan written by
//! `zoo plan --out`): a typed error, or a map that answers placements and survives a round
//! trip through its own JSON unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zoo_runtime::device_map::ExplicitMap;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let path = Path::new("device_map.json");
    let Ok(map) = ExplicitMap::from_json(&json, path) else {
        return;
    };
    for name in [
        "model.embed_tokens.weight",
        "model.layers.1.mlp.up_proj.weight",
        "lm_head.weight",
        "",
    ] {
        let _ = map.placement_of(name);
    }
    let again =
        ExplicitMap::from_json(&map.to_json(), path).expect("a map reads back its own JSON");
    assert_eq!(again.to_json(), map.to_json());
});
