//! Numbers that say how close a port's output is to the reference.
//!
//! Pure functions over flat row-major slices plus a shape, so they serve every backend:
//! the harness copies a backend's tensor to the host and calls these. Pass/fail follows
//! `torch.allclose`: `|actual - expected| <= atol + rtol * |expected|` per element.

use serde::{Deserialize, Serialize};

/// Why two tensors could not be compared at all (as opposed to compared and found apart).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricsError {
    /// Actual and expected differ in shape.
    #[error("shape mismatch: expected {expected:?}, actual {actual:?}")]
    ShapeMismatch {
        /// The reference shape.
        expected: Vec<usize>,
        /// The port's shape.
        actual: Vec<usize>,
    },
    /// A slice's length does not match the product of the shape it came with.
    #[error("{what} has {len} elements but shape {shape:?} needs {needed}")]
    LengthMismatch {
        /// Which operand.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The shape given.
        shape: Vec<usize>,
        /// The product of that shape.
        needed: usize,
    },
    /// A mask's shape is not a prefix of the compared tensor's shape.
    #[error("mask of shape {mask:?} cannot mask a tensor of shape {shape:?}: it must be a prefix of it{hint}")]
    BadMask {
        /// The mask's shape.
        mask: Vec<usize>,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Extra advice.
        hint: &'static str,
    },
}

/// Absolute and relative tolerance, as in `torch.allclose(actual, expected, rtol, atol)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance, scaled by `|expected|`.
    pub rtol: f64,
}

impl Tolerance {
    /// torch.allclose's element test. Equal values (including equal infinities) pass;
    /// any other non-finite value, NaN included, fails.
    pub fn is_close(&self, actual: f32, expected: f32) -> bool {
        if actual == expected {
            return true;
        }
        if !actual.is_finite() || !expected.is_finite() {
            return false;
        }
        let (a, e) = (f64::from(actual), f64::from(expected));
        (a - e).abs() <= self.atol + self.rtol * e.abs()
    }
}

/// Which positions of a tensor to compare: a 0/1 mask over a prefix of its dimensions
/// (e.g. `attention_mask [batch, seq]` over `logits [batch, seq, vocab]`).
#[derive(Debug, Clone, PartialEq)]
pub struct PositionMask {
    /// The mask's own shape.
    pub shape: Vec<usize>,
    /// One flag per mask element; `false` skips every tensor element beneath it.
    pub keep: Vec<bool>,
}

impl PositionMask {
    /// A mask from integer values (nonzero keeps), e.g. an attention mask.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Self {
        Self {
            shape,
            keep: values.iter().map(|v| *v != 0).collect(),
        }
    }

    /// Elements of `shape` covered by one mask element; checks the prefix rule.
    fn inner(&self, shape: &[usize]) -> Result<usize, MetricsError> {
        let prefix_ok =
            self.shape.len() <= shape.len() && shape[..self.shape.len()] == self.shape[..];
        if !prefix_ok || self.keep.len() != self.shape.iter().product::<usize>() {
            return Err(MetricsError::BadMask {
                mask: self.shape.clone(),
                shape: shape.to_vec(),
                hint: "",
            });
        }
        Ok(shape[self.shape.len()..].iter().product())
    }
}

/// Closeness of a float output to the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloseMetrics {
    /// Every compared element is within tolerance.
    pub passed: bool,
    /// Elements compared (after masking).
    pub compared: usize,
    /// Elements outside tolerance.
    pub mismatched: usize,
    /// Largest `|actual - expected|`; infinite where a NaN or unmatched infinity occurs
    /// (written as `null` in JSON).
    #[serde(with = "nonfinite")]
    pub max_abs_diff: f64,
    /// `mean |actual - expected| / mean |expected|`: the error relative to the tensor's
    /// scale, robust to expected values near zero. 0 when both are all zeros.
    #[serde(with = "nonfinite")]
    pub mean_rel_diff: f64,
    /// `100 * mismatched / compared`.
    #[serde(with = "nonfinite")]
    pub mismatch_pct: f64,
    /// Cosine similarity of the compared elements as flat vectors (1 when both are zero).
    #[serde(with = "nonfinite")]
    pub cosine: f64,
    /// Share of rows (all but the last dimension) whose argmax agrees; only for logits.
    #[serde(with = "nonfinite_opt", default)]
    pub top1_agreement: Option<f64>,
}

/// Compares a float output with the reference under `tol`, skipping masked positions.
pub fn compare_close(
    actual: &[f32],
    expected: &[f32],
    shape: &[usize],
    mask: Option<&PositionMask>,
    tol: Tolerance,
) -> Result<CloseMetrics, MetricsError> {
    check_len("actual", actual.len(), shape)?;
    check_len("expected", expected.len(), shape)?;
    let inner = match mask {
        Some(m) => m.inner(shape)?,
        None => 1,
    };
    let (mut compared, mut mismatched) = (0usize, 0usize);
    let (mut max_abs, mut sum_abs, mut sum_ref) = (0f64, 0f64, 0f64);
    let (mut dot, mut norm_a, mut norm_e) = (0f64, 0f64, 0f64);
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        if let Some(m) = mask {
            if !m.keep[i / inner] {
                continue;
            }
        }
        compared += 1;
        if !tol.is_close(a, e) {
            mismatched += 1;
        }
        let diff = if a == e {
            0.0
        } else {
            (f64::from(a) - f64::from(e)).abs()
        };
        // NaN compares false with everything, so fold it in as infinity explicitly.
        max_abs = if diff.is_nan() {
            f64::INFINITY
        } else {
            max_abs.max(diff)
        };
        sum_abs += diff;
        sum_ref += f64::from(e).abs();
        dot += f64::from(a) * f64::from(e);
        norm_a += f64::from(a) * f64::from(a);
        norm_e += f64::from(e) * f64::from(e);
    }
    let mean_rel_diff = if sum_abs == 0.0 {
        0.0
    } else if sum_ref == 0.0 || sum_abs.is_nan() {
        f64::INFINITY
    } else {
        sum_abs / sum_ref
    };
    let cosine = if norm_a == 0.0 && norm_e == 0.0 {
        1.0
    } else if norm_a == 0.0 || norm_e == 0.0 {
        0.0
    } else {
        dot / (norm_a.sqrt() * norm_e.sqrt())
    };
    Ok(CloseMetrics {
        passed: mismatched == 0,
        compared,
        mismatched,
        max_abs_diff: max_abs,
        mean_rel_diff,
        mismatch_pct: if compared == 0 {
            0.0
        } else {
            100.0 * mismatched as f64 / compared as f64
        },
        cosine,
        top1_agreement: None,
    })
}

/// Share of rows (every index but the last dimension) whose argmax over the last
/// dimension agrees, skipping masked rows. `None` when no row is compared. Ties resolve
/// to the first maximum and NaN counts as the maximum, as `torch.argmax` does.
pub fn top1_agreement(
    actual: &[f32],
    expected: &[f32],
    shape: &[usize],
    mask: Option<&PositionMask>,
) -> Result<Option<f64>, MetricsError> {
    check_len("actual", actual.len(), shape)?;
    check_len("expected", expected.len(), shape)?;
    let Some(&width) = shape.last() else {
        return Ok(None);
    };
    if width == 0 {
        return Ok(None);
    }
    let inner = match mask {
        Some(m) if m.shape.len() >= shape.len() => {
            return Err(MetricsError::BadMask {
                mask: m.shape.clone(),
                shape: shape.to_vec(),
                hint: " and must not cover the last (argmax) dimension",
            })
        }
        Some(m) => m.inner(shape)?,
        None => 1,
    };
    let (mut rows, mut agree) = (0usize, 0usize);
    for (r, (a, e)) in actual.chunks(width).zip(expected.chunks(width)).enumerate() {
        if let Some(m) = mask {
            if !m.keep[r * width / inner] {
                continue;
            }
        }
        rows += 1;
        if argmax(a) == argmax(e) {
            agree += 1;
        }
    }
    Ok((rows > 0).then(|| agree as f64 / rows as f64))
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            return i;
        }
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Agreement of integer outputs, read as rows along the last dimension
/// (for `generated_ids [batch, new_tokens]`, one row per prompt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenMetrics {
    /// Every element equal.
    pub passed: bool,
    /// Per row, how many leading elements match before the first difference.
    pub matched_prefix: Vec<usize>,
    /// `100 * equal elements / all elements`.
    pub match_pct: f64,
    /// `[row, position]` of the first difference, if any.
    pub first_divergence: Option<[usize; 2]>,
}

/// Compares integer outputs exactly (greedy token ids); reports how far each row agrees.
pub fn compare_tokens(
    actual: &[i64],
    expected: &[i64],
    shape: &[usize],
) -> Result<TokenMetrics, MetricsError> {
    check_len("actual", actual.len(), shape)?;
    check_len("expected", expected.len(), shape)?;
    let width = shape.last().copied().unwrap_or(1).max(1);
    let mut matched_prefix = Vec::new();
    let mut first_divergence = None;
    for (r, (a, e)) in actual.chunks(width).zip(expected.chunks(width)).enumerate() {
        let prefix = a.iter().zip(e).take_while(|(x, y)| x == y).count();
        if prefix < a.len() && first_divergence.is_none() {
            first_divergence = Some([r, prefix]);
        }
        matched_prefix.push(prefix);
    }
    let equal = actual.iter().zip(expected).filter(|(a, e)| a == e).count();
    Ok(TokenMetrics {
        passed: equal == actual.len(),
        matched_prefix,
        match_pct: if actual.is_empty() {
            100.0
        } else {
            100.0 * equal as f64 / actual.len() as f64
        },
        first_divergence,
    })
}

fn check_len(what: &'static str, len: usize, shape: &[usize]) -> Result<(), MetricsError> {
    let needed = shape.iter().product();
    if len == needed {
        Ok(())
    } else {
        Err(MetricsError::LengthMismatch {
            what,
            len,
            shape: shape.to_vec(),
            needed,
        })
    }
}

/// Serde for f64 metrics that may be NaN or infinite: JSON has no such numbers, so they
/// are written as the strings `"NaN"`, `"Infinity"` and `"-Infinity"` and read back exactly.
pub mod nonfinite {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(crate) enum Repr {
        Number(f64),
        Text(String),
    }

    pub(crate) fn to_repr(v: f64) -> Repr {
        if v.is_nan() {
            Repr::Text("NaN".into())
        } else if v.is_infinite() {
            Repr::Text(if v > 0.0 { "Infinity" } else { "-Infinity" }.into())
        } else {
            Repr::Number(v)
        }
    }

    pub(crate) fn from_repr<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                other => Err(E::custom(format!(
                    "expected a number, \"NaN\" or \"Infinity\", found \"{other}\""
                ))),
            },
        }
    }

    /// Serializes one f64.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        to_repr(*v).serialize(s)
    }

    /// Deserializes one f64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        from_repr(Repr::deserialize(d)?)
    }
}

/// [`nonfinite`] for `Option<f64>`; `null` is `None`.
pub mod nonfinite_opt {
    use super::nonfinite::{from_repr, to_repr, Repr};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Serializes an optional f64.
    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        v.map(to_repr).serialize(s)
    }

    /// Deserializes an optional f64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Option::<Repr>::deserialize(d)?.map(from_repr).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIGHT: Tolerance = Tolerance {
        atol: 1e-4,
        rtol: 1e-4,
    };

    #[test]
    fn allclose_boundary_follows_torch() {
        // |a - e| <= atol + rtol * |e|: 1e-4 + 1e-4 * 100 = 0.0101 allowed at e = 100.
        assert!(TIGHT.is_close(100.01, 100.0));
        assert!(!TIGHT.is_close(100.0102, 100.0));
        assert!(TIGHT.is_close(f32::INFINITY, f32::INFINITY));
        assert!(!TIGHT.is_close(f32::INFINITY, f32::NEG_INFINITY));
        assert!(!TIGHT.is_close(f32::NAN, f32::NAN));
        assert!(!TIGHT.is_close(1.0, f32::NAN));
    }

    #[test]
    fn metrics_on_a_known_pair() {
        let expected = [1.0f32, -2.0, 3.0, 4.0];
        let actual = [1.0f32, -2.0, 3.5, 4.0];
        let m = compare_close(&actual, &expected, &[2, 2], None, TIGHT).unwrap();
        assert!(!m.passed);
        assert_eq!((m.compared, m.mismatched), (4, 1));
        assert!((m.max_abs_diff - 0.5).abs() < 1e-12);
        assert!((m.mismatch_pct - 25.0).abs() < 1e-12);
        assert!((m.mean_rel_diff - 0.5 / 10.0).abs() < 1e-12);
        let dot = 1.0 + 4.0 + 10.5 + 16.0;
        let cos = dot / ((1.0f64 + 4.0 + 12.25 + 16.0).sqrt() * 30f64.sqrt());
        assert!((m.cosine - cos).abs() < 1e-12);

        let same = compare_close(&expected, &expected, &[4], None, TIGHT).unwrap();
        assert!(same.passed);
        assert_eq!(same.max_abs_diff, 0.0);
        assert_eq!(same.mean_rel_diff, 0.0);
        assert!((same.cosine - 1.0).abs() < 1e-12);
    }

    #[test]
    fn nan_fails_and_reports_infinite_error() {
        let m = compare_close(&[f32::NAN, 1.0], &[0.0, 1.0], &[2], None, TIGHT).unwrap();
        assert!(!m.passed);
        assert_eq!(m.mismatched, 1);
        assert!(m.max_abs_diff.is_infinite());
    }

    #[test]
    fn mask_skips_padding_positions() {
        // [batch 2, seq 2, hidden 2]; position (1, 0) is padding and wildly off.
        let expected = [1.0f32, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0];
        let actual = [1.0f32, 1.0, 2.0, 2.0, 99.0, -99.0, 4.0, 4.0];
        let mask = PositionMask::from_i64(vec![2, 2], &[1, 1, 0, 1]);
        let m = compare_close(&actual, &expected, &[2, 2, 2], Some(&mask), TIGHT).unwrap();
        assert!(m.passed);
        assert_eq!(m.compared, 6);
        let unmasked = compare_close(&actual, &expected, &[2, 2, 2], None, TIGHT).unwrap();
        assert!(!unmasked.passed);
        assert_eq!(unmasked.mismatched, 2);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let err = compare_close(&[1.0], &[1.0, 2.0], &[2], None, TIGHT).unwrap_err();
        assert!(matches!(
            err,
            MetricsError::LengthMismatch { what: "actual", .. }
        ));
        let mask = PositionMask::from_i64(vec![3], &[1, 1, 1]);
        let err = compare_close(&[1.0, 2.0], &[1.0, 2.0], &[2], Some(&mask), TIGHT).unwrap_err();
        assert!(matches!(err, MetricsError::BadMask { .. }));
        let full = PositionMask::from_i64(vec![1, 2], &[1, 1]);
        let err = top1_agreement(&[1.0, 2.0], &[1.0, 2.0], &[1, 2], Some(&full)).unwrap_err();
        assert!(err.to_string().contains("last"));
    }

    #[test]
    fn top1_counts_rows_and_respects_mask() {
        // 3 rows of 3 logits; row 1 disagrees, row 2 is masked out.
        let expected = [0.1f32, 0.9, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        let actual = [0.2f32, 0.8, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let all = top1_agreement(&actual, &expected, &[3, 3], None)
            .unwrap()
            .unwrap();
        assert!((all - 1.0 / 3.0).abs() < 1e-12);
        let mask = PositionMask::from_i64(vec![3], &[1, 1, 0]);
        let masked = top1_agreement(&actual, &expected, &[3, 3], Some(&mask))
            .unwrap()
            .unwrap();
        assert!((masked - 0.5).abs() < 1e-12);
        let none = PositionMask::from_i64(vec![3], &[0, 0, 0]);
        assert_eq!(
            top1_agreement(&actual, &expected, &[3, 3], Some(&none)).unwrap(),
            None
        );
        // Ties go to the first index, like torch.argmax.
        assert_eq!(argmax(&[2.0, 2.0, 1.0]), 0);
        assert_eq!(argmax(&[2.0, f32::NAN, 3.0]), 1);
    }

    #[test]
    fn non_finite_metrics_round_trip_through_json() {
        let m = compare_close(&[f32::NAN, 1.0], &[0.0, 1.0], &[2], None, TIGHT).unwrap();
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"max_abs_diff\":\"Infinity\""), "{text}");
        let back: CloseMetrics = serde_json::from_str(&text).unwrap();
        assert!(back.max_abs_diff.is_infinite() && back.cosine.is_nan());
        assert_eq!(back.compared, 2);
        let bad = text.replace("\"Infinity\"", "\"lots\"");
        assert!(serde_json::from_str::<CloseMetrics>(&bad).is_err());
    }

    #[test]
    fn token_match_reports_prefix_and_divergence() {
        let expected = [5i64, 6, 7, 8, 1, 2, 3, 4];
        let actual = [5i64, 6, 7, 8, 1, 2, 9, 4];
        let m = compare_tokens(&actual, &expected, &[2, 4]).unwrap();
        assert!(!m.passed);
        assert_eq!(m.matched_prefix, vec![4, 2]);
        assert_eq!(m.first_divergence, Some([1, 2]));
        assert!((m.match_pct - 87.5).abs() < 1e-12);
        let same = compare_tokens(&expected, &expected, &[2, 4]).unwrap();
        assert!(same.passed && same.first_divergence.is_none());
    }
}
