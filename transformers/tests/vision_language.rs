//! A vision-language model from the image file on: the committed tiny LLaVA
//! (`nightly/fixtures/llava-f32`, written by `nightly/reference/llava.py` with its tokenizer,
//! chat template and CLIP image processor) renders the chat turn, reads the committed image,
//! expands its placeholder and generates greedily, on candle CPU and on one device of the XLA
//! CPU PJRT plugin, to the same prompt, prompt ids and tokens as transformers' `LlavaProcessor`
//! and `generate` (`pipeline.json`).

use std::path::{Path, PathBuf};

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::vision::open_images;
use zoo_transformers::vision_language::{expand_image_tokens, vision_of};
use zoo_transformers::{AutoModelForCausalLM, AutoModelForImageTextToText, Message};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn answers_as_transformers(map: DeviceMap) {
    let dir = root().join("nightly/fixtures/llava-f32");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pipeline.json")).unwrap()).unwrap();
    let vlm = AutoModelForImageTextToText::load_pretrained(dir.to_str().unwrap(), map).unwrap();
    let question = expected["question"].as_str().unwrap();
    let prompt = vlm
        .apply_chat_template(&[Message::new("user", question).with_images(1)])
        .unwrap();
    assert_eq!(prompt, expected["prompt"].as_str().unwrap());
    let vision = vision_of(vlm.model()).unwrap();
    // The processor adds the bos token this template does not write.
    let expanded = expand_image_tokens(&vlm.encode(&prompt, false).unwrap(), vision);
    assert_eq!(expanded, ids(&expected["input_ids"]));
    let images = open_images(&[root().join(expected["image"].as_str().unwrap())]).unwrap();
    let opts = zoo_transformers::GenerationOptions {
        max_new_tokens: expected["max_new_tokens"].as_u64().unwrap() as usize,
        ..zoo_transformers::GenerationOptions::greedy(1)
    };
    let mut streamed = String::new();
    let (out, _) = vlm
        .generate_with_images(&prompt, &images, &opts, |t| streamed.push_str(t))
        .unwrap();
    assert_eq!(out.token_ids, ids(&expected["generated_ids"]));
    assert_eq!(streamed, out.text.unwrap());
}

#[test]
fn llava_answers_about_an_image_as_transformers_on_cpu() {
    answers_as_transformers(DeviceMap::Cpu);
}

#[test]
fn llava_answers_about_an_image_as_transformers_on_the_xla_cpu_plugin() {
    std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .expect("ZOO_PJRT_CPU_PLUGIN is unset: run the tests through scripts/run-tests.sh");
    answers_as_transformers(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

/// Placeholders and images must agree, and a text-only model takes no image.
#[test]
fn mismatched_images_and_text_only_models_are_refused() {
    let dir = root().join("nightly/fixtures/llava-f32");
    let vlm = AutoModelForImageTextToText::load_pretrained(dir.to_str().unwrap(), DeviceMap::Cpu)
        .unwrap();
    let image =
        open_images(&[root().join("transformers/tests/data/image_processors/rgb.png")]).unwrap();
    let opts = zoo_transformers::GenerationOptions::greedy(2);
    // Two images, one placeholder.
    let two = [image[0].clone(), image[0].clone()];
    let prompt = vlm
        .apply_chat_template(&[Message::new("user", "what is this ?").with_images(1)])
        .unwrap();
    let err = vlm
        .generate_with_images(&prompt, &two, &opts, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("image tokens") && err.contains("2 image(s)"),
        "{err}"
    );
    // A placeholder without an image.
    let err = vlm
        .generate_with_images(&prompt, &[], &opts, |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("no image was given"), "{err}");
    // Text alone generates as any causal LM.
    let lm = AutoModelForCausalLM::load_pretrained(dir.to_str().unwrap(), DeviceMap::Cpu).unwrap();
    let prompt = lm.encode("what is this ?", false).unwrap();
    let (out, _) = lm.generate_ids(&[prompt], &opts, |_| true).unwrap();
    assert_eq!(out[0].token_ids.len(), 2);
    // A text-only checkpoint is not a vision-language model.
    let gpt2 = root().join("nightly/fixtures/gpt2-base-f32");
    let Err(err) =
        AutoModelForImageTextToText::load_pretrained(gpt2.to_str().unwrap(), DeviceMap::Cpu)
    else {
        panic!("a text-only model loaded as a vision-language one");
    };
    let err = err.to_string();
    assert!(err.contains("reads text only"), "{err}");
}
