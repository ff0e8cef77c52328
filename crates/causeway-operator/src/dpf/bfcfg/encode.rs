//! How file contents are written into an ignition: data URLs, gzip, and
//! the JSON form DPF receives.

use std::io::Write;

use base64::Engine;
use flate2::write::GzEncoder;
use percent_encoding::{utf8_percent_encode, AsciiSet};
use serde_json::{json, Value};

use super::BfcfgError;
use crate::dpf::ignition::{data_url_bytes, DATA_URL};

/// Characters kept in a live-ignition text URL: DPF fills `{{.Name}}`
/// placeholders in before the DPU reads the URL, so braces stay as they are.
const PLACEHOLDER_URL: &AsciiSet = &DATA_URL.remove(b'{').remove(b'}');

/// gzip at the best compression, with no name and no timestamp, so the same
/// input always gives the same template.
pub(super) fn gzip(data: &[u8]) -> Result<Vec<u8>, BfcfgError> {
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data)
        .and_then(|()| enc.finish())
        .map_err(|e| BfcfgError::Encode(format!("gzip: {e}")))
}

pub(super) fn base64_url(data: &[u8]) -> String {
    format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(data)
    )
}

/// `contents` (or an `append` entry) holding `data` gzipped.
pub(super) fn gzip_resource(data: &[u8]) -> Result<Value, BfcfgError> {
    Ok(json!({"source": base64_url(&gzip(data)?), "compression": "gzip"}))
}

/// A percent-encoded text URL, editable in place.
pub(super) fn text_url(text: &str) -> String {
    format!("data:,{}", utf8_percent_encode(text, DATA_URL))
}

/// A text URL whose `{{.Name}}` placeholders DPF can still find.
pub(super) fn placeholder_url(text: &str) -> String {
    format!("data:,{}", utf8_percent_encode(text, PLACEHOLDER_URL))
}

/// A file entry as every file in the template has it: overwrite on.
pub(super) fn file(path: &str, mode: u32, contents: Value) -> Value {
    json!({"path": path, "mode": mode, "overwrite": true, "contents": contents})
}

/// The bytes a file entry's `contents` holds, gunzipped when compressed.
pub(super) fn file_bytes(path: &str, contents: &Value) -> Result<Vec<u8>, BfcfgError> {
    let source = contents
        .get("source")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let data = data_url_bytes(source, false).map_err(|why| BfcfgError::BadSource {
        path: path.into(),
        why,
    })?;
    if contents.get("compression").and_then(Value::as_str) == Some("gzip") {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&data[..]), &mut out)
            .map_err(|e| BfcfgError::BadSource {
                path: path.into(),
                why: format!("gunzip: {e}"),
            })?;
        return Ok(out);
    }
    Ok(data)
}

/// Gzips every file whose contents are an uncompressed `data:` URL. A
/// non-base64 URL is read with `+` as a space (form decoding), as the
/// shipped generator does, so a DPU gets the same bytes from either; the
/// template's own text URLs are percent-encoded and never hold a literal
/// `+`. Other sources (http, s3, ...) are left for Ignition to fetch.
pub(super) fn compress_files(ignition: &mut Value) -> Result<(), BfcfgError> {
    let Some(files) = ignition
        .pointer_mut("/storage/files")
        .and_then(Value::as_array_mut)
    else {
        return Ok(());
    };
    for file in files {
        let path = file["path"].as_str().unwrap_or_default().to_string();
        let Some(contents) = file.get_mut("contents").and_then(Value::as_object_mut) else {
            continue;
        };
        let compressed = contents
            .get("compression")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty());
        let Some(source) = contents.get("source").and_then(Value::as_str) else {
            continue;
        };
        if compressed || !source.starts_with("data:") {
            continue;
        }
        let data = data_url_bytes(source, true).map_err(|why| BfcfgError::BadSource {
            path: path.clone(),
            why,
        })?;
        contents.insert("source".into(), Value::from(base64_url(&gzip(&data)?)));
        contents.insert("compression".into(), Value::from("gzip"));
        // A hash of the uncompressed bytes would no longer match.
        contents.remove("verification");
    }
    Ok(())
}

/// Removes every object member that is an empty object, innermost first.
pub(super) fn strip_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for child in map.values_mut() {
                strip_empty(child);
            }
            map.retain(|_, child| !matches!(child, Value::Object(m) if m.is_empty()));
        }
        Value::Array(items) => items.iter_mut().for_each(strip_empty),
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn uncompressed_data_urls_are_gzipped_and_others_left_alone() {
        let mut ign = json!({"storage": {"files": [
            {"path": "/a", "contents": {"source": "data:,a+b%2Bc"}},
            {"path": "/b", "contents": {"source": "data:;base64,aGk="}},
            {"path": "/c", "contents": {"source": "https://example.com/c"}},
            {"path": "/d", "contents": gzip_resource(b"done").unwrap()},
        ]}});
        let before_d = ign["storage"]["files"][3].clone();
        compress_files(&mut ign).unwrap();
        let files = ign["storage"]["files"].as_array().unwrap();
        // Form decoding: the literal `+` becomes a space, `%2B` a plus.
        assert_eq!(file_bytes("/a", &files[0]["contents"]).unwrap(), b"a b+c");
        assert_eq!(files[0]["contents"]["compression"], "gzip");
        assert!(files[0]["contents"]["source"]
            .as_str()
            .unwrap()
            .starts_with("data:;base64,H4sI"));
        assert_eq!(file_bytes("/b", &files[1]["contents"]).unwrap(), b"hi");
        assert_eq!(
            files[2]["contents"],
            json!({"source": "https://example.com/c"})
        );
        assert_eq!(files[3], before_d);
    }

    #[test]
    fn gzip_is_deterministic_and_at_level_nine() {
        let a = gzip(b"same input").unwrap();
        assert_eq!(a, gzip(b"same input").unwrap());
        // XFL 2 = the slowest, best compression.
        assert_eq!((a[0], a[1], a[8]), (0x1f, 0x8b, 2));
    }

    #[test]
    fn empty_objects_are_stripped_recursively() {
        let mut v = json!({"a": {"b": {}}, "c": [{"d": {}}], "e": 1, "f": []});
        strip_empty(&mut v);
        assert_eq!(v, json!({"c": [{}], "e": 1, "f": []}));
    }

    #[test]
    fn placeholders_survive_their_url() {
        assert_eq!(
            placeholder_url("DPUName={{.DPUName}}\n"),
            "data:,DPUName%3D{{.DPUName}}%0A"
        );
        assert_eq!(text_url("{x}"), "data:,%7Bx%7D");
    }
}
