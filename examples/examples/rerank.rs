//! Rerank documents against a query with a cross-encoder (sentence-transformers'
//! `CrossEncoder`): an ms-marco MiniLM reranker (BERT), a bge-reranker (XLM-RoBERTa) or any
//! sequence classifier with one label scores each (query, document) pair; the scores come
//! back highest first.
//!
//! cargo run -p zoo-examples --example rerank -- path/to/ms-marco-MiniLM-L6-v2 \
//!     "How many people live in Berlin?" "Berlin has 3.5 million inhabitants." "Paris is in France."

use zoo_transformers::sentence::CrossEncoder;
use zoo_transformers::LoadOptions;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(query)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: rerank <model> <query> <document>...");
    };
    let documents: Vec<String> = args.collect();
    if documents.is_empty() {
        anyhow::bail!("give at least one document to rank");
    }
    let reranker = CrossEncoder::load_pretrained(&model, LoadOptions::default())?;
    let docs: Vec<&str> = documents.iter().map(String::as_str).collect();
    for r in reranker.rank(&query, &docs)? {
        println!("{:.4}  {}", r.score, docs[r.index]);
    }
    Ok(())
}
