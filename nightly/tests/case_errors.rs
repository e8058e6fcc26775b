//! Broken case folders fail to load with errors that name the file and the field.

use std::path::{Path, PathBuf};

use serde_json::Value;
use zoo_nightly::case::{discover, Case, CaseError};
use zoo_nightly::{CompareError, HostTensor};

const SOURCE: &str = "llama-gqa-f32";

/// Copies a committed fixture into a temp dir and lets the test edit its case.json.
fn copy_case(edit: impl FnOnce(&mut Value)) -> (tempfile::TempDir, PathBuf) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(SOURCE);
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join(SOURCE);
    std::fs::create_dir(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    let json_path = to.join("case.json");
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    (tmp, to)
}

fn load_err(edit: impl FnOnce(&mut Value)) -> CaseError {
    let (_tmp, dir) = copy_case(edit);
    Case::load(&dir).expect_err("the edited case must not load")
}

#[test]
fn unedited_copy_loads() {
    let (_tmp, dir) = copy_case(|_| {});
    let case = Case::load(&dir).unwrap();
    assert_eq!(case.name(), SOURCE);
    assert_eq!(case.checkpoint_path(), dir.join("."));
}

#[test]
fn schema_errors_name_the_field() {
    let err = load_err(|d| d["outputs"][0]["compare"] = "roughly".into());
    match &err {
        CaseError::Json { path, field, .. } => {
            assert!(path.ends_with("case.json"));
            assert_eq!(field, "outputs[0].compare");
        }
        other => panic!("wrong error: {other}"),
    }
    assert!(err.to_string().contains("roughly"));

    let err = load_err(|d| {
        d.as_object_mut().unwrap().remove("tolerance");
    });
    assert!(err.to_string().contains("tolerance"), "{err}");

    let err = load_err(|d| d["dtype"] = "f64".into());
    assert!(
        matches!(err, CaseError::Json { ref field, .. } if field == "dtype"),
        "{err}"
    );
}

#[test]
fn unknown_format_version_is_refused() {
    let err = load_err(|d| d["format_version"] = 2.into());
    assert!(matches!(
        err,
        CaseError::UnsupportedFormatVersion {
            found: 2,
            supported: 1,
            ..
        }
    ));
}

#[test]
fn listing_must_match_the_files() {
    let err = load_err(|d| d["outputs"][0]["shape"] = serde_json::json!([2, 10, 255]));
    match err {
        CaseError::Mismatch { field, what, .. } => {
            assert_eq!(field, "outputs[0].shape");
            assert_eq!(what, "shape");
        }
        other => panic!("wrong error: {other}"),
    }

    let err = load_err(|d| d["inputs"][0]["dtype"] = "I32".into());
    assert!(
        matches!(err, CaseError::Mismatch { ref field, what: "dtype", .. } if field == "inputs[0].dtype")
    );

    let err = load_err(|d| d["outputs"][1]["name"] = "hidden".into());
    match err {
        CaseError::MissingTensor {
            field, name, file, ..
        } => {
            assert_eq!((field.as_str(), name.as_str()), ("outputs[1]", "hidden"));
            assert!(file.ends_with("expected.safetensors"));
        }
        other => panic!("wrong error: {other}"),
    }

    let err = load_err(|d| {
        d["inputs"].as_array_mut().unwrap().pop();
    });
    assert!(
        matches!(err, CaseError::UnlistedTensor { ref name, .. } if name == "position_ids"),
        "{err}"
    );
}

#[test]
fn compare_and_mask_must_fit() {
    let err = load_err(|d| d["outputs"][0]["compare"] = "exact".into());
    assert!(
        matches!(err, CaseError::CompareKind { ref field, .. } if field == "outputs[0].compare")
    );

    let err = load_err(|d| d["outputs"][0]["mask"] = "padding".into());
    assert!(matches!(err, CaseError::BadMask { ref field, .. } if field == "outputs[0].mask"));
    assert!(err.to_string().contains("padding"));

    // input_ids is an integer [batch, seq] input, so only a shape mismatch can fail it.
    let err = load_err(|d| {
        let gen = d["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .position(|o| o["name"] == "generated_ids");
        d["outputs"][gen.unwrap()]["mask"] = "input_ids".into();
    });
    assert!(err.to_string().contains("not a prefix"), "{err}");
}

#[test]
fn missing_files_are_reported_with_their_path() {
    let (_tmp, dir) = copy_case(|_| {});
    std::fs::remove_file(dir.join("expected.safetensors")).unwrap();
    let err = Case::load(&dir).unwrap_err();
    assert!(err.to_string().contains("expected.safetensors"), "{err}");

    std::fs::remove_file(dir.join("case.json")).unwrap();
    let err = Case::load(&dir).unwrap_err();
    assert!(matches!(err, CaseError::Io { ref path, .. } if path.ends_with("case.json")));
}

#[test]
fn discover_finds_cases_and_skips_partial_folders() {
    let (tmp, dir) = copy_case(|_| {});
    std::fs::create_dir(tmp.path().join(".other.partial")).unwrap();
    std::fs::copy(
        dir.join("case.json"),
        tmp.path().join(".other.partial/case.json"),
    )
    .unwrap();
    std::fs::create_dir(tmp.path().join("not-a-case")).unwrap();
    assert_eq!(discover(tmp.path()).unwrap(), vec![dir.clone()]);
    assert_eq!(discover(&dir).unwrap(), vec![dir]);
    assert!(discover(&tmp.path().join("absent")).is_err());
}

#[test]
fn compare_output_rejects_wrong_outputs() {
    let (_tmp, dir) = copy_case(|_| {});
    let case = Case::load(&dir).unwrap();
    let err = case
        .compare_output("probabilities", &HostTensor::f32(vec![1], vec![0.0]))
        .unwrap_err();
    assert!(matches!(err, CompareError::UnknownOutput { .. }));
    assert!(
        err.to_string().contains("logits"),
        "lists what exists: {err}"
    );

    let err = case
        .compare_output("logits", &HostTensor::f32(vec![2, 10], vec![0.0; 20]))
        .unwrap_err();
    assert!(err.to_string().contains("shape mismatch"), "{err}");

    let ids = &case.expected["generated_ids"];
    let as_float = HostTensor::f32(ids.shape.clone(), vec![0.0; ids.len()]);
    let err = case.compare_output("generated_ids", &as_float).unwrap_err();
    assert!(matches!(
        err,
        CompareError::ElementKind {
            expected: "integer",
            ..
        }
    ));

    // One wrong token in the second prompt: reported with the divergence point.
    let mut tokens = ids.as_i64().unwrap().to_vec();
    let width = ids.shape[1];
    tokens[width + 5] += 1;
    let report = case
        .compare_output("generated_ids", &HostTensor::i64(ids.shape.clone(), tokens))
        .unwrap();
    assert!(!report.passed);
    let metrics = report.tokens.unwrap();
    assert_eq!(metrics.first_divergence, Some([1, 5]));
    assert_eq!(metrics.matched_prefix, vec![width, 5]);
}

#[test]
fn a_case_that_compares_nothing_is_refused() {
    let err = load_err(|d| {
        for o in d["outputs"].as_array_mut().unwrap() {
            o["compare"] = "info".into();
        }
    });
    assert!(matches!(err, CaseError::NothingToCompare { .. }), "{err}");
    assert!(err.to_string().contains("case.json"), "{err}");
}

#[test]
fn a_mask_that_hides_every_element_is_refused() {
    let (_tmp, dir) = copy_case(|_| {});
    // Rewrite inputs.safetensors with the attention mask zeroed (every input is I64).
    let path = dir.join("inputs.safetensors");
    let inputs = zoo_nightly::tensor::read_safetensors(&path).unwrap();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, t) in &inputs {
        let values: Vec<i64> = match name.as_str() {
            "attention_mask" => vec![0; t.len()],
            _ => t.as_i64().unwrap().to_vec(),
        };
        let start = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "I64", "shape": t.shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend_from_slice(&data);
    std::fs::write(&path, bytes).unwrap();
    let err = Case::load(&dir).expect_err("a fully masked output compares nothing");
    assert!(
        matches!(err, CaseError::BadMask { .. }) && err.to_string().contains("all zeros"),
        "{err}"
    );
}
