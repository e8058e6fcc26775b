//! `zoo plan` end to end on a hand-laid checkpoint: the table, the JSON, and the refusals.

mod common;
use common::zoo;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

fn model(dir: &std::path::Path) {
    // Four decoder layers of 1 MiB each (f32 [512, 512]) plus 1 MiB of embeddings.
    let mut header = serde_json::Map::new();
    let mut names = vec!["model.embed_tokens.weight".to_string()];
    names.extend((0..4).map(|i| format!("model.layers.{i}.mlp.up_proj.weight")));
    for (i, n) in names.iter().enumerate() {
        let (b, e) = (i * (1 << 20), (i + 1) * (1 << 20));
        header.insert(
            n.clone(),
            serde_json::json!({"dtype": "F32", "shape": [512, 512], "data_offsets": [b, e]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.resize(bytes.len() + 5 * (1 << 20), 0);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":512,"intermediate_size":512,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":8,"vocab_size":512}"#,
    )
    .unwrap();
}

#[test]
fn balanced_plan_over_two_tpus_is_written_and_reloadable() {
    let dir = tempfile::tempdir().unwrap();
    model(dir.path());
    let out_file = dir.path().join("plan.json");
    let (ok, out, err) = zoo(&[
        "plan",
        dir.path().to_str().unwrap(),
        "--platform",
        "tpu",
        "--max-memory",
        "0=8MiB,1=8MiB",
        "--seq",
        "64",
        "--reserve",
        "0",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("tpu:0") && out.contains("tpu:1") && out.contains("cut tpu:0 -> tpu:1"),
        "{out}"
    );
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    let map = plan["hf_device_map"].as_object().unwrap();
    assert_eq!(map.len(), 5);
    assert_eq!(map["model.embed_tokens"], 0);
    assert_eq!(map["model.layers.3"], 1);
    // Balanced: 5 MiB of weights split 3 + 2 (or 2 + 3), never 4 + 1.
    let weights: Vec<u64> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["weights"].as_u64().unwrap())
        .collect();
    assert_eq!(weights.iter().max().copied(), Some(3 << 20), "{weights:?}");
}

#[test]
fn infeasible_and_unbudgeted_requests_fail_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    model(dir.path());
    let d = dir.path().to_str().unwrap();
    let (ok, _, err) = zoo(&["plan", d, "--max-memory", "0=2MiB,1=2MiB", "--seq", "8"]);
    assert!(!ok);
    assert!(
        err.contains("does not fit") && err.contains("device:0") && err.contains("more is needed"),
        "{err}"
    );
    let (ok, _, err) = zoo(&["plan", d, "--max-memory", "0=2MiB", "--devices", "2"]);
    assert!(!ok);
    assert!(err.contains("device:1 has no memory budget"), "{err}");
    let (ok, _, err) = zoo(&["plan", d, "--max-memory", "0=1GiB,disk=10GiB"]);
    assert!(!ok && err.contains("disk"), "{err}");
}

#[test]
fn an_encoder_plans_without_kv_cache_for_its_own_context() {
    // all-MiniLM-L6-v2 (BERT, max_position_embeddings 512), from the test command's assets.
    let model = assets::asset("ZOO_MINILM_DIR");
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("plan.json");
    let m = model.to_str().unwrap();
    let (ok, out, err) = zoo(&[
        "plan",
        m,
        "--max-memory",
        "0=200MiB,1=200MiB",
        "--reserve",
        "0",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("an encoder keeps no KV cache; activations are sized for 512 tokens"),
        "{out}"
    );
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    assert_eq!(plan["workload"]["seq"], 512);
    for stage in plan["stages"].as_array().unwrap() {
        assert_eq!(stage["kv"], 0, "{stage}");
    }
    // The family's units: embeddings first, then the six layers whole.
    let units: Vec<&str> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["units"].as_array().unwrap().iter())
        .map(|u| u.as_str().unwrap())
        .collect();
    assert_eq!(units[0], "embeddings", "{units:?}");
    assert_eq!(
        units[1..7],
        [
            "encoder.layer.0",
            "encoder.layer.1",
            "encoder.layer.2",
            "encoder.layer.3",
            "encoder.layer.4",
            "encoder.layer.5"
        ]
    );
    // Longer than the model takes: refused with the limit.
    let (ok, _, err) = zoo(&["plan", m, "--max-memory", "1GiB", "--seq", "1024"]);
    assert!(!ok && err.contains("512") && err.contains("--seq"), "{err}");
}

#[test]
fn an_encoder_decoder_counts_self_and_cross_attention_caches_of_its_decoder_layers() {
    // The committed T5 case: 2 encoder and 2 decoder blocks, 4 heads of 8, vocabulary 96.
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures/t5-generate-f32");
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("plan.json");
    let (ok, out, err) = zoo(&[
        "plan",
        model.to_str().unwrap(),
        "--max-memory",
        "0=400KiB,1=400KiB",
        "--reserve",
        "0",
        "--seq",
        "64",
        "--dtype",
        "f32",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("cross-attention cache"), "{out}");
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    let stages = plan["stages"].as_array().unwrap();
    let units: Vec<&str> = stages
        .iter()
        .flat_map(|s| s["units"].as_array().unwrap().iter())
        .map(|u| u.as_str().unwrap())
        .collect();
    // Execution order: the encoder whole, then the decoder, then the head's norm.
    let pos = |n: &str| units.iter().position(|u| *u == n).unwrap();
    assert!(
        pos("encoder.block.1") < pos("encoder.final_layer_norm"),
        "{units:?}"
    );
    assert!(
        pos("encoder.final_layer_norm") < pos("decoder.block.0"),
        "{units:?}"
    );
    assert!(
        pos("decoder.block.1") < pos("decoder.final_layer_norm"),
        "{units:?}"
    );
    // Per decoder layer: self and cross caches, keys and values, 64 x 4 x 8 f32 each; the
    // encoder keeps none; the last stage also holds one step's f32 logits.
    let per_layer = 2 * 2 * 64 * 4 * 8 * 4;
    let kv: u64 = stages.iter().map(|s| s["kv"].as_u64().unwrap()).sum();
    assert_eq!(kv, 2 * per_layer + 96 * 4, "{out}");
}

#[test]
fn a_pipeline_is_planned_by_component_with_the_unet_split_at_its_blocks() {
    let sdxl = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diffusers/tests/data/pipelines/sdxl");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let (ok, stdout, stderr) = zoo(&[
        "plan",
        &sdxl.to_string_lossy(),
        "--max-memory",
        "0=3MiB,1=3MiB",
        "--size",
        "32x32",
        "--reserve",
        "0",
        "--out",
        &out.to_string_lossy(),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("StableDiffusionXLPipeline at 32x32"),
        "{stdout}"
    );
    assert!(
        stdout.contains("a batch of 2"),
        "guidance doubles the UNet's batch: {stdout}"
    );
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let stages = plan["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{stdout}");
    let units: Vec<&str> = stages
        .iter()
        .flat_map(|s| {
            s["units"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u.as_str().unwrap())
        })
        .collect();
    assert_eq!(units.first(), Some(&"text_encoder"));
    assert_eq!(units.last(), Some(&"vae"));
    let unet: Vec<&&str> = units.iter().filter(|u| u.starts_with("unet")).collect();
    assert!(
        unet.len() >= 5,
        "the UNet splits into its blocks: {units:?}"
    );
    // A UNet stage boundary: both devices hold part of the UNet.
    for s in stages {
        assert!(s["units"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u.as_str().unwrap().starts_with("unet")));
    }
    // Larger images need more activation memory.
    let (ok, small, _) = zoo(&[
        "plan",
        &sdxl.to_string_lossy(),
        "--max-memory",
        "1GiB",
        "--size",
        "32x32",
    ]);
    assert!(ok);
    let (ok, big, _) = zoo(&[
        "plan",
        &sdxl.to_string_lossy(),
        "--max-memory",
        "1GiB",
        "--size",
        "64x64",
    ]);
    assert!(ok);
    let act = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("note:"))
            .unwrap()
            .to_string()
    };
    assert_ne!(act(&small), act(&big));
}

#[test]
fn a_flux_pipeline_splits_its_transformer_at_double_and_single_blocks() {
    let flux = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diffusers/tests/data/pipelines/flux");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let (ok, stdout, stderr) = zoo(&[
        "plan",
        &flux.to_string_lossy(),
        "--max-memory",
        "0=7MiB,1=7MiB",
        "--size",
        "32x32",
        "--reserve",
        "0",
        "--out",
        &out.to_string_lossy(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("FluxPipeline at 32x32"), "{stdout}");
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let units: Vec<String> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["units"].as_array().unwrap().clone())
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    for unit in [
        "text_encoder",
        "text_encoder_2",
        "transformer",
        "transformer.transformer_blocks.0",
        "transformer.single_transformer_blocks.1",
        "transformer.proj_out",
        "vae",
    ] {
        assert!(units.iter().any(|u| u == unit), "{unit} missing: {units:?}");
    }
    let pos = |u: &str| units.iter().position(|x| x == u).unwrap();
    assert!(
        pos("transformer.transformer_blocks.0") < pos("transformer.single_transformer_blocks.0")
    );
    assert!(pos("text_encoder_2") < pos("transformer") && pos("transformer.proj_out") < pos("vae"));
}

#[test]
fn a_pixart_pipeline_plans_its_t5_blocks_and_vae() {
    let sigma = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diffusers/tests/data/pipelines/pixart-sigma");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let (ok, stdout, stderr) = zoo(&[
        "plan",
        &sigma.to_string_lossy(),
        "--max-memory",
        "0=2.1MiB,1=2.1MiB",
        "--size",
        "64x64",
        "--reserve",
        "0",
        "--out",
        &out.to_string_lossy(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("PixArtSigmaPipeline at 64x64"), "{stdout}");
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let stages = plan["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{plan}");
    let units: Vec<String> = stages
        .iter()
        .flat_map(|s| s["units"].as_array().unwrap().clone())
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    let pos = |u: &str| {
        units
            .iter()
            .position(|x| x == u)
            .unwrap_or_else(|| panic!("{u} missing: {units:?}"))
    };
    assert!(pos("text_encoder") < pos("transformer.transformer_blocks.0"));
    assert!(pos("transformer.transformer_blocks.1") < pos("transformer.proj_out"));
    assert!(pos("transformer.proj_out") < pos("vae"));
}

#[test]
fn a_pipeline_plan_prints_what_crosses_each_cut() {
    let sigma = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diffusers/tests/data/pipelines/pixart-sigma");
    let (ok, stdout, stderr) = zoo(&[
        "plan",
        &sigma.to_string_lossy(),
        "--max-memory",
        "0=1.95MiB,1=1.95MiB,2=3MiB",
        "--size",
        "64x64",
        "--reserve",
        "0",
    ]);
    assert!(ok, "{stderr}");
    // Inside the transformer: 2 guided rows x ((16 image + 300 text tokens) x 16 + 7 x 16
    // modulations) x 4 B at every step; to the VAE: one image's 4 x 8 x 8 f32 latents.
    assert!(
        stdout.contains(
            "after transformer, 40.38 KiB per denoising step (16 image + 300 text tokens x 16"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("after transformer.proj_out, 1.00 KiB once per call (the final latents"),
        "{stdout}"
    );
    assert!(!stdout.contains("per token"), "{stdout}");
}
