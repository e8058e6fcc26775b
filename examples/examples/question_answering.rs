//! Extractive question answering with a `*ForQuestionAnswering` checkpoint (a BERT fine-tuned
//! on SQuAD, or a decoder with transformers' `qa_outputs` head): the question and the context
//! are encoded as one pair, the head scores every context token as the answer's start and
//! end, and the best span (start before end, at most 30 tokens, as transformers'
//! question-answering pipeline searches) is printed with its score.
//!
//! cargo run -p zoo-examples --example question_answering -- path/to/bert-squad \
//!     "Where do penguins live?" "Penguins live almost only in the Southern Hemisphere."

use zoo_hub::Pretrained;
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{DType, Tensor};
use zoo_transformers::{AutoModelForQuestionAnswering, EncoderArgs, PairTruncation, Tokenizer};

/// The longest answer considered, in tokens.
const MAX_ANSWER_TOKENS: usize = 30;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(question), Some(context)) = (args.next(), args.next(), args.next())
    else {
        anyhow::bail!("usage: question_answering <model> <question> <context>");
    };
    let reader = AutoModelForQuestionAnswering::load_pretrained(&model, DeviceMap::Cpu)?;
    let tokenizer = Tokenizer::from_pretrained(&Pretrained::open(&model)?)?;
    let pair = tokenizer.encode_pair(
        &question,
        &context,
        reader.max_position_embeddings(),
        PairTruncation::OnlySecond,
    )?;
    let n = pair.ids.len();
    let device = reader.device();
    let ints =
        |v: &[u32]| Tensor::from_vec(v.iter().map(|&x| i64::from(x)).collect(), &[1, n], &device);
    let (input_ids, token_type_ids) = (ints(&pair.ids)?, ints(&pair.type_ids)?);
    let out = reader.forward(EncoderArgs {
        input_ids: &input_ids,
        attention_mask: None,
        token_type_ids: Some(&token_type_ids),
        position_ids: None,
        output_hidden_states: false,
    })?;
    let (start, end) = out.span_logits()?;
    let scores =
        |t: Tensor| -> anyhow::Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.to_vec::<f32>()?) };
    let (start, end) = (scores(start)?, scores(end)?);
    // Only the context's tokens can start or end the answer.
    let in_context: Vec<usize> = (0..n)
        .filter(|&i| pair.sequence_ids[i] == Some(1))
        .collect();
    let best = in_context
        .iter()
        .flat_map(|&s| {
            in_context
                .iter()
                .filter(move |&&e| e >= s && e - s < MAX_ANSWER_TOKENS)
                .map(move |&e| (s, e))
        })
        .max_by(|a, b| (start[a.0] + end[a.1]).total_cmp(&(start[b.0] + end[b.1])))
        .ok_or_else(|| anyhow::anyhow!("the context has no tokens"))?;
    let (from, to) = (pair.offsets[best.0].0, pair.offsets[best.1].1);
    println!(
        "{}  (score {:.3})",
        &context[from..to],
        start[best.0] + end[best.1]
    );
    Ok(())
}
