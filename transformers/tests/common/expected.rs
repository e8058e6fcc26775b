//! What the real-model tests share: recorded transformers logits slices (`nightly/reference/
//! *_expected.py`) checked against a zoo model's, prompt forward and cached decode.

use serde_json::Value;
use zoo_runtime::{DType, Tensor};
use zoo_transformers::{ForwardArgs, LogitsFor, TextGenerator};

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// One row of logits against a recorded `{"ids", "values"}` top list: the values at those
/// ids agree within `atol`, and the best id is transformers' unless its lead is within it;
/// returns the largest difference.
pub fn row_matches(row: &[f32], top: &Value, atol: f32, what: &str) -> f32 {
    let ids = ids(&top["ids"]);
    let values = floats(&top["values"]);
    let mut worst = 0f32;
    for (&id, &v) in ids.iter().zip(&values) {
        worst = worst.max((row[id as usize] - v).abs());
    }
    let best = (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32;
    assert!(
        best == ids[0] || values[0] - values[1] < 2.0 * atol,
        "{what}: best id {best}, transformers' {}",
        ids[0]
    );
    worst
}

/// The prompt's logits (one uncached forward) and the raw logits of the cached greedy steps
/// (fed transformers' own tokens `expected[greedy]["ids"]`), against `expected`'s
/// `prompt_logits` and `step_logits`, each best id transformers' unless its lead is within
/// `atol`; returns the largest differences (prompt, steps).
pub fn logits_match_transformers(
    model: &TextGenerator,
    expected: &Value,
    greedy: &str,
    atol: f32,
) -> (f32, f32) {
    let device = model.load_report().device;
    let prompt: Vec<i64> = ids(&expected["prompt_ids"])
        .iter()
        .map(|&i| i as i64)
        .collect();
    let t = prompt.len();
    let steps = ids(&expected[greedy]["ids"]);
    let lm = model.model();
    let mut cache = lm.model().new_cache(1, t + steps.len()).unwrap();
    let input = Tensor::from_vec(prompt.clone(), &[1, t], &device).unwrap();
    let positions = Tensor::from_vec((0..t as i64).collect::<Vec<_>>(), &[1, t], &device).unwrap();
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: None,
        output_hidden_states: false,
        inputs_embeds: None,
    };
    let (logits, _) = lm.forward(args, &mut cache, LogitsFor::All).unwrap();
    let vocab = logits.shape()[2];
    let all = logits
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let slices = &expected["prompt_logits"];
    let probe_ids = ids(&slices["probe_ids"]);
    let mut worst = 0f32;
    for (p, row) in all.chunks(vocab).enumerate() {
        let what = format!("prompt position {p}");
        worst = worst.max(row_matches(row, &slices["top"][p], atol, &what));
        for (&id, &v) in probe_ids.iter().zip(&floats(&slices["probe"][p])) {
            worst = worst.max((row[id as usize] - v).abs());
        }
    }
    // Cached decode from the same cache; step 0's logits are the prompt's last row.
    let mut step_worst = 0f32;
    let mut row = all[all.len() - vocab..].to_vec();
    for (i, top) in expected["step_logits"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        if i > 0 {
            let input = Tensor::from_vec(vec![i64::from(steps[i - 1])], &[1, 1], &device).unwrap();
            let position = Tensor::from_vec(vec![(t + i - 1) as i64], &[1, 1], &device).unwrap();
            let args = ForwardArgs {
                input_ids: &input,
                position_ids: &position,
                attention_mask: None,
                output_hidden_states: false,
                inputs_embeds: None,
            };
            let (last, _) = lm.forward(args, &mut cache, LogitsFor::Last).unwrap();
            row = last.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        }
        let what = format!("decode step {i}");
        step_worst = step_worst.max(row_matches(&row, top, atol, &what));
    }
    (worst, step_worst)
}
