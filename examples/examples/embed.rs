//! Embed sentences with a sentence-transformers model (pooling and normalisation from its
//! folder) and print how similar they are: an encoder such as all-MiniLM-L6-v2, or a decoder
//! embedder such as Qwen3-Embedding (its last token pooled).
//!
//! cargo run -p zoo-examples --example embed -- path/to/all-MiniLM-L6-v2 "A cat sits." "A dog runs."

use zoo_transformers::sentence::{cosine_similarity, SentenceEmbedder};
use zoo_transformers::LoadOptions;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: embed <model> <sentence> [sentence...]"))?;
    let sentences: Vec<String> = args.collect();
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let embedder = SentenceEmbedder::load_pretrained(&model, LoadOptions::default())?;
    let embeddings = embedder.embed(&refs)?;
    for (s, e) in refs.iter().zip(&embeddings) {
        println!("{:>4} dims, first {:?}: {s}", e.len(), &e[..e.len().min(4)]);
    }
    for i in 0..embeddings.len() {
        for j in i + 1..embeddings.len() {
            let c = cosine_similarity(&embeddings[i], &embeddings[j]);
            println!("cos({i}, {j}) = {c:.4}");
        }
    }
    Ok(())
}
