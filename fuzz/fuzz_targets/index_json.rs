//! Arbitrary bytes as `model.safetensors.index.json`: a typed error or an index whose shards all
//! stay inside the checkpoint folder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = zoo_hub::ShardIndex::parse(Path::new("model.safetensors.index.json"), data) {
        for shard in &index.shards {
            assert!(!shard.split('/').any(|p| p == ".."), "{shard}");
            assert!(!Path::new(shard).is_absolute(), "{shard}");
        }
    }
});
