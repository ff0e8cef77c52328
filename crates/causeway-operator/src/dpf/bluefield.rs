//! Which BlueField OS image goes with a hosted cluster's OpenShift release.
//! Two sources, in order: the ConfigMap `ocp-bluefield-images` (keys are
//! OpenShift versions, values images; the chart fills it from
//! `blueFieldImages`), then the registry: a HEAD of the manifest
//! `<blueFieldOCPLayerRepo>:<version>`, with the pull secret's credentials
//! for that registry host.
//!
//! The version is the release image's tag without its architecture suffix;
//! for a release pinned by digest it is the image's `io.openshift.release`
//! label, read from the registry.
//!
//! Errors are typed, and each maps to the Go operator's condition reason.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub const IMAGES_CONFIGMAP: &str = "ocp-bluefield-images";
/// The image label a release carries its version in.
const RELEASE_LABEL: &str = "io.openshift.release";
const ARCH_SUFFIXES: [&str; 6] = [
    "-multi", "-amd64", "-arm64", "-ppc64le", "-s390x", "-x86_64",
];
const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// How long one registry request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a lookup's answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error(
        "release image {0:?} has neither a tag nor a digest to read the OpenShift version from"
    )]
    InvalidImageFormat(String),
    #[error(
        "blueFieldOCPLayerRepo {0:?} is not an image repository such as quay.io/org/rhcos-bfb"
    )]
    InvalidRepository(String),
    #[error("registry {registry} refused the pull secret's credentials (HTTP {status})")]
    RegistryAuth { registry: String, status: u16 },
    #[error("no BlueField image for OpenShift {version} (release {release}); searched {}", searched.join(", "))]
    VersionNotFound {
        release: String,
        version: String,
        searched: Vec<String>,
    },
    #[error("registry {registry}: {detail}")]
    RegistryAccess { registry: String, detail: String },
}

impl LookupError {
    /// The condition reason, as the Go operator names it.
    pub fn reason(&self) -> &'static str {
        match self {
            LookupError::InvalidImageFormat(_) => "InvalidImageFormat",
            LookupError::InvalidRepository(_) => "InvalidBlueFieldOCPLayerImageURL",
            LookupError::RegistryAuth { .. } => "RegistryAuthError",
            LookupError::VersionNotFound { .. } => "VersionNotFound",
            LookupError::RegistryAccess { .. } => "RegistryAccessError",
        }
    }

    /// Whether asking again without a change can give another answer.
    pub fn transient(&self) -> bool {
        matches!(self, LookupError::RegistryAccess { .. })
    }
}

/// An image reference split as registries address it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]`; `docker.io` is served by `registry-1.docker.io`.
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl ImageRef {
    pub fn parse(reference: &str) -> Option<ImageRef> {
        let reference = reference.trim();
        if reference.is_empty() || reference.contains(char::is_whitespace) {
            return None;
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((r, d)) if d.contains(':') => (r, Some(d.to_string())),
            Some(_) => return None,
            None => (reference, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_string()),
            ),
            None => (rest, None),
        };
        if name.is_empty() || tag.as_deref() == Some("") {
            return None;
        }
        let (registry, repository) = match name.split_once('/') {
            Some((host, path))
                if host.contains('.') || host.contains(':') || host == "localhost" =>
            {
                (host.to_string(), path.to_string())
            }
            Some(_) => ("docker.io".to_string(), name.to_string()),
            None => ("docker.io".to_string(), format!("library/{name}")),
        };
        if repository.is_empty()
            || !repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return None;
        }
        Some(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// Where the registry's API is. Loopback registries are spoken to in
    /// plain HTTP, as the usual registry clients do; all others in HTTPS.
    fn base(&self) -> String {
        let host = if self.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        };
        let bare = host.rsplit_once(':').map_or(host, |(h, _)| h);
        let loopback = bare == "localhost" || bare.starts_with("127.") || bare == "[::1]";
        format!("{}://{host}", if loopback { "http" } else { "https" })
    }
}

/// The OpenShift version of a release image reference given by tag:
/// `quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64` is
/// `4.19.0-ec.5`. `Ok(None)` for a digest reference.
pub fn version_from_tag(release: &str) -> Result<Option<String>, LookupError> {
    let image =
        ImageRef::parse(release).ok_or_else(|| LookupError::InvalidImageFormat(release.into()))?;
    match (image.tag, image.digest) {
        (Some(tag), _) => {
            let version = ARCH_SUFFIXES
                .iter()
                .find_map(|s| tag.strip_suffix(s))
                .unwrap_or(&tag);
            Ok(Some(version.to_string()))
        }
        (None, Some(_)) => Ok(None),
        (None, None) => Err(LookupError::InvalidImageFormat(release.into())),
    }
}

/// Per registry host, `user:password`, from a `.dockerconfigjson`. The
/// host must match exactly, as the Go operator's keychain does.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    by_host: BTreeMap<String, (String, String)>,
}

impl Credentials {
    pub fn from_docker_config(json: &[u8]) -> Credentials {
        let mut by_host = BTreeMap::new();
        let Ok(v) = serde_json::from_slice::<Value>(json) else {
            return Credentials::default();
        };
        for (host, entry) in v["auths"].as_object().into_iter().flatten() {
            let pair = match (entry["username"].as_str(), entry["password"].as_str()) {
                (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
                _ => entry["auth"]
                    .as_str()
                    .and_then(|a| base64::engine::general_purpose::STANDARD.decode(a).ok())
                    .and_then(|b| String::from_utf8(b).ok())
                    .and_then(|s| {
                        s.split_once(':')
                            .map(|(u, p)| (u.to_string(), p.to_string()))
                    }),
            };
            if let Some(pair) = pair {
                by_host.insert(
                    host.trim_start_matches("https://")
                        .trim_end_matches('/')
                        .to_string(),
                    pair,
                );
            }
        }
        Credentials { by_host }
    }

    fn basic(&self, registry: &str) -> Option<String> {
        self.by_host.get(registry).map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        })
    }
}

/// The parameters of a `WWW-Authenticate: Bearer ...` challenge.
fn bearer_challenge(header: &str) -> Option<BTreeMap<String, String>> {
    let rest = header.trim().strip_prefix("Bearer ")?;
    let mut out = BTreeMap::new();
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        out.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
    }
    Some(out)
}

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// A registry client: manifest HEADs and JSON GETs, with basic and bearer
/// token authentication.
#[derive(Clone)]
pub struct Registry {
    http: HttpClient<Https, Empty<Bytes>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        Registry {
            http: HttpClient::builder(TokioExecutor::new()).build(connector),
        }
    }

    async fn send(
        &self,
        method: http::Method,
        url: &str,
        accept: &str,
        authorization: Option<&str>,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(url)
            .header(http::header::ACCEPT, accept)
            .header(http::header::USER_AGENT, "causeway-operator");
        if let Some(a) = authorization {
            req = req.header(http::header::AUTHORIZATION, a);
        }
        let req = req.body(Empty::new()).map_err(|e| e.to_string())?;
        match tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        }
    }

    /// Sends with the credentials the registry asks for: none first, then
    /// basic, or a bearer token from the challenge's realm.
    async fn authorized(
        &self,
        method: http::Method,
        image: &ImageRef,
        url: &str,
        accept: &str,
        creds: &Credentials,
    ) -> Result<http::Response<hyper::body::Incoming>, LookupError> {
        let access = |detail: String| LookupError::RegistryAccess {
            registry: image.registry.clone(),
            detail,
        };
        let basic = creds.basic(&image.registry);
        let first = self
            .send(method.clone(), url, accept, basic.as_deref())
            .await
            .map_err(access)?;
        if first.status() != http::StatusCode::UNAUTHORIZED {
            return Ok(first);
        }
        let challenge = first
            .headers()
            .get(http::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_challenge);
        let Some(challenge) = challenge else {
            return Err(LookupError::RegistryAuth {
                registry: image.registry.clone(),
                status: 401,
            });
        };
        let realm = challenge
            .get("realm")
            .ok_or_else(|| access("a bearer challenge without a realm".into()))?;
        let mut token_url = format!("{realm}?scope=repository:{}:pull", image.repository);
        if let Some(service) = challenge.get("service") {
            token_url.push_str(&format!("&service={service}"));
        }
        let reply = self
            .send(
                http::Method::GET,
                &token_url,
                "application/json",
                basic.as_deref(),
            )
            .await
            .map_err(access)?;
        if matches!(reply.status().as_u16(), 401 | 403) {
            return Err(LookupError::RegistryAuth {
                registry: image.registry.clone(),
                status: reply.status().as_u16(),
            });
        }
        let body = read_json(reply).await.map_err(access)?;
        let token = body["token"]
            .as_str()
            .or(body["access_token"].as_str())
            .ok_or_else(|| access("the token endpoint gave no token".into()))?;
        self.send(method, url, accept, Some(&format!("Bearer {token}")))
            .await
            .map_err(access)
    }

    /// Whether `image`'s manifest (by tag or digest) exists.
    pub async fn exists(&self, image: &ImageRef, creds: &Credentials) -> Result<bool, LookupError> {
        let reference = image
            .digest
            .clone()
            .or(image.tag.clone())
            .unwrap_or_else(|| "latest".into());
        let url = format!(
            "{}/v2/{}/manifests/{reference}",
            image.base(),
            image.repository
        );
        let r = self
            .authorized(http::Method::HEAD, image, &url, MANIFEST_TYPES, creds)
            .await?;
        match r.status().as_u16() {
            200..=299 => Ok(true),
            404 => Ok(false),
            s @ (401 | 403) => Err(LookupError::RegistryAuth {
                registry: image.registry.clone(),
                status: s,
            }),
            s => Err(LookupError::RegistryAccess {
                registry: image.registry.clone(),
                detail: format!("HEAD {url}: HTTP {s}"),
            }),
        }
    }

    async fn get_json(
        &self,
        image: &ImageRef,
        path: &str,
        creds: &Credentials,
    ) -> Result<Value, LookupError> {
        let url = format!("{}/v2/{}/{path}", image.base(), image.repository);
        let r = self
            .authorized(http::Method::GET, image, &url, MANIFEST_TYPES, creds)
            .await?;
        match r.status().as_u16() {
            200..=299 => read_json(r)
                .await
                .map_err(|detail| LookupError::RegistryAccess {
                    registry: image.registry.clone(),
                    detail,
                }),
            s @ (401 | 403) => Err(LookupError::RegistryAuth {
                registry: image.registry.clone(),
                status: s,
            }),
            s => Err(LookupError::RegistryAccess {
                registry: image.registry.clone(),
                detail: format!("GET {url}: HTTP {s}"),
            }),
        }
    }

    /// The OpenShift version of a release pinned by digest: its config's
    /// `io.openshift.release` label (of the first image of an index).
    pub async fn release_version(
        &self,
        release: &ImageRef,
        creds: &Credentials,
    ) -> Result<String, LookupError> {
        let digest = release.digest.clone().unwrap_or_default();
        let mut manifest = self
            .get_json(release, &format!("manifests/{digest}"), creds)
            .await?;
        if let Some(first) = manifest["manifests"][0]["digest"].as_str() {
            manifest = self
                .get_json(release, &format!("manifests/{first}"), creds)
                .await?;
        }
        let config = manifest["config"]["digest"].as_str().ok_or_else(|| {
            LookupError::InvalidImageFormat(format!("{}@{digest}", release.repository))
        })?;
        let config = self
            .get_json(release, &format!("blobs/{config}"), creds)
            .await?;
        config["config"]["Labels"][RELEASE_LABEL]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| {
                LookupError::InvalidImageFormat(format!(
                    "{}@{digest} has no {RELEASE_LABEL} label",
                    release.repository
                ))
            })
    }
}

async fn read_json(r: http::Response<hyper::body::Incoming>) -> Result<Value, String> {
    let body = tokio::time::timeout(REQUEST_TIMEOUT, r.into_body().collect())
        .await
        .map_err(|_| "the body did not arrive in time".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    if body.len() > 4 << 20 {
        return Err("a JSON body over 4 MiB".into());
    }
    serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
}

/// What a lookup needs.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub release_image: String,
    pub repository: String,
    /// The ConfigMap's data, when it exists.
    pub configured: Option<BTreeMap<String, String>>,
    /// Where the ConfigMap was looked for, for messages.
    pub configmap_namespace: String,
    pub credentials: Credentials,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub image: String,
    pub version: String,
    /// `ConfigMap <ns>/ocp-bluefield-images` or `registry`.
    pub source: String,
}

/// Finds the image: the ConfigMap's entry for the version, else the
/// repository's tag of that version if the registry has it.
pub async fn resolve(registry: &Registry, l: &Lookup) -> Result<Found, LookupError> {
    let version = match version_from_tag(&l.release_image)? {
        Some(v) => v,
        None => {
            let release = ImageRef::parse(&l.release_image)
                .ok_or_else(|| LookupError::InvalidImageFormat(l.release_image.clone()))?;
            registry.release_version(&release, &l.credentials).await?
        }
    };
    let cm = format!("ConfigMap {}/{IMAGES_CONFIGMAP}", l.configmap_namespace);
    if let Some(image) = l.configured.as_ref().and_then(|d| d.get(&version)) {
        return Ok(Found {
            image: image.trim().to_string(),
            version,
            source: cm,
        });
    }
    let repo = ImageRef::parse(&l.repository)
        .filter(|r| r.tag.is_none() && r.digest.is_none())
        .ok_or_else(|| LookupError::InvalidRepository(l.repository.clone()))?;
    let image = ImageRef {
        tag: Some(version.clone()),
        ..repo
    };
    let wanted = format!("{}:{version}", l.repository.trim());
    if registry.exists(&image, &l.credentials).await? {
        return Ok(Found {
            image: wanted,
            version,
            source: "registry".into(),
        });
    }
    Err(LookupError::VersionNotFound {
        release: l.release_image.clone(),
        version: version.clone(),
        searched: vec![format!("{cm} key {version:?}"), wanted],
    })
}

/// Lookups with their answers kept for five minutes, shared by the
/// controller and the webhook. An answer that cannot be had in time is the
/// last one known.
#[derive(Clone)]
pub struct Resolver {
    registry: Registry,
    cache_for: Duration,
    cache: Arc<Mutex<Answers>>,
}

/// By (release, repository, whether the ConfigMap exists): when the answer
/// was had, and the answer.
type Answers = BTreeMap<(String, String, bool), (Instant, Result<Found, LookupError>)>;

impl Default for Resolver {
    fn default() -> Self {
        Resolver::with_cache_for(CACHE_FOR)
    }
}

impl Resolver {
    pub fn with_cache_for(cache_for: Duration) -> Resolver {
        Resolver {
            registry: Registry::new(),
            cache_for,
            cache: Arc::default(),
        }
    }

    fn key(l: &Lookup) -> (String, String, bool) {
        (
            l.release_image.clone(),
            l.repository.clone(),
            l.configured.is_some(),
        )
    }

    fn cached(&self, l: &Lookup, fresh_only: bool) -> Option<Result<Found, LookupError>> {
        let cache = self.cache.lock().ok()?;
        let (at, answer) = cache.get(&Self::key(l))?;
        (!fresh_only || at.elapsed() < self.cache_for).then(|| answer.clone())
    }

    /// The answer, from the cache while fresh. With `deadline`, a lookup
    /// that takes longer is answered from the last known result (and
    /// finishes in the background for next time); so is one the registry
    /// fails for a moment. With none known, either is a transient error.
    pub async fn resolve(
        &self,
        l: &Lookup,
        deadline: Option<Duration>,
    ) -> Result<Found, LookupError> {
        // A configured entry needs no registry: no caching either, so an
        // edit to the ConfigMap counts at once.
        if let (Ok(Some(v)), Some(data)) = (version_from_tag(&l.release_image), &l.configured) {
            if data.contains_key(&v) {
                return resolve(&self.registry, l).await;
            }
        }
        if let Some(answer) = self.cached(l, true) {
            return answer;
        }
        let me = self.clone();
        let lookup = l.clone();
        let task = tokio::spawn(async move {
            let answer = resolve(&me.registry, &lookup).await;
            // Only definite answers are kept: a registry that is down for a
            // moment does not replace what was known.
            if !answer.as_ref().is_err_and(LookupError::transient) {
                if let Ok(mut cache) = me.cache.lock() {
                    cache.insert(Self::key(&lookup), (Instant::now(), answer.clone()));
                }
            }
            answer
        });
        let registry_of = || {
            ImageRef::parse(&l.repository)
                .map(|r| r.registry)
                .unwrap_or_default()
        };
        let joined = match deadline {
            Some(d) => match tokio::time::timeout(d, task).await {
                Ok(j) => j,
                Err(_) => {
                    return self.cached(l, false).unwrap_or_else(|| {
                        Err(LookupError::RegistryAccess {
                            registry: registry_of(),
                            detail: format!("no answer within {d:?} and none known before"),
                        })
                    })
                }
            },
            None => task.await,
        };
        let answer = joined.unwrap_or_else(|e| {
            Err(LookupError::RegistryAccess {
                registry: registry_of(),
                detail: format!("lookup task: {e}"),
            })
        });
        match answer {
            Err(e) if e.transient() => self.cached(l, false).unwrap_or(Err(e)),
            other => other,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_tag_without_its_architecture() {
        for (release, want) in [
            ("quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64", Some("4.19.0-ec.5")),
            ("quay.io/openshift-release-dev/ocp-release:4.19.1-multi", Some("4.19.1")),
            ("quay.io/openshift-release-dev/ocp-release:4.20.0-arm64", Some("4.20.0")),
            ("registry.local:5000/ocp/release:4.18.3", Some("4.18.3")),
            ("quay.io/openshift-release-dev/ocp-release@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", None),
        ] {
            assert_eq!(version_from_tag(release).unwrap().as_deref(), want, "{release}");
        }
        for bad in [
            "",
            "quay.io/ocp-release",
            "registry.local:5000/ocp/release",
            "a b:1",
            "quay.io/x@nodigest",
        ] {
            assert_eq!(
                version_from_tag(bad).unwrap_err().reason(),
                "InvalidImageFormat",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn references_split_as_registries_address_them() {
        let r = ImageRef::parse("registry.local:5000/org/rhcos-bfb:4.19.0").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("registry.local:5000", "org/rhcos-bfb", Some("4.19.0"))
        );
        assert_eq!(r.base(), "https://registry.local:5000");
        assert_eq!(
            ImageRef::parse("127.0.0.1:5000/x/y").unwrap().base(),
            "http://127.0.0.1:5000"
        );
        assert_eq!(
            ImageRef::parse("ubuntu").unwrap().repository,
            "library/ubuntu"
        );
        assert_eq!(ImageRef::parse("org/img:1").unwrap().registry, "docker.io");
        assert!(ImageRef::parse("quay.io/Upper/case").is_none());
    }

    #[test]
    fn credentials_match_the_registry_host_exactly() {
        let c = Credentials::from_docker_config(
            br#"{"auths":{"quay.io":{"auth":"dXNlcjpwYXNz"},"https://reg.example:5000/":{"username":"a","password":"b:c"}}}"#,
        );
        assert_eq!(c.basic("quay.io").as_deref(), Some("Basic dXNlcjpwYXNz"));
        assert_eq!(
            c.basic("reg.example:5000").as_deref(),
            Some(
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("a:b:c")
                )
                .as_str()
            )
        );
        assert!(c.basic("quay.io:443").is_none() && c.basic("docker.io").is_none());
        assert!(Credentials::from_docker_config(b"not json")
            .basic("quay.io")
            .is_none());
    }

    #[test]
    fn bearer_challenges_are_read() {
        let c = bearer_challenge(r#"Bearer realm="https://quay.io/v2/auth",service="quay.io",scope="repository:a/b:pull""#).unwrap();
        assert_eq!(c["realm"], "https://quay.io/v2/auth");
        assert_eq!(c["service"], "quay.io");
        assert!(bearer_challenge("Basic realm=x").is_none());
    }

    #[test]
    fn errors_carry_the_go_operators_reasons() {
        let e = LookupError::VersionNotFound {
            release: "r:4.19.0".into(),
            version: "4.19.0".into(),
            searched: vec![
                "ConfigMap ns/ocp-bluefield-images key \"4.19.0\"".into(),
                "quay.io/x/bfb:4.19.0".into(),
            ],
        };
        assert_eq!(e.reason(), "VersionNotFound");
        assert!(!e.transient());
        let text = e.to_string();
        assert!(
            text.contains("4.19.0")
                && text.contains("ocp-bluefield-images")
                && text.contains("quay.io/x/bfb:4.19.0"),
            "{text}"
        );
        assert!(LookupError::RegistryAccess {
            registry: "r".into(),
            detail: "d".into()
        }
        .transient());
        assert_eq!(
            LookupError::InvalidRepository("x".into()).reason(),
            "InvalidBlueFieldOCPLayerImageURL"
        );
        assert_eq!(
            LookupError::RegistryAuth {
                registry: "r".into(),
                status: 401
            }
            .reason(),
            "RegistryAuthError"
        );
    }

    #[tokio::test]
    async fn a_configured_version_needs_no_registry() {
        let l = Lookup {
            release_image: "quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64".into(),
            // Unreachable on purpose: never asked.
            repository: "registry.invalid/x/bfb".into(),
            configured: Some(
                [(
                    "4.19.0-ec.5".to_string(),
                    "quay.io/mirror/bfb:4.19.0-ec.5".to_string(),
                )]
                .into(),
            ),
            configmap_namespace: "ops".into(),
            credentials: Credentials::default(),
        };
        let found = Resolver::default()
            .resolve(&l, Some(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(found.image, "quay.io/mirror/bfb:4.19.0-ec.5");
        assert_eq!(found.source, "ConfigMap ops/ocp-bluefield-images");
    }
}
