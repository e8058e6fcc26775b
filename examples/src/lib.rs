//! Examples live in `examples/examples/`; run one with `cargo run -p zoo-examples --example NAME`.
