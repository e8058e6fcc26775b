//! zoo-transformers: transformer model families (filled by the model issues).
