//! The DPU's OVN image, read out of an OpenShift release payload: the
//! payload's manifest (from an index, the linux/arm64 one), then its
//! layers, last first, each a gzip tar streamed through a bounded reader
//! until the file `release-manifests/image-references` turns up; that file
//! is an ImageStream whose tag `ovn-kubernetes` names the image.
//!
//! Nothing is buffered whole: a layer is decompressed as it arrives and
//! read no further than [`MAX_UNPACKED`] (compressed, no further than
//! [`MAX_LAYER`]); the one file kept is at most [`MAX_FILE`].

use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::registry::{Credentials, ImageRef, Registry, RegistryError};

/// The tag of the release's ImageStream that names the OVN image.
pub const OVN_TAG: &str = "ovn-kubernetes";
/// The file of a release payload listing its images.
pub const IMAGE_REFERENCES: &str = "release-manifests/image-references";
/// The most of one compressed layer that is read.
pub const MAX_LAYER: u64 = 2 << 30;
/// The most of one layer's tar stream that is read.
pub const MAX_UNPACKED: u64 = 8 << 30;
/// The most of `image-references` that is read.
pub const MAX_FILE: u64 = 16 << 20;
/// How long one layer may take to arrive.
const LAYER_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("release image {0:?} is not an image reference")]
    BadReference(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("release image {image}: {detail}")]
    Manifest { image: String, detail: String },
    #[error("release image {image} has no {IMAGE_REFERENCES} in any layer")]
    NoImageReferences { image: String },
    #[error("release image {image}: {IMAGE_REFERENCES} has no tag {tag}")]
    NoTag { image: String, tag: String },
    #[error("release image {image}: {detail}")]
    Layer { image: String, detail: String },
}

/// From an index (manifest list), the digest of the linux/arm64 image;
/// `None` when the document is a single image's manifest.
pub fn arm64_from_index(manifest: &Value) -> Option<Result<String, String>> {
    let entries = manifest["manifests"].as_array()?;
    Some(
        entries
            .iter()
            .find(|m| {
                m["platform"]["os"].as_str() == Some("linux")
                    && m["platform"]["architecture"].as_str() == Some("arm64")
            })
            .and_then(|m| m["digest"].as_str())
            .map(str::to_string)
            .ok_or_else(|| "an index with no linux/arm64 image".to_string()),
    )
}

/// The layers' digests, last layer first.
pub fn layers_last_first(manifest: &Value) -> Result<Vec<String>, String> {
    let layers = manifest["layers"]
        .as_array()
        .ok_or("a manifest without layers")?;
    layers
        .iter()
        .rev()
        .map(|l| {
            l["digest"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| "a layer without a digest".to_string())
        })
        .collect()
}

/// The image an ImageStream's tag names (`spec.tags[].from.name`).
pub fn tagged_image(image_references: &[u8], tag: &str) -> Result<Option<String>, String> {
    let stream: Value = serde_json::from_slice(image_references)
        .map_err(|e| format!("{IMAGE_REFERENCES} is not JSON: {e}"))?;
    Ok(stream["spec"]["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"].as_str() == Some(tag))
        .and_then(|t| t["from"]["name"].as_str())
        .map(str::to_string))
}

/// A reader that fails once more than `limit` bytes went through it.
struct Bounded<R> {
    inner: R,
    left: u64,
    what: &'static str,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self
            .left
            .checked_sub(n as u64)
            .ok_or_else(|| std::io::Error::other(format!("{} over its limit", self.what)))?;
        Ok(n)
    }
}

/// Reads a gzip tar stream up to the file at `path` (a leading `./` or
/// `/` ignored); its contents, or `None` when the stream has none.
pub fn find_in_layer(gzip_tar: impl Read, path: &str) -> Result<Option<Vec<u8>>, String> {
    let compressed = Bounded {
        inner: gzip_tar,
        left: MAX_LAYER,
        what: "the compressed layer",
    };
    let unpacked = Bounded {
        inner: flate2::read::GzDecoder::new(compressed),
        left: MAX_UNPACKED,
        what: "the unpacked layer",
    };
    let mut archive = tar::Archive::new(unpacked);
    let entries = archive.entries().map_err(|e| e.to_string())?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.path().map_err(|e| e.to_string())?;
        let name = name.to_string_lossy();
        let name = name.trim_start_matches("./").trim_start_matches('/');
        if name != path || !entry.header().entry_type().is_file() {
            continue;
        }
        if entry.size() > MAX_FILE {
            return Err(format!("{path} is {} bytes, over {MAX_FILE}", entry.size()));
        }
        let mut contents = Vec::new();
        entry
            .take(MAX_FILE)
            .read_to_end(&mut contents)
            .map_err(|e| e.to_string())?;
        return Ok(Some(contents));
    }
    Ok(None)
}

/// The blocking side of a streamed body: chunks from the async side.
struct Chunks {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    current: Bytes,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                Some(Ok(b)) => self.current = b,
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Streams one layer into [`find_in_layer`] on a blocking thread.
async fn search_layer(
    registry: &Registry,
    image: &ImageRef,
    digest: &str,
    creds: &Credentials,
) -> Result<Option<Vec<u8>>, String> {
    let response = registry
        .blob(image, digest, creds)
        .await
        .map_err(|e| e.to_string())?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let reader = tokio::task::spawn_blocking(move || {
        find_in_layer(
            Chunks {
                rx,
                current: Bytes::new(),
            },
            IMAGE_REFERENCES,
        )
    });
    let mut body = response.into_body();
    let deadline = tokio::time::Instant::now() + LAYER_TIMEOUT;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => Err(format!(
                "layer {digest} did not arrive within {LAYER_TIMEOUT:?}"
            )),
            Ok(None) => break,
            Ok(Some(Err(e))) => Err(e.to_string()),
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Ok(data),
                Err(_) => continue,
            },
        };
        let failed = chunk.is_err();
        // The reader stopped (found the file, or failed): stop sending.
        if tx.send(chunk).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    reader
        .await
        .map_err(|e| format!("layer {digest}: {e}"))?
        .map_err(|e| format!("layer {digest}: {e}"))
}

/// The image the release payload `release` (by tag or digest) names for
/// `tag`, with `creds` for its registry.
pub async fn image_in_release(
    registry: &Registry,
    release: &str,
    tag: &str,
    creds: &Credentials,
) -> Result<String, PayloadError> {
    let image =
        ImageRef::parse(release).ok_or_else(|| PayloadError::BadReference(release.into()))?;
    let manifest_error = |detail: String| PayloadError::Manifest {
        image: release.to_string(),
        detail,
    };
    let reference = image
        .digest
        .clone()
        .or(image.tag.clone())
        .unwrap_or_else(|| "latest".into());
    let mut manifest = registry.manifest(&image, &reference, creds).await?;
    if let Some(arm64) = arm64_from_index(&manifest) {
        let digest = arm64.map_err(manifest_error)?;
        manifest = registry.manifest(&image, &digest, creds).await?;
    }
    let layers = layers_last_first(&manifest).map_err(manifest_error)?;
    for digest in layers {
        let found = search_layer(registry, &image, &digest, creds)
            .await
            .map_err(|detail| PayloadError::Layer {
                image: release.to_string(),
                detail,
            })?;
        if let Some(contents) = found {
            return tagged_image(&contents, tag)
                .map_err(manifest_error)?
                .ok_or_else(|| PayloadError::NoTag {
                    image: release.to_string(),
                    tag: tag.to_string(),
                });
        }
    }
    Err(PayloadError::NoImageReferences {
        image: release.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn the_file_is_found_among_others_with_or_without_a_leading_dot() {
        let l = layer(&[
            ("etc/os-release", b"x"),
            ("./release-manifests/image-references", b"{}"),
        ]);
        assert_eq!(
            find_in_layer(&l[..], IMAGE_REFERENCES).unwrap(),
            Some(b"{}".to_vec())
        );
        let l = layer(&[("release-manifests/other", b"y")]);
        assert_eq!(find_in_layer(&l[..], IMAGE_REFERENCES).unwrap(), None);
        assert!(find_in_layer(&b"not gzip"[..], IMAGE_REFERENCES).is_err());
    }

    #[test]
    fn the_ovn_tag_is_read_from_the_image_stream() {
        let stream = json!({
            "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
            "spec": {"tags": [
                {"name": "cli", "from": {"kind": "DockerImage", "name": "q/cli@sha256:1"}},
                {"name": "ovn-kubernetes", "from": {"kind": "DockerImage", "name": "q/ovn@sha256:2"}},
            ]}
        });
        let bytes = serde_json::to_vec(&stream).unwrap();
        assert_eq!(
            tagged_image(&bytes, OVN_TAG).unwrap().as_deref(),
            Some("q/ovn@sha256:2")
        );
        assert_eq!(tagged_image(&bytes, "nope").unwrap(), None);
        assert!(tagged_image(b"[", OVN_TAG).is_err());
    }

    #[test]
    fn an_index_gives_its_linux_arm64_image() {
        let index = json!({"manifests": [
            {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": "sha256:b", "platform": {"os": "linux", "architecture": "arm64"}},
        ]});
        assert_eq!(arm64_from_index(&index), Some(Ok("sha256:b".into())));
        let amd_only = json!({"manifests": [
            {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "amd64"}},
        ]});
        assert!(matches!(arm64_from_index(&amd_only), Some(Err(_))));
        assert_eq!(arm64_from_index(&json!({"layers": []})), None);
    }

    #[test]
    fn layers_are_searched_last_first() {
        let m = json!({"layers": [{"digest": "sha256:1"}, {"digest": "sha256:2"}]});
        assert_eq!(layers_last_first(&m).unwrap(), ["sha256:2", "sha256:1"]);
        assert!(layers_last_first(&json!({})).is_err());
    }

    proptest::proptest! {
        /// What a registry sends is input: no layer, ImageStream or
        /// overrides text makes the reader panic.
        #[test]
        fn arbitrary_layers_and_documents_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let _ = find_in_layer(&data[..], IMAGE_REFERENCES);
            let _ = tagged_image(&data, OVN_TAG);
            if let Ok(text) = std::str::from_utf8(&data) {
                let _ = crate::dpf::service_templates::values::parse_overrides(text, "ns/cm");
            }
        }

        /// A valid gzip stream of arbitrary bytes (not a tar) is refused or
        /// read as holding nothing, never a panic.
        #[test]
        fn gzip_of_arbitrary_bytes_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8192)) {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&data).unwrap();
            let bytes = gz.finish().unwrap();
            let _ = find_in_layer(&bytes[..], IMAGE_REFERENCES);
        }
    }

    #[test]
    fn an_image_references_over_the_cap_is_refused_by_name() {
        let big = vec![b' '; MAX_FILE as usize + 1];
        let l = layer(&[(IMAGE_REFERENCES, &big)]);
        let e = find_in_layer(&l[..], IMAGE_REFERENCES).unwrap_err();
        assert!(e.contains(IMAGE_REFERENCES) && e.contains("over"), "{e}");
    }

    #[test]
    fn a_reader_past_its_limit_fails() {
        let mut r = Bounded {
            inner: &[0u8; 10][..],
            left: 4,
            what: "test",
        };
        let mut out = Vec::new();
        assert!(r.read_to_end(&mut out).is_err());
    }
}
