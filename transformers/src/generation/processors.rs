//! The logits processors and warpers on the host, in transformers' order (repetition
//! penalty, no-repeat n-grams, bad words, min new tokens, suppressed tokens; then, when
//! sampling, temperature, top-k, top-p, min-p, typical, epsilon and eta), with OpenAI's
//! `logit_bias` first and its presence and frequency penalties after the repetition penalty
//! (where vLLM applies them), and the pick of the next token from them. The device sampler (`device_sampler.rs`) computes the same choices as
//! tensor ops.

use zoo_runtime::Generator;

use super::options::GenerationOptions;

/// One row's sequence as the logits processors read it: `seq` holds `pads` left pads, then
/// the row's context (the prompt, or an encoder-decoder's start token) and its generated ids.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    pub seq: &'a [u32],
    pub pads: usize,
}

/// Applies the logits processors in transformers' order and picks the next token.
pub(crate) fn pick(
    scores: &mut [f32],
    row: Row<'_>,
    step: usize,
    eos: &[u32],
    o: &GenerationOptions,
    rng: &mut Generator,
) -> u32 {
    pick_with(scores, row, step, eos, o, &mut || rng.next_f64())
}

/// [`pick`] with the uniform number of a sampled pick drawn from `draw`.
pub(crate) fn pick_with(
    scores: &mut [f32],
    row: Row<'_>,
    step: usize,
    eos: &[u32],
    o: &GenerationOptions,
    draw: &mut dyn FnMut() -> f64,
) -> u32 {
    process(scores, row, step, eos, o);
    if !o.do_sample {
        return argmax(scores);
    }
    let Some((order, probs)) = warp(scores, o) else {
        return argmax(scores);
    };
    let total: f64 = probs.iter().sum();
    let mut u = draw() * total;
    for (i, p) in probs.iter().enumerate() {
        if u < *p {
            return order[i] as u32;
        }
        u -= p;
    }
    order[order.len() - 1] as u32
}

/// The processors that apply to greedy and sampled decoding alike, in transformers' order:
/// (logit bias,) repetition penalty, (presence and frequency penalties,) no-repeat n-grams,
/// bad words, min new tokens, suppressed tokens.
/// Banned tokens get -inf.
pub(crate) fn process(
    scores: &mut [f32],
    row: Row<'_>,
    step: usize,
    eos: &[u32],
    o: &GenerationOptions,
) {
    for &(id, b) in &o.logit_bias {
        if let Some(s) = scores.get_mut(id as usize) {
            *s += b;
        }
    }
    if let Some(r) = o.repetition_penalty {
        // Left pads are not the row's tokens.
        let mut uniq: Vec<u32> = row.seq[row.pads..].to_vec();
        uniq.sort_unstable();
        uniq.dedup();
        let r = r as f32;
        for id in uniq {
            if let Some(s) = scores.get_mut(id as usize) {
                *s = if *s < 0.0 { *s * r } else { *s / r };
            }
        }
    }
    if o.penalizes_output() {
        // The row's generated tokens are the last `step` of its sequence.
        let mut generated: Vec<u32> = row.seq[row.seq.len().saturating_sub(step)..].to_vec();
        generated.sort_unstable();
        for run in generated.chunk_by(|a, b| a == b) {
            if let Some(s) = scores.get_mut(run[0] as usize) {
                *s -= (o.presence_penalty + o.frequency_penalty * run.len() as f64) as f32;
            }
        }
    }
    let mut ban = |id: u32| {
        if let Some(s) = scores.get_mut(id as usize) {
            *s = f32::NEG_INFINITY;
        }
    };
    let n = o.no_repeat_ngram_size;
    if n > 0 && row.seq.len() >= n {
        // Every earlier window that starts with the sequence's last n - 1 ids would be
        // repeated by its own last id.
        let tail = &row.seq[row.seq.len() + 1 - n..];
        for w in row.seq.windows(n) {
            if w[..n - 1] == *tail {
                ban(w[n - 1]);
            }
        }
    }
    for word in &o.bad_words_ids {
        let Some((&last, prefix)) = word.split_last() else {
            continue;
        };
        // An eos token alone stays allowed, as transformers filters it out.
        if prefix.is_empty() && eos.contains(&last) {
            continue;
        }
        if row.seq.ends_with(prefix) {
            ban(last);
        }
    }
    if step < o.min_new_tokens {
        eos.iter().for_each(|&e| ban(e));
    }
    o.suppress_tokens.iter().for_each(|&t| ban(t));
    if step == 0 {
        o.begin_suppress_tokens.iter().for_each(|&t| ban(t));
    }
}

/// The sampling warpers over processed `scores`, in transformers' order (temperature, top-k,
/// top-p, min-p, typical, epsilon, eta): the candidates left, best first, and their
/// probabilities (not normalised). `None` when every token is banned.
pub(crate) fn warp(scores: &mut [f32], o: &GenerationOptions) -> Option<(Vec<usize>, Vec<f64>)> {
    if o.temperature != 1.0 {
        let t = o.temperature as f32;
        scores.iter_mut().for_each(|s| *s /= t);
    }
    // Candidates sorted by score, best first (ties keep the lower id first).
    let mut order: Vec<usize> = (0..scores.len())
        .filter(|&i| scores[i] > f32::NEG_INFINITY)
        .collect();
    if order.is_empty() {
        return None;
    }
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    if let Some(k) = o.top_k {
        order.truncate(k.max(1));
    }
    let max = scores[order[0]];
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((scores[i] - max) as f64).exp())
        .collect();
    normalise(&mut probs);
    if let Some(top_p) = o.top_p {
        // Keep tokens until the mass reaches top_p (the token that crosses it included).
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= top_p {
                keep = i + 1;
                break;
            }
        }
        order.truncate(keep);
        probs.truncate(keep);
    }
    if let Some(min_p) = o.min_p {
        let floor = probs[0] * min_p;
        let keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
        order.truncate(keep);
        probs.truncate(keep);
    }
    if let Some(mass) = o.typical_p.filter(|&m| m < 1.0) {
        normalise(&mut probs);
        let entropy = entropy(&probs);
        // How far each token's information is from the entropy; the closest first.
        let surprise: Vec<f64> = probs.iter().map(|&p| (-p.ln() - entropy).abs()).collect();
        let mut by: Vec<usize> = (0..probs.len()).collect();
        by.sort_by(|&a, &b| surprise[a].total_cmp(&surprise[b]));
        let mut acc = 0.0;
        let below = by
            .iter()
            .take_while(|&&i| {
                acc += probs[i];
                acc < mass
            })
            .count();
        let limit = surprise[by[below.min(by.len() - 1)]];
        let first = by[0];
        retain(&mut order, &mut probs, |i, _| {
            surprise[i] <= limit || i == first
        });
    }
    if let Some(eps) = o.epsilon_cutoff {
        normalise(&mut probs);
        let top = probs[0];
        retain(&mut order, &mut probs, |_, p| p >= eps || p == top);
    }
    if let Some(eps) = o.eta_cutoff {
        normalise(&mut probs);
        let entropy = entropy(&probs);
        let eta = eps.min(eps.sqrt() * (-entropy).exp());
        let top = probs[0];
        retain(&mut order, &mut probs, |_, p| p >= eta || p == top);
    }
    Some((order, probs))
}

/// The entropy (nats) of normalised `probs`.
fn entropy(probs: &[f64]) -> f64 {
    -probs
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| p * p.ln())
        .sum::<f64>()
}

fn normalise(probs: &mut [f64]) {
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
}

/// Keeps the candidates for which `keep(index, probability)` holds, in order.
fn retain(order: &mut Vec<usize>, probs: &mut Vec<f64>, keep: impl Fn(usize, f64) -> bool) {
    let kept: Vec<(usize, f64)> = order
        .iter()
        .zip(probs.iter())
        .enumerate()
        .filter(|&(i, (_, &p))| keep(i, p))
        .map(|(_, (&o, &p))| (o, p))
        .collect();
    (*order, *probs) = kept.into_iter().unzip();
}

/// Index of the largest score, the first on ties (as `torch.argmax`).
fn argmax(scores: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: &[u32]) -> Row<'_> {
        Row { seq, pads: 0 }
    }

    fn opts() -> GenerationOptions {
        GenerationOptions {
            do_sample: true,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_picks_first_max_and_min_new_tokens_blocks_eos() {
        let mut rng = Generator::new(0);
        let o = GenerationOptions {
            min_new_tokens: 2,
            ..GenerationOptions::greedy(4)
        };
        let mut s = vec![1.0, 5.0, 5.0, 0.0];
        assert_eq!(pick(&mut s, row(&[]), 0, &[3], &o, &mut rng), 1);
        let mut s = vec![1.0, 2.0, 0.0, 9.0];
        assert_eq!(
            pick(&mut s, row(&[]), 1, &[3], &o, &mut rng),
            1,
            "eos blocked before min_new_tokens"
        );
        let mut s = vec![1.0, 2.0, 0.0, 9.0];
        assert_eq!(pick(&mut s, row(&[]), 2, &[3], &o, &mut rng), 3);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut rng = Generator::new(0);
        let o = GenerationOptions {
            repetition_penalty: Some(2.0),
            ..GenerationOptions::greedy(1)
        };
        let mut s = vec![3.0, 2.0, -1.0];
        assert_eq!(pick(&mut s, row(&[0, 0, 2]), 0, &[], &o, &mut rng), 1);
        assert_eq!(s, vec![1.5, 2.0, -2.0]);
    }

    #[test]
    fn openai_penalties_count_generated_tokens_only_and_bias_adds_first() {
        let o = GenerationOptions {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(3, -1.0)],
            ..GenerationOptions::greedy(4)
        };
        // The prompt [0, 1] does not count; the row generated [1, 2, 2].
        let mut s = vec![1.0f32; 4];
        process(&mut s, row(&[0, 1, 1, 2, 2]), 3, &[], &o);
        assert_eq!(s, vec![1.0, 1.0 - 0.75, 1.0 - 1.0, 0.0]);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_and_full_min_p_are_greedy() {
        for o in [
            GenerationOptions {
                top_k: Some(1),
                ..opts()
            },
            GenerationOptions {
                top_p: Some(1e-6),
                ..opts()
            },
            GenerationOptions {
                min_p: Some(1.0),
                ..opts()
            },
        ] {
            let mut rng = Generator::new(7);
            for _ in 0..50 {
                let mut s = vec![0.5, 0.1, 0.9, 0.3];
                assert_eq!(pick(&mut s, row(&[]), 0, &[], &o, &mut rng), 2, "{o:?}");
            }
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        let o = GenerationOptions {
            temperature: 0.5,
            ..opts()
        };
        let draw = |seed| {
            let mut rng = Generator::new(seed);
            (0..2000)
                .map(|_| {
                    let mut s = vec![0.0f32, (2.0f32).ln() / 2.0, f32::NEG_INFINITY];
                    pick(&mut s, row(&[]), 0, &[], &o, &mut rng)
                })
                .collect::<Vec<_>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1), "same seed, same tokens");
        assert_ne!(a, draw(2));
        assert!(!a.contains(&2), "a -inf token is never drawn");
        // With temperature 0.5 the odds of token 1 over token 0 are e^(ln 2) = 2.
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 2.0 / 3.0).abs() < 0.04, "{ones}");
    }

    /// What transformers' own processors (the list `generate()` builds, with its defaults) make
    /// of fixed scores: the same bans and values greedy, the same candidates when sampling
    /// (written by nightly/reference/logits_processors.py).
    #[test]
    fn processors_match_transformers() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logits_processors.json"
        );
        let data: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let cases = data["cases"].as_array().unwrap();
        assert!(cases.len() >= 15);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let g: zoo_hub::GenerationConfig =
                serde_json::from_value(case["options"].clone()).unwrap();
            let o = GenerationOptions::from_generation_config(&g);
            o.validate().unwrap();
            let seq = ids(&case["seq"]);
            let row = Row {
                seq: &seq,
                pads: case["pads"].as_u64().unwrap() as usize,
            };
            let step = case["step"].as_u64().unwrap() as usize;
            let mut scores: Vec<f32> = case["scores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let want: Vec<Option<f64>> = case["processed"]
                .as_array()
                .unwrap()
                .iter()
                .map(serde_json::Value::as_f64)
                .collect();
            process(&mut scores, row, step, &ids(&case["eos"]), &o);
            if !o.do_sample {
                for (i, (&got, want)) in scores.iter().zip(&want).enumerate() {
                    match want {
                        None => assert_eq!(got, f32::NEG_INFINITY, "{name}: token {i}"),
                        Some(w) => assert_eq!(got, *w as f32, "{name}: token {i}"),
                    }
                }
                continue;
            }
            let (mut kept, _) = warp(&mut scores, &o).unwrap();
            kept.sort_unstable();
            let expected: Vec<usize> = (0..want.len()).filter(|&i| want[i].is_some()).collect();
            assert_eq!(kept, expected, "{name}: candidates");
        }
    }
}
