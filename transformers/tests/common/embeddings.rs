//! What the sentence-embedding tests share: a zoo embedding against sentence-transformers'.

use zoo_transformers::sentence::cosine_similarity;

/// `got` against sentence-transformers' `want` (`what` names it): cosine within 1e-5 and
/// every value within 1e-4.
pub fn assert_embedding_matches(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: dimensions");
    let cos = cosine_similarity(got, want);
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        1.0 - cos < 1e-5 && worst < 1e-4,
        "{what}: cosine {cos}, max abs diff {worst}"
    );
}
