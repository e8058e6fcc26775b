//! The public API on a tiny real checkpoint (the `llama-gqa-f32` fixture plus a byte-level
//! tokenizer): dispatch, bad input as typed errors, batches, sampling, stop strings, streaming
//! and chat templates.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use zoo_runtime::device_map::{parse_max_memory, DeviceMap};
use zoo_transformers::{
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, ChatTemplate,
    EncoderArgs, Error, GenerationOptions, Message, StopReason, Tokenizer,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(name)
}

/// GPT-2's byte → printable character map, so every byte is one token of a byte-level BPE.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

/// A byte-level tokenizer.json with one token per byte (id = byte value), no merges.
fn byte_tokenizer() -> Value {
    let vocab: serde_json::Map<String, Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}
    })
}

/// The fixture's checkpoint in a temp folder with a tokenizer and a chat template, after
/// `edit` has changed its config.
fn model_dir(edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    fixture_dir("llama-gqa-f32", edit)
}

/// [`model_dir`] over any fixture (its vocabulary must have at least 256 ids).
fn fixture_dir(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture(name);
    for f in ["model.safetensors", "generation_config.json"] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        serde_json::to_vec(&byte_tokenizer()).unwrap(),
    )
    .unwrap();
    let tc = json!({
        "bos_token": "<s>", "eos_token": "</s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] | trim }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    });
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::to_vec(&tc).unwrap(),
    )
    .unwrap();
    dir
}

fn load(dir: &Path) -> zoo_transformers::Result<zoo_transformers::TextGenerator> {
    AutoModelForCausalLM::load_pretrained(dir.to_str().unwrap(), DeviceMap::Cpu)
}

#[test]
fn dispatch_by_architecture_then_model_type_and_unsupported_lists_supported() {
    let c =
        AutoConfig::from_pretrained(fixture("qwen3-qknorm-tied-f32").to_str().unwrap()).unwrap();
    assert_eq!(
        (c.family.model_type, c.architecture.as_str()),
        ("qwen3", "Qwen3ForCausalLM")
    );
    let dir = model_dir(|c| {
        c["architectures"] = json!([]);
        c["model_type"] = json!("mistral");
    });
    let c = AutoConfig::from_pretrained(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(c.architecture, "MistralForCausalLM");
    let dir = model_dir(|c| {
        c["architectures"] = json!(["MambaForCausalLM"]);
        c["model_type"] = json!("mamba");
    });
    let err = load(dir.path()).err().expect("mamba is refused");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::UnsupportedArchitecture { .. }),
        "{msg}"
    );
    // The list comes from the registry: every family, every class.
    assert!(
        msg.contains("MambaForCausalLM")
            && msg.contains("Qwen3ForCausalLM")
            && msg.contains("T5EncoderModel")
            && msg.contains("GPT2LMHeadModel")
            && msg.contains("BertForTokenClassification")
            && msg.contains("mistral")
            && msg.contains("bert"),
        "{msg}"
    );
}

#[test]
fn gpt2_generates_and_bert_loads_every_head_through_the_registry() {
    let dir = fixture_dir("gpt2-base-f32", |_| {});
    let m = load(dir.path()).unwrap();
    assert_eq!(m.config().family.model_type, "gpt2");
    assert!(m.model().tied());
    let out = m
        .generate(&["hi"], &GenerationOptions::greedy(5))
        .unwrap()
        .remove(0);
    assert_eq!(out.token_ids.len(), 5);
    // Learned positions end at n_positions (64): a longer prompt is refused.
    let err = m
        .generate_ids(&[vec![5u32; 65]], &GenerationOptions::greedy(1), |_| true)
        .expect_err("past n_positions");
    assert!(err.to_string().contains("max_position_embeddings"), "{err}");

    let bert = fixture("bert-base-f32");
    let p = bert.to_str().unwrap();
    let base = AutoModel::load_pretrained(p, DeviceMap::Cpu).unwrap();
    let enc = base.as_encoder().expect("bert is an encoder");
    assert_eq!(enc.hidden_state_modules()[2], "encoder.layer.1");
    let err = AutoModelForCausalLM::load_pretrained(p, DeviceMap::Cpu)
        .err()
        .expect("an encoder cannot generate");
    assert!(
        matches!(err, Error::WrongKind { .. }) && err.to_string().contains("zoo embed"),
        "{err}"
    );
    // A base checkpoint has no head: the refusal names the class it is and the one asked.
    let err = AutoModelForSequenceClassification::load_pretrained(p, DeviceMap::Cpu)
        .expect_err("no classifier in a BertModel checkpoint");
    assert!(
        err.to_string().contains("BertModel")
            && err.to_string().contains("ForSequenceClassification"),
        "{err}"
    );
    let ids = zoo_runtime::Tensor::from_vec(vec![1i64, 2, 3], &[1, 3], &enc.device()).unwrap();
    let args = EncoderArgs {
        input_ids: &ids,
        attention_mask: None,
        token_type_ids: None,
        position_ids: None,
        output_hidden_states: true,
    };
    let out = enc.forward(args).unwrap();
    assert_eq!(out.last_hidden_state.shape(), [1, 3, 32]);
    assert_eq!(out.pooler_output.unwrap().shape(), [1, 32]);
    assert_eq!(out.hidden_states.len(), 3);
    let bad = zoo_runtime::Tensor::from_vec(vec![1i64, 200], &[1, 2], &enc.device()).unwrap();
    let err = enc
        .forward(EncoderArgs {
            input_ids: &bad,
            ..args
        })
        .unwrap_err();
    assert!(err.to_string().contains("200"), "{err}");
}

#[test]
fn decoders_classify_at_the_last_non_padding_token_and_need_a_pad_id_for_batches() {
    use zoo_transformers::kinds::EncoderHead;
    let dir = fixture_dir("llama-seqcls-f32", |_| {});
    let p = dir.path().to_str().unwrap();
    let m = AutoModelForSequenceClassification::load_pretrained(p, DeviceMap::Cpu).unwrap();
    assert!(
        matches!(m.head(), EncoderHead::SequenceClassification { labels } if labels.len() == 3),
        "{:?}",
        m.head()
    );
    let logits = |m: &dyn zoo_transformers::kinds::Encoder, ids: Vec<i64>, rows: usize| {
        let ids =
            zoo_runtime::Tensor::from_vec(ids.clone(), &[rows, ids.len() / rows], &m.device())
                .unwrap();
        m.forward(EncoderArgs {
            input_ids: &ids,
            attention_mask: None,
            token_type_ids: None,
            position_ids: None,
            output_hidden_states: false,
        })
        .map(|o| o.logits.unwrap().to_vec::<f32>().unwrap())
    };
    // A row ending in padding (pad_token_id 0) is read at its last real token: the same
    // scores as the row cut there.
    let padded = logits(m.as_ref(), vec![5, 6, 7, 0, 0], 1).unwrap();
    let cut = logits(m.as_ref(), vec![5, 6, 7], 1).unwrap();
    for (a, b) in padded.iter().zip(&cut) {
        assert!((a - b).abs() < 1e-5, "{padded:?} vs {cut:?}");
    }
    // Without a pad id a batch cannot say where its rows end: refused, one row is not.
    let dir = fixture_dir("llama-seqcls-f32", |c| {
        c.as_object_mut().unwrap().remove("pad_token_id");
    });
    let p = dir.path().to_str().unwrap();
    let m = AutoModelForSequenceClassification::load_pretrained(p, DeviceMap::Cpu).unwrap();
    let err = logits(m.as_ref(), vec![5, 6, 7, 8], 2).unwrap_err();
    assert!(err.to_string().contains("pad_token_id"), "{err}");
    assert_eq!(logits(m.as_ref(), vec![5, 6, 7], 1).unwrap(), cut);
}

#[test]
fn mixture_of_experts_generate_chat_and_refuse_a_mismatched_expert_count() {
    // Generation and chat go through the same CausalLm path as every decoder.
    let dir = fixture_dir("qwen2moe-shared-f32", |_| {});
    let m = load(dir.path()).unwrap();
    assert_eq!(m.config().family.model_type, "qwen2_moe");
    let prompt = m
        .apply_chat_template(&[Message::new("user", "hi")])
        .unwrap();
    assert_eq!(prompt, "<s>[user] hi\n[assistant] ");
    let out = m
        .generate(&[prompt.as_str()], &GenerationOptions::greedy(4))
        .unwrap()
        .remove(0);
    assert_eq!(out.token_ids.len(), 4);

    // Per-expert checkpoint (4 experts) under a config that says 2: refused, not truncated.
    let fewer = fixture_dir("mixtral-top2-f32", |c| c["num_local_experts"] = json!(2));
    let msg = load(fewer.path()).err().expect("extra experts").to_string();
    assert!(
        msg.contains("model.layers.0.block_sparse_moe.gate.weight")
            && msg.contains("[2, 32]")
            && msg.contains("[4, 32]"),
        "{msg}"
    );
    // ... and one that says 6: the first missing expert is named.
    let more = fixture_dir("mixtral-top2-f32", |c| c["num_local_experts"] = json!(6));
    let msg = load(more.path())
        .err()
        .expect("missing experts")
        .to_string();
    assert!(
        msg.contains("block_sparse_moe.gate.weight") && msg.contains("[6, 32]"),
        "{msg}"
    );
    // Fused checkpoint (8 experts) under a config that says 4.
    let fused = fixture_dir("mixtral-top1-swa-fused-f32", |c| {
        c["num_local_experts"] = json!(4)
    });
    let msg = load(fused.path()).err().expect("fused count").to_string();
    assert!(
        msg.contains("mlp.gate.weight") && msg.contains("[8, 32]"),
        "{msg}"
    );
    // Impossible routings name the field.
    let zero = fixture_dir("qwen3moe-norm-f32", |c| c["num_experts_per_tok"] = json!(0));
    let msg = load(zero.path()).err().expect("top-0").to_string();
    assert!(
        msg.contains("num_experts_per_tok") && msg.contains("config.json"),
        "{msg}"
    );
    let step = fixture_dir("qwen2moe-shared-f32", |c| {
        c["decoder_sparse_step"] = json!(0)
    });
    let msg = load(step.path()).err().expect("step 0").to_string();
    assert!(msg.contains("decoder_sparse_step"), "{msg}");
}

#[test]
fn a_multimodal_gemma3_checkpoint_is_refused_naming_its_text_model() {
    let dir = fixture_dir("gemma3-pattern-f32", |c| {
        let text = c.clone();
        *c = json!({
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": text,
            "vision_config": {"model_type": "siglip_vision_model"},
        });
    });
    let err = load(dir.path()).err().expect("multimodal");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::UnsupportedArchitecture { .. })
            && msg.contains("Gemma3ForConditionalGeneration")
            && msg.contains("`gemma3_text`"),
        "{msg}"
    );
    // A soft-cap of zero would divide by zero: refused naming the field.
    let cap = fixture_dir("gemma2-softcap-swa-f32", |c| {
        c["attn_logit_softcapping"] = json!(0)
    });
    let msg = load(cap.path()).err().expect("cap 0").to_string();
    assert!(msg.contains("attn_logit_softcapping"), "{msg}");
}

#[test]
fn clip_text_models_load_by_their_architecture_and_refuse_long_inputs() {
    let p = fixture("clip-text-proj-f32");
    let m = AutoModel::load_pretrained(p.to_str().unwrap(), DeviceMap::Cpu).unwrap();
    let enc = m.as_encoder().expect("CLIP's text model is an encoder");
    assert!(enc.projects());
    assert_eq!(enc.hidden_state_modules()[1], "text_model.encoder.layers.0");
    let ids = zoo_runtime::Tensor::from_vec(vec![126i64, 5, 127], &[1, 3], &enc.device()).unwrap();
    let args = EncoderArgs {
        input_ids: &ids,
        attention_mask: None,
        token_type_ids: None,
        position_ids: None,
        output_hidden_states: false,
    };
    let out = enc.forward(args).unwrap();
    assert_eq!(out.embeds.unwrap().shape(), [1, 24]);
    // The bare text model (transformers 5 layout, weights at the root) pools and projects nothing.
    let p = fixture("clip-text-f32");
    let m = AutoModel::load_pretrained(p.to_str().unwrap(), DeviceMap::Cpu).unwrap();
    let enc = m.as_encoder().unwrap();
    assert!(!enc.projects());
    assert_eq!(enc.hidden_state_modules()[1], "encoder.layers.0");
    let out = enc.forward(args).unwrap();
    assert_eq!(out.pooler_output.unwrap().shape(), [1, 32]);
    // 17 tokens past max_position_embeddings (16): refused, naming the limit.
    let long = zoo_runtime::Tensor::from_vec(vec![5i64; 17], &[1, 17], &enc.device()).unwrap();
    let err = enc
        .forward(EncoderArgs {
            input_ids: &long,
            ..args
        })
        .unwrap_err();
    assert!(err.to_string().contains("max_position_embeddings"), "{err}");
}

#[test]
fn a_bert_checkpoint_missing_or_misshaping_a_tensor_names_it() {
    let more = fixture_dir("bert-base-f32", |c| c["num_hidden_layers"] = json!(3));
    let err = AutoModel::load_pretrained(more.path().to_str().unwrap(), DeviceMap::Cpu)
        .expect_err("layer 2 is missing");
    // Refused from the count, before any layer is built: the error names the field and the
    // layers the checkpoint holds.
    let err = err.to_string();
    assert!(
        err.contains("num_hidden_layers") && err.contains("encoder.layer.1"),
        "{err}"
    );
    let wide = fixture_dir("bert-base-f32", |c| c["intermediate_size"] = json!(48));
    let msg = AutoModel::load_pretrained(wide.path().to_str().unwrap(), DeviceMap::Cpu)
        .expect_err("wrong MLP width")
        .to_string();
    assert!(
        msg.contains("encoder.layer.0.intermediate.dense.weight")
            && msg.contains("[48, 32]")
            && msg.contains("[64, 32]"),
        "{msg}"
    );
}

#[test]
fn config_and_weight_errors_name_the_field_and_tensor() {
    let dir = model_dir(|c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    let msg = load(dir.path()).err().expect("missing field").to_string();
    assert!(
        msg.contains("hidden_size") && msg.contains("config.json"),
        "{msg}"
    );

    let dir = model_dir(|c| c["intermediate_size"] = json!(48));
    let msg = load(dir.path()).err().expect("wrong shape").to_string();
    assert!(
        msg.contains("model.layers.0.mlp.gate_proj.weight")
            && msg.contains("[48, 32]")
            && msg.contains("[64, 32]"),
        "{msg}"
    );

    let dir = model_dir(|c| c["num_key_value_heads"] = json!(3));
    let msg = load(dir.path())
        .err()
        .expect("heads not divisible")
        .to_string();
    assert!(msg.contains("num_key_value_heads"), "{msg}");
}

#[test]
fn device_maps_and_memory_limits() {
    let dir = model_dir(|_| {});
    let p = dir.path().to_str().unwrap();
    // No TPU on this host (tests/pjrt.rs checks the search report that comes with it).
    let err = AutoModelForCausalLM::load_pretrained(p, DeviceMap::Tpu)
        .err()
        .expect("no TPU here");
    assert!(matches!(err, Error::DeviceUnavailable { .. }), "{err}");
    let m = AutoModelForCausalLM::load_pretrained(p, DeviceMap::Auto).unwrap();
    assert!(m
        .load_report()
        .note
        .as_deref()
        .unwrap_or("")
        .contains("cpu"));
    let err = AutoModelForCausalLM::builder(p)
        .max_memory(parse_max_memory("cpu=1KiB").unwrap())
        .load()
        .err()
        .expect("1 KiB is too small");
    assert!(err.to_string().contains("max_memory"), "{err}");
    let base = AutoModel::load_pretrained(p, DeviceMap::Cpu).unwrap();
    // The embeddings, then both layers.
    let decoder = base.as_decoder().expect("llama is a decoder");
    assert_eq!(decoder.hidden_state_modules().len(), 3);
}

#[test]
fn bad_prompts_are_typed_errors() {
    let dir = model_dir(|_| {});
    let m = load(dir.path()).unwrap();
    let opts = GenerationOptions::greedy(4);
    // Each names the field at fault and is the caller's to fix (a server's 400).
    let field = |r: Result<_, Error>| match r {
        Err(e @ Error::InvalidInput { field, .. }) => {
            assert!(e.is_caller_error());
            field
        }
        other => panic!("expected an invalid input, got {:?}", other.err()),
    };
    assert_eq!(field(m.generate(&[""], &opts).map(drop)), "prompt");
    assert_eq!(
        field(m.generate_ids(&[vec![]], &opts, |_| true).map(drop)),
        "prompt"
    );
    assert_eq!(
        field(m.generate_ids(&[], &opts, |_| true).map(drop)),
        "prompts"
    );
    let long = vec![5u32; 65];
    let err = m
        .generate_ids(&[long], &opts, |_| true)
        .expect_err("65 > 64 positions");
    assert!(err.to_string().contains("max_position_embeddings"), "{err}");
    assert!(matches!(
        err,
        Error::InvalidInput {
            field: "prompt",
            ..
        }
    ));
    let err = m
        .generate_ids(&[vec![999]], &opts, |_| true)
        .expect_err("id outside vocab");
    assert!(err.to_string().contains("999"), "{err}");
    assert!(err.is_caller_error());
    let bad = GenerationOptions {
        top_p: Some(0.0),
        ..opts
    };
    assert_eq!(field(m.generate(&["abc"], &bad).map(drop)), "top_p");
}

#[test]
fn left_padded_batch_equals_each_prompt_alone() {
    let dir = model_dir(|_| {});
    let m = load(dir.path()).unwrap();
    let opts = GenerationOptions {
        min_new_tokens: 12,
        ..GenerationOptions::greedy(12)
    };
    let prompts = vec![vec![1u32, 40, 41, 42, 43, 44, 45], vec![1, 90, 91]];
    let (batch, _) = m.generate_ids(&prompts, &opts, |_| true).unwrap();
    for (p, b) in prompts.iter().zip(&batch) {
        let (single, _) = m
            .generate_ids(std::slice::from_ref(p), &opts, |_| true)
            .unwrap();
        assert_eq!(single[0].token_ids, b.token_ids);
        assert_eq!(b.token_ids.len(), 12);
    }
}

#[test]
fn sampling_is_seeded_and_eos_and_stop_strings_end_rows() {
    let dir = model_dir(|_| {});
    let m = load(dir.path()).unwrap();
    let sample = |seed| {
        let o = GenerationOptions {
            do_sample: true,
            temperature: 1.5,
            top_k: Some(50),
            top_p: Some(0.95),
            min_p: Some(0.01),
            repetition_penalty: Some(1.2),
            min_new_tokens: 16,
            seed,
            ..GenerationOptions::greedy(16)
        };
        m.generate_ids(&[vec![1, 7, 8, 9]], &o, |_| true)
            .unwrap()
            .0
            .remove(0)
            .token_ids
    };
    assert_eq!(sample(3), sample(3));
    assert_ne!(sample(3), sample(4));

    // A stop string that never comes: the row runs to max_new_tokens.
    let o = GenerationOptions {
        stop_strings: vec!["never-generated \u{10FFFF}".into()],
        ..GenerationOptions::greedy(10)
    };
    let out = m.generate(&["abc"], &o).unwrap().remove(0);
    assert!(
        matches!(out.stop_reason, StopReason::Length | StopReason::Eos),
        "{:?}",
        out.stop_reason
    );
    // One that comes: cut right after it.
    let free = m
        .generate(
            &["abc"],
            &GenerationOptions {
                min_new_tokens: 10,
                ..GenerationOptions::greedy(10)
            },
        )
        .unwrap()
        .remove(0);
    let text = free.text.unwrap();
    let stop: String = text
        .chars()
        .filter(|&c| c != '\u{FFFD}' && !c.is_control())
        .take(1)
        .collect();
    assert!(
        !stop.is_empty(),
        "the greedy text {text:?} has a printable character to stop on"
    );
    let o = GenerationOptions {
        stop_strings: vec![stop.clone()],
        min_new_tokens: 10,
        ..GenerationOptions::greedy(10)
    };
    let out = m.generate(&["abc"], &o).unwrap().remove(0);
    assert_eq!(out.stop_reason, StopReason::StopString);
    let cut = out.text.unwrap();
    assert!(
        cut.ends_with(&stop) && text.starts_with(&cut),
        "{cut:?} vs {text:?}"
    );
    // With every id an eos id, the first token ends the row.
    let o = GenerationOptions {
        eos_token_ids: Some((0..256).collect()),
        ..GenerationOptions::greedy(10)
    };
    let out = m
        .generate_ids(&[vec![1, 5]], &o, |_| true)
        .unwrap()
        .0
        .remove(0);
    assert_eq!((out.token_ids.len(), out.stop_reason), (1, StopReason::Eos));
}

#[test]
fn streaming_holds_back_incomplete_utf8() {
    let t = Tokenizer::from_json(&byte_tokenizer()).unwrap();
    let text = "aé日🙂";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    let mut s = t.stream(true);
    let pieces: Vec<String> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
    assert_eq!(pieces.concat() + &s.finish().unwrap(), text);
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces[1], "", "first byte of é is held back");
    assert_eq!(pieces[2], "é");
}

#[test]
fn chat_templates_render_like_apply_chat_template() {
    let dir = model_dir(|_| {});
    let m = load(dir.path()).unwrap();
    let msgs = [
        Message::new("system", "  Be brief. "),
        Message::new("user", "Hi?"),
    ];
    assert_eq!(
        m.apply_chat_template(&msgs).unwrap(),
        "<s>[system] Be brief.\n[user] Hi?\n[assistant] "
    );

    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}\
         {% for m in messages %}{{ m | tojson }}{{ m.content.strip().upper() }}{% endfor %}{{ eos_token }}",
        Some("<s>"),
        Some("</s>"),
    )
    .unwrap();
    let out = t.apply(&[Message::new("user", " a\"b ")], false).unwrap();
    assert_eq!(out, r#"{"role":"user","content":" a\"b "}A"B</s>"#);
    let err = t
        .apply(&[Message::new("assistant", "x")], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("first message must be from the user"), "{err}");
    assert!(matches!(
        ChatTemplate::new("{% for %}", None, None),
        Err(Error::ChatTemplate(_))
    ));
    assert!(t.apply(&[], true).is_err());
}

/// A template is user input: a runaway loop is an error within the renderer's fuel, while a
/// long real conversation (a ChatML-style template over 500 messages) still renders.
#[test]
fn chat_templates_have_a_work_budget() {
    let runaway = ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ strftime_now('%Y') }}{% endfor %}{% endfor %}",
        None,
        None,
    )
    .unwrap();
    let start = std::time::Instant::now();
    let err = runaway
        .apply(&[Message::new("user", "hi")], false)
        .unwrap_err();
    assert!(matches!(err, Error::ChatTemplate(_)), "{err}");
    assert!(
        start.elapsed().as_secs() < 30,
        "the budget did not stop the loop"
    );
    let chatml = ChatTemplate::new(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        None,
        None,
    )
    .unwrap();
    let long: Vec<Message> = (0..500)
        .map(|i| {
            Message::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                "Tell me more.",
            )
        })
        .collect();
    let out = chatml.apply(&long, true).unwrap();
    assert_eq!(out.matches("<|im_start|>").count(), 501);
}

/// A template can nest a value one level deeper per instruction (a namespace attribute
/// wrapped in a loop): printed, serialized, compared, hashed and dropped at the deepest its
/// work budget allows, it renders on any thread, even one with a small stack; layouts whose
/// indentation would explode and prompts past 64 MiB are errors.
#[test]
fn chat_template_values_nest_as_deep_as_the_budget_allows_without_overflowing_the_stack() {
    let wrap = |name: &str| format!("{}ns.{name}{}", "[".repeat(60), "]".repeat(60));
    let nest = |n: usize, names: &[&str], tail: &str| {
        let sets: String = names
            .iter()
            .map(|v| format!("{{% set ns.{v} = {} %}}", wrap(v)))
            .collect();
        format!(
            "{{% set ns = namespace(x=[], y=[]) %}}{{% for i in range({n}) %}}{sets}{{% endfor %}}{tail}"
        )
    };
    let render = |source: String| {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                ChatTemplate::new(&source, None, None)?.apply(&[Message::new("user", "hi")], false)
            })
            .unwrap()
            .join()
            .expect("the render panicked")
    };
    // 740 rounds of 60 levels: 44 400 levels, close to what one message's budget builds.
    let depth = 740 * 60;
    let out = render(nest(
        740,
        &["x"],
        "{{ ns.x }}|{{ ns.x | tojson | length }}|{{ (ns.x ~ '') | length }}|{{ {ns.x: 1} | length }}",
    ))
    .unwrap();
    let printed = format!("{}{}", "[".repeat(depth + 1), "]".repeat(depth + 1));
    assert_eq!(
        out,
        format!("{printed}|{}|{}|1", printed.len(), printed.len())
    );
    let out = render(nest(
        370,
        &["x", "y"],
        "{{ ns.x == ns.y }} {{ ns.x < ns.y }} {{ [ns.x, ns.y] | unique | length }}",
    ))
    .unwrap();
    assert_eq!(out, "True False 1");
    // Past the budget the loop stops, and the nested value is dropped on the way out.
    let err = render(nest(100_000, &["x"], "")).unwrap_err();
    assert!(err.to_string().contains("fuel"), "{err}");

    // 12 000 levels: pprint would take hours, an indented tojson would write 144 MB; a value
    // doubled 40 times would expand to 2^40 items.
    for tail in [
        "{{ ns.x | pprint }}",
        "{{ ns.x | tojson(indent=2) }}",
        "{{ 1 | tojson(indent=100000) }}",
    ] {
        let err = render(nest(200, &["x"], tail)).unwrap_err();
        assert!(matches!(err, Error::ChatTemplate(_)), "{err}");
    }
    let doubled = "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}";
    for tail in ["{{ ns.x | tojson }}", "{{ ns.x }}"] {
        let err = render(format!("{doubled}{tail}")).unwrap_err().to_string();
        assert!(err.contains("64 MiB"), "{err}");
    }
    // Ordinary layouts are untouched.
    let out = render(
        "{{ {'a': [1, {'b': none}]} | tojson(indent=2) }}|{{ [1, 2] | tojson }}|{{ 'x' | pprint }}"
            .into(),
    )
    .unwrap();
    assert_eq!(
        out,
        "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}|[1,2]|\"x\""
    );
}

/// A namespace stored where it can reach itself makes a cycle that printing or hashing
/// follows without end, so a template may use its namespaces only through their attributes
/// (as real templates do); every way of storing one is refused at compile time.
#[test]
fn chat_templates_keep_namespaces_out_of_values() {
    let ns = "{% set ns = namespace(a=1) %}";
    for stores in [
        "{% set ns.x = ns %}{{ ns }}",
        "{% set ns.x = [ns] %}",
        "{% set ns.x = {'k': ns} | items | list %}",
        "{% set b = ns %}{% set ns.x = b %}",
        "{% set other = namespace(x=ns) %}",
        "{% set ns.x = namespace() %}{% set ns.x.y = ns.x %}",
        "{% macro f(a, b) %}{% set a.x = b %}{% endmacro %}{{ f(ns, ns) }}",
        "{% for n in [ns] %}{% set n.x = 1 %}{% endfor %}",
        "{% set f = namespace %}",
        "{{ {ns: 1} }}",
    ] {
        let err = ChatTemplate::new(&format!("{ns}{stores}"), None, None).unwrap_err();
        assert!(
            matches!(&err, Error::ChatTemplate(m) if m.contains("namespace")),
            "{stores}: {err}"
        );
    }
    let err = ChatTemplate::new(&format!("{ns}\n{{% set ns.x = [ns] %}}"), None, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2: `ns` is stored"), "{err}");
    // What templates do with namespaces: flags, counters, accumulated lists, an alias, tests.
    let t = ChatTemplate::new(
        "{% set ns = namespace(found=false, msgs=[], n=0) %}{% set alias = ns %}\
         {% for m in messages %}{% set ns.msgs = ns.msgs + [m] %}{% set alias.n = alias.n + 1 %}\
         {% if ns is defined and m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}\
         {{ ns.msgs | length }} {{ ns.n }} {{ ns.found }} {{ ns['msgs'][0].content }}",
        None,
        None,
    )
    .unwrap();
    let out = t
        .apply(
            &[Message::new("system", "s"), Message::new("user", "u")],
            false,
        )
        .unwrap();
    assert_eq!(out, "2 2 True s");
}

/// A template that nests or recurses as deep as the parser and renderer allow errors (or
/// renders) on any thread, even one with a small stack (an app's worker thread), instead of
/// overflowing it.
#[test]
fn chat_template_recursion_errors_instead_of_overflowing_the_stack() {
    let deep = |open: &str, mid: &str, close: &str, n: usize| {
        format!("{}{mid}{}", open.repeat(n), close.repeat(n))
    };
    let sources = [
        "{% macro a(n) %}{{ a(n) }}{% endmacro %}{{ a(1) }}".to_string(),
        "{% macro a(n) %}{% for m in messages %}{{ a(n ~ m['role']) | upper }}{% endfor %}{% endmacro %}{{ a('x') }}".to_string(),
        "{% for m in [[[[1]]]] recursive %}{{ loop([m]) }}{% endfor %}".to_string(),
        deep("{{ (", "1", ") }}", 1).replace("(1)", &deep("(", "1", ")", 140)),
        deep("{% if true %}", "x", "{% endif %}", 149),
        deep("{% if true %}", "x", "{% endif %}", 400),
    ];
    for (i, source) in sources.into_iter().enumerate() {
        let result = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                ChatTemplate::new(&source, None, None)?.apply(&[Message::new("user", "hi")], false)
            })
            .unwrap()
            .join()
            .expect("a template overflowed a 256 KiB stack");
        // The first three recurse without end: the recursion limit must stop them.
        match result {
            Err(err) => assert!(matches!(err, Error::ChatTemplate(_)), "{err}"),
            Ok(_) => assert!(i >= 3, "template {i} recursed without end and rendered"),
        }
    }
}
