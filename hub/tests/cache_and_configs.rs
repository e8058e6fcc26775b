//! Repo ids resolved in HF-cache trees, offline mode, configs in both rope forms, tokenizer and
//! generation configs, diffusers layouts.

mod common;

use common::{f32_bytes, write_cache_repo, write_safetensors};
use safetensors::tensor::Dtype as StDtype;
use zoo_hub::{HubError, ModelFiles, Pretrained, Rope, Source};

fn tiny_safetensors() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write_safetensors(
        &p,
        &[(
            "lm_head.weight",
            StDtype::F32,
            vec![2],
            f32_bytes(&[1.0, 2.0]),
        )],
    );
    std::fs::read(p).unwrap()
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn repo_id_parsing() {
    assert_eq!(
        Source::parse("org/name").unwrap(),
        Source::Repo {
            id: "org/name".into(),
            revision: "main".into()
        }
    );
    assert_eq!(
        Source::parse("Qwen/Qwen3-0.6B@v1.0").unwrap(),
        Source::Repo {
            id: "Qwen/Qwen3-0.6B".into(),
            revision: "v1.0".into()
        }
    );
    for bad in ["a/b/c", "../x", "org/..", "org/name@", "", "org/na me"] {
        assert!(Source::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn repo_resolves_through_refs_and_snapshots_offline() {
    let cache = tempfile::tempdir().unwrap();
    write_cache_repo(
        cache.path(),
        "org/tiny",
        "main",
        COMMIT,
        &[
            ("config.json", br#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","rope_theta":10000.0}"#.to_vec()),
            ("model.safetensors", tiny_safetensors()),
            ("generation_config.json", br#"{"eos_token_id":[2,3],"do_sample":false}"#.to_vec()),
        ],
    );
    let files = ModelFiles::new(Source::parse("org/tiny").unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(false);
    let model = Pretrained::from_files(files.clone());
    let config = model.config().unwrap();
    assert_eq!(config.architectures, ["LlamaForCausalLM"]);
    assert_eq!(model.checkpoint().unwrap().inventory.len(), 1);
    let gen = model.generation_config().unwrap().unwrap();
    assert_eq!(gen.eos_token_id.unwrap().to_vec(), vec![2, 3]);
    // Optional files absent from a present snapshot are simply absent offline.
    assert!(model.tokenizer_config().unwrap().is_none());

    // A commit hash works as the revision too.
    let by_commit = ModelFiles::new(Source::parse(&format!("org/tiny@{COMMIT}")).unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(false);
    assert!(by_commit.get("config.json").is_ok());
}

#[test]
fn missing_repo_offline_lists_every_place_searched_and_how_to_get_it() {
    let cache = tempfile::tempdir().unwrap();
    let files = ModelFiles::new(Source::parse("org/absent@v2").unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(false);
    let err = files.get("config.json").unwrap_err();
    assert!(matches!(err, HubError::NotFound { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("org/absent") && msg.contains("v2") && msg.contains("config.json"),
        "{msg}"
    );
    assert!(msg.contains("models--org--absent/refs/v2"), "{msg}");
    assert!(
        msg.contains("huggingface-cli download org/absent config.json --revision v2"),
        "{msg}"
    );
    assert!(msg.contains("HF_HOME"), "{msg}");
}

#[test]
fn known_absent_marker_is_honoured() {
    let cache = tempfile::tempdir().unwrap();
    write_cache_repo(
        cache.path(),
        "org/m",
        "main",
        COMMIT,
        &[("config.json", b"{}".to_vec())],
    );
    let marker = cache
        .path()
        .join("models--org--m/.no_exist")
        .join(COMMIT)
        .join("generation_config.json");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, b"").unwrap();
    // Downloads allowed, yet no network is touched: the marker answers.
    let files =
        ModelFiles::new(Source::parse("org/m").unwrap()).with_cache(cache.path().to_path_buf());
    assert!(files
        .get_optional("generation_config.json")
        .unwrap()
        .is_none());
}

#[test]
fn rope_v4_and_v5_forms_agree() {
    let dir = tempfile::tempdir().unwrap();
    let v4 = dir.path().join("v4.json");
    std::fs::write(
        &v4,
        r#"{"model_type":"llama","rope_theta":500000.0,"rope_scaling":{"type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192},"brand_new_field":[1,2]}"#,
    )
    .unwrap();
    let v5 = dir.path().join("v5.json");
    std::fs::write(
        &v5,
        r#"{"model_type":"llama","rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#,
    )
    .unwrap();
    let a = zoo_hub::PretrainedConfig::from_file(&v4).unwrap();
    let b = zoo_hub::PretrainedConfig::from_file(&v5).unwrap();
    assert_eq!(a.rope().unwrap(), b.rope().unwrap());
    let Some(Rope::Single(p)) = a.rope().unwrap() else {
        panic!("no rope")
    };
    assert_eq!(p.rope_type, "llama3");
    assert_eq!(p.rope_theta, Some(500000.0));
    assert_eq!(p.f64("factor"), Some(8.0));
    // Unknown fields are kept, not rejected.
    assert_eq!(a.get("brand_new_field").unwrap(), serde_json::json!([1, 2]));

    let per_type = dir.path().join("v5b.json");
    std::fs::write(
        &per_type,
        r#"{"rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":1000000.0},"sliding_attention":{"rope_type":"default","rope_theta":10000.0}}}"#,
    )
    .unwrap();
    let c = zoo_hub::PretrainedConfig::from_file(&per_type).unwrap();
    let Some(Rope::PerLayerType(m)) = c.rope().unwrap() else {
        panic!("not per layer type")
    };
    assert_eq!(m["sliding_attention"].rope_theta, Some(10000.0));
}

#[test]
fn typed_model_config_errors_name_the_field() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct LlamaLike {
        hidden_size: usize,
        num_attention_heads: usize,
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, r#"{"hidden_size": 64, "eos_token_id": 2}"#).unwrap();
    let c = zoo_hub::PretrainedConfig::from_file(&p).unwrap();
    let err = c.parse_as::<LlamaLike>().unwrap_err().to_string();
    assert!(
        err.contains("num_attention_heads") && err.contains("config.json"),
        "{err}"
    );
    assert_eq!(c.eos_token_id.as_ref().unwrap().to_vec(), vec![2]);
    let err = c
        .require_usize("intermediate_size")
        .unwrap_err()
        .to_string();
    assert!(err.contains("intermediate_size"), "{err}");
    // `-1` (older configs' "no such token") is no id; an id past 32 bits names its field.
    std::fs::write(&p, r#"{"pad_token_id": -1, "eos_token_id": [2, -1]}"#).unwrap();
    let e = zoo_hub::PretrainedConfig::from_file(&p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("eos_token_id") && e.contains("-1"), "{e}");
    std::fs::write(&p, r#"{"pad_token_id": -1, "bos_token_id": null}"#).unwrap();
    let c = zoo_hub::PretrainedConfig::from_file(&p).unwrap();
    assert!(c.pad_token_id.is_none() && c.bos_token_id.is_none());
    std::fs::write(&p, r#"{"eos_token_id": 1099511627776}"#).unwrap();
    let e = zoo_hub::PretrainedConfig::from_file(&p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("eos_token_id") && e.contains("token id"), "{e}");
}

#[test]
fn tokenizer_config_special_tokens_and_chat_template() {
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[("w", StDtype::F32, vec![1], f32_bytes(&[0.0]))],
    );
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>","add_bos_token":true,"model_max_length":1e30}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages }}").unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        r#"{"version":"1.0","model":{"type":"BPE"}}"#,
    )
    .unwrap();
    let model = Pretrained::open(dir.path().to_str().unwrap()).unwrap();
    let tc = model.tokenizer_config().unwrap().unwrap();
    assert_eq!(tc.bos_token.as_ref().unwrap().content(), "<s>");
    assert_eq!(tc.eos_token.as_ref().unwrap().content(), "</s>");
    assert_eq!(tc.add_bos_token, Some(true));
    assert_eq!(tc.template(None), Some("{{ messages }}"));
    assert_eq!(
        model.tokenizer_json().unwrap().unwrap()["model"]["type"],
        "BPE"
    );

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template":[{"name":"default","template":"A"},{"name":"tool_use","template":"B"}]}"#,
    )
    .unwrap();
    let tc = model.tokenizer_config().unwrap().unwrap();
    assert_eq!(tc.template(None), Some("A"));
    assert_eq!(tc.template(Some("tool_use")), Some("B"));
}

#[test]
fn diffusers_layout_with_components_and_variants() {
    let cache = tempfile::tempdir().unwrap();
    let st = tiny_safetensors();
    write_cache_repo(
        cache.path(),
        "org/pipe",
        "main",
        COMMIT,
        &[
            (
                "model_index.json",
                br#"{"_class_name":"StableDiffusionPipeline","_diffusers_version":"0.31.0","unet":["diffusers","UNet2DConditionModel"],"vae":["diffusers","AutoencoderKL"],"text_encoder":["transformers","CLIPTextModel"],"safety_checker":[null,null],"requires_safety_checker":false}"#.to_vec(),
            ),
            ("unet/config.json", br#"{"_class_name":"UNet2DConditionModel","in_channels":4}"#.to_vec()),
            ("unet/diffusion_pytorch_model.safetensors", st.clone()),
            ("unet/diffusion_pytorch_model.fp16.safetensors", st.clone()),
            ("vae/config.json", br#"{"_class_name":"AutoencoderKL"}"#.to_vec()),
            ("vae/diffusion_pytorch_model.fp16.safetensors", st.clone()),
            ("text_encoder/config.json", br#"{"architectures":["CLIPTextModel"]}"#.to_vec()),
            ("text_encoder/model.fp16.safetensors", st),
        ],
    );
    let files = ModelFiles::new(Source::parse("org/pipe").unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(false);
    let pipe = Pretrained::from_files(files);
    let index = pipe.model_index().unwrap().unwrap();
    assert_eq!(index.class_name, "StableDiffusionPipeline");
    assert_eq!(index.components.len(), 3);
    assert_eq!(index.components["unet"].1, "UNet2DConditionModel");

    let unet = pipe.component("unet").unwrap();
    assert_eq!(unet.config().unwrap().get("in_channels").unwrap(), 4);
    let plain = unet.checkpoint().unwrap();
    assert!(plain.files[0].ends_with("unet/diffusion_pytorch_model.safetensors"));
    let fp16 = pipe
        .clone()
        .with_variant(Some("fp16"))
        .unwrap()
        .component("unet")
        .unwrap()
        .checkpoint()
        .unwrap();
    assert!(fp16.files[0].ends_with("unet/diffusion_pytorch_model.fp16.safetensors"));
    let te = pipe
        .clone()
        .with_variant(Some("fp16"))
        .unwrap()
        .component("text_encoder")
        .unwrap()
        .checkpoint()
        .unwrap();
    assert!(te.files[0].ends_with("text_encoder/model.fp16.safetensors"));
    // The vae only ships fp16: without the variant the error says so.
    let err = pipe
        .component("vae")
        .unwrap()
        .checkpoint()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("vae/diffusion_pytorch_model.safetensors"),
        "{err}"
    );
    // Names that would leave the folder are refused.
    for bad in ["..", "../unet", "a/b", ""] {
        let e = pipe.component(bad).unwrap_err().to_string();
        assert!(e.contains("component"), "{bad:?}: {e}");
        let e = pipe
            .clone()
            .with_variant(Some(bad))
            .unwrap_err()
            .to_string();
        assert!(e.contains("variant"), "{bad:?}: {e}");
    }
}
