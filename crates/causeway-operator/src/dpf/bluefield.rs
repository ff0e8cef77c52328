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
//!
//! The registry host comes from the user (a release pinned by digest, the
//! repository setting), and the lookup runs during admission, so it is
//! held to [`RegistryPolicy`]: no loopback, link-local or unspecified
//! address is ever connected to (checked on every address a name resolves
//! to, by the connector itself, so a name cannot resolve differently
//! between the check and the connection), an optional allowlist of
//! registry hosts, a token realm only over HTTPS on the registry's own
//! host, and bodies read no further than [`MAX_JSON`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::k8s::json_limits::JsonLimits;

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
/// The most of a registry's JSON answer (manifest, index, image config,
/// token) that is read. Release manifests and configs are a few KiB.
pub const MAX_JSON: usize = 4 << 20;
/// How many redirects a blob GET follows.
const MAX_REDIRECTS: usize = 3;

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
    #[error("registry {registry} is not one of the allowed registries ({}); the operator's --bluefield-allowed-registries (chart value dpf.bluefield.allowedRegistries) lists them", allowed.join(", "))]
    RegistryNotAllowed {
        registry: String,
        allowed: Vec<String>,
    },
    #[error("registry {registry} resolves to {address}, a loopback, link-local, unspecified or (with no allowed registries listed) private address, which the lookup does not connect to")]
    AddressRefused { registry: String, address: IpAddr },
    #[error("registry {registry} sent a token realm {realm:?}, which is refused: {why}")]
    RealmRefused {
        registry: String,
        realm: String,
        why: &'static str,
    },
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
            LookupError::RegistryNotAllowed { .. } | LookupError::AddressRefused { .. } => {
                "RegistryNotAllowed"
            }
            LookupError::RealmRefused { .. } => "RegistryAuthError",
        }
    }

    /// Whether asking again without a change can give another answer.
    pub fn transient(&self) -> bool {
        matches!(self, LookupError::RegistryAccess { .. })
    }

    /// Whether the references' text alone gave this answer, no registry.
    pub fn from_text_alone(&self) -> bool {
        matches!(
            self,
            LookupError::InvalidImageFormat(_) | LookupError::InvalidRepository(_)
        )
    }

    /// What the webhook may say of this error to whoever sent the review:
    /// nothing a registry or the network said (transport errors, resolved
    /// addresses, token realms, whether credentials worked), which would
    /// make the webhook an oracle for them. The controller's condition on
    /// the provisioner, readable only by those who may read it, says all.
    pub fn public_message(&self) -> String {
        match self {
            LookupError::InvalidImageFormat(_)
            | LookupError::InvalidRepository(_)
            | LookupError::VersionNotFound { .. }
            | LookupError::RegistryNotAllowed { .. } => self.to_string(),
            _ => format!(
                "the lookup failed ({}); the provisioner's BlueFieldContainerImageAvailable condition has the detail",
                self.reason()
            ),
        }
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

/// Which registries the lookup may speak to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryPolicy {
    /// Registry hosts (`host[:port]`, as image references write them);
    /// empty: any registry at a public address.
    pub allowed: Vec<String>,
    /// Lets loopback addresses through (link-local and unspecified stay
    /// refused). For tests with a registry on loopback, never set by the
    /// operator.
    pub allow_loopback: bool,
}

static POLICY: OnceLock<RegistryPolicy> = OnceLock::new();

impl RegistryPolicy {
    /// Sets the policy of every [`Registry::new`] and
    /// [`Resolver::default`] in this process, once, before they are made;
    /// `false` if one was set already.
    pub fn install(self) -> bool {
        POLICY.set(self).is_ok()
    }

    fn installed() -> RegistryPolicy {
        POLICY.get().cloned().unwrap_or_default()
    }

    fn permits_host(&self, registry: &str) -> Result<(), LookupError> {
        if self.allowed.is_empty()
            || self
                .allowed
                .iter()
                .any(|a| a.trim().eq_ignore_ascii_case(registry))
        {
            return Ok(());
        }
        Err(LookupError::RegistryNotAllowed {
            registry: registry.to_string(),
            allowed: self.allowed.clone(),
        })
    }

    /// The first address the lookup must not connect to, if any. Private
    /// addresses (RFC 1918, the shared 100.64/10, IPv6 unique local: where
    /// Services, pods and the cluster's own machines live) are reached only
    /// when the operator lists the registries it may ask: whoever creates a
    /// provisioner names the registry, and must not get a probe of the
    /// cluster's inside out of it.
    fn refused_address(&self, addrs: &[SocketAddr]) -> Option<IpAddr> {
        let private_refused = self.allowed.is_empty();
        addrs
            .iter()
            .map(|a| a.ip().to_canonical())
            .find(|ip| match ip {
                IpAddr::V4(v4) => {
                    v4.is_unspecified()
                        || v4.is_link_local()
                        || (v4.is_loopback() && !self.allow_loopback)
                        || (private_refused
                            && (v4.is_private()
                                || (v4.octets()[0] == 100 && v4.octets()[1] & 0xc0 == 64)))
                }
                IpAddr::V6(v6) => {
                    v6.is_unspecified()
                        || v6.is_unicast_link_local()
                        || (v6.is_loopback() && !self.allow_loopback)
                        || (private_refused && v6.is_unique_local())
                }
            })
    }
}

/// Name resolution for the registry client: the system's, with every
/// answer checked against the policy, so the connector itself can never
/// reach a refused address, whatever a name resolves to at that moment.
#[derive(Clone)]
struct CheckedResolver {
    policy: Arc<RegistryPolicy>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0} resolves to {1}, a loopback, link-local or unspecified address")]
struct RefusedAddress(String, IpAddr);

impl tower_service::Service<Name> for CheckedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            match policy.refused_address(&addrs) {
                Some(ip) => Err(RefusedAddress(host, ip).into()),
                None => Ok(addrs.into_iter()),
            }
        })
    }
}

/// `host` and port of a registry (`host[:port]`, IPv6 in brackets).
fn host_and_port(authority: &str, default_port: u16) -> (String, u16) {
    match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => match p.parse() {
            Ok(port) => (h.trim_matches(['[', ']']).to_string(), port),
            Err(_) => (authority.to_string(), default_port),
        },
        _ => (authority.trim_matches(['[', ']']).to_string(), default_port),
    }
}

type Https = hyper_rustls::HttpsConnector<HttpConnector<CheckedResolver>>;

/// A registry client: manifest HEADs and JSON GETs, with basic and bearer
/// token authentication.
#[derive(Clone)]
pub struct Registry {
    http: HttpClient<Https, Empty<Bytes>>,
    policy: Arc<RegistryPolicy>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    /// A client under the process's [`RegistryPolicy`].
    pub fn new() -> Registry {
        Registry::with_policy(RegistryPolicy::installed())
    }

    pub fn with_policy(policy: RegistryPolicy) -> Registry {
        let policy = Arc::new(policy);
        let mut http = HttpConnector::new_with_resolver(CheckedResolver {
            policy: policy.clone(),
        });
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Registry {
            http: HttpClient::builder(TokioExecutor::new()).build(connector),
            policy,
        }
    }

    /// The allowlist, and every address the registry's name has now: a
    /// refused one is a definite answer, named, rather than a connection
    /// error from inside the client.
    async fn check_registry(&self, image: &ImageRef) -> Result<(), LookupError> {
        self.policy.permits_host(&image.registry)?;
        let base = image.base();
        let authority = base.split_once("://").map_or(base.as_str(), |(_, a)| a);
        let (host, port) = host_and_port(authority, 443);
        let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(LookupError::RegistryAccess {
                    registry: image.registry.clone(),
                    detail: format!("resolving {host}: {e}"),
                })
            }
        };
        match self.policy.refused_address(&addrs) {
            Some(address) => Err(LookupError::AddressRefused {
                registry: image.registry.clone(),
                address,
            }),
            None => Ok(()),
        }
    }

    /// A bearer realm is where the pull secret's credentials go: only
    /// over HTTPS and to the registry's own host (Docker Hub's token
    /// service, auth.docker.io, is the one other host it names).
    fn check_realm(image: &ImageRef, realm: &str) -> Result<http::Uri, LookupError> {
        let refused = |why: &'static str| LookupError::RealmRefused {
            registry: image.registry.clone(),
            realm: realm.to_string(),
            why,
        };
        let uri: http::Uri = realm.parse().map_err(|_| refused("not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(refused("not HTTPS"));
        }
        let realm_host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
        let base = image.base();
        let authority = base.split_once("://").map_or(base.as_str(), |(_, a)| a);
        let (registry_host, _) = host_and_port(authority, 443);
        let docker_hub =
            image.registry == "docker.io" && realm_host.eq_ignore_ascii_case("auth.docker.io");
        if !realm_host.eq_ignore_ascii_case(&registry_host) && !docker_hub {
            return Err(refused("not on the registry's host"));
        }
        Ok(uri)
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
        self.check_registry(image).await?;
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
        Self::check_realm(image, realm)?;
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

    /// A manifest (or index) of `image` by tag or digest, as JSON.
    pub async fn manifest(
        &self,
        image: &ImageRef,
        reference: &str,
        creds: &Credentials,
    ) -> Result<Value, LookupError> {
        self.get_json(image, &format!("manifests/{reference}"), creds)
            .await
    }

    /// A blob of `image`'s repository, its body unread, for the caller to
    /// stream. A redirect (registries hand blobs to a storage service) is
    /// followed without the credentials, at most [`MAX_REDIRECTS`] times,
    /// over HTTPS only unless the registry itself is spoken to in plain
    /// HTTP (loopback); every address is still held to the policy.
    pub async fn blob(
        &self,
        image: &ImageRef,
        digest: &str,
        creds: &Credentials,
    ) -> Result<http::Response<hyper::body::Incoming>, LookupError> {
        let access = |detail: String| LookupError::RegistryAccess {
            registry: image.registry.clone(),
            detail,
        };
        let url = format!("{}/v2/{}/blobs/{digest}", image.base(), image.repository);
        let mut r = self
            .authorized(http::Method::GET, image, &url, "*/*", creds)
            .await?;
        let mut at: http::Uri = url.parse().map_err(|_| access(format!("bad URL {url}")))?;
        for _ in 0..=MAX_REDIRECTS {
            match r.status().as_u16() {
                200..=299 => return Ok(r),
                301 | 302 | 303 | 307 | 308 => {
                    let location = r
                        .headers()
                        .get(http::header::LOCATION)
                        .and_then(|v| v.to_str().ok())
                        .ok_or_else(|| {
                            access(format!("GET {at}: a redirect without a Location"))
                        })?;
                    let next = redirect_target(&at, location).ok_or_else(|| {
                        access(format!("GET {at}: redirect to {location:?} refused"))
                    })?;
                    at = next;
                    r = self
                        .send(http::Method::GET, &at.to_string(), "*/*", None)
                        .await
                        .map_err(access)?;
                }
                s @ (401 | 403) => {
                    return Err(LookupError::RegistryAuth {
                        registry: image.registry.clone(),
                        status: s,
                    })
                }
                s => return Err(access(format!("GET {at}: HTTP {s}"))),
            }
        }
        Err(access(format!(
            "GET {url}: more than {MAX_REDIRECTS} redirects"
        )))
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

/// Where a redirect from `from` to `location` leads: relative locations
/// resolve against `from`; an absolute one must be HTTPS, or plain HTTP
/// when `from` was (a registry on loopback).
fn redirect_target(from: &http::Uri, location: &str) -> Option<http::Uri> {
    let target: http::Uri = location.parse().ok()?;
    match target.scheme_str() {
        Some("https") => Some(target),
        Some("http") if from.scheme_str() == Some("http") => Some(target),
        Some(_) => None,
        None => {
            let path = target.path_and_query()?.clone();
            http::Uri::builder()
                .scheme(from.scheme()?.clone())
                .authority(from.authority()?.clone())
                .path_and_query(path)
                .build()
                .ok()
        }
    }
}

/// The body as JSON, read no further than [`MAX_JSON`]: a registry that
/// streams without end is cut there, not buffered.
async fn read_json(r: http::Response<hyper::body::Incoming>) -> Result<Value, String> {
    // Room for a declared length at once: a buffer grown by doubling holds
    // up to twice what it was sent.
    let declared = r
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    if declared > MAX_JSON {
        return Err(format!("a JSON body over {} MiB", MAX_JSON >> 20));
    }
    let mut body = r.into_body();
    let mut buffer = bytes::BytesMut::with_capacity(declared);
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err("the body did not arrive in time".into()),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if buffer.len() + data.len() > MAX_JSON {
                        return Err(format!("a JSON body over {} MiB", MAX_JSON >> 20));
                    }
                    buffer.extend_from_slice(&data);
                }
            }
        }
    }
    // The text is bounded; what parsing it takes is bounded here, before
    // it is parsed.
    REGISTRY_JSON
        .measure(&buffer)
        .map_err(|e| format!("a JSON answer refused unparsed: {e}"))?;
    serde_json::from_slice(&buffer).map_err(|e| format!("not JSON: {e}"))
}

/// What one registry answer may hold. A manifest or an index is tens to a
/// few hundred values and an image config a few thousand (its history);
/// 16384 values cost at most 2 MiB parsed, on top of the text's 4 MiB.
pub const REGISTRY_JSON: JsonLimits = JsonLimits {
    max_values: 16_384,
    max_depth: 32,
};

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

/// The ConfigMap's entry for `version`, if it has one.
fn configured(l: &Lookup, version: &str) -> Option<Found> {
    let image = l.configured.as_ref()?.get(version)?;
    Some(Found {
        image: image.trim().to_string(),
        version: version.to_string(),
        source: format!("ConfigMap {}/{IMAGES_CONFIGMAP}", l.configmap_namespace),
    })
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
    if let Some(found) = configured(l, &version) {
        return Ok(found);
    }
    let cm = format!("ConfigMap {}/{IMAGES_CONFIGMAP}", l.configmap_namespace);
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

/// Lookups with their answers kept for five minutes. The controller asks
/// through it; the webhook reads what it knows ([`Resolver::known`]) and
/// never asks a registry itself. An answer that cannot be had is the last
/// one known.
///
/// What it holds is bounded whatever the objects name: at most
/// [`MAX_ANSWERS`] answers (the oldest goes first), none for a key longer
/// than [`MAX_KEY`] bytes, and none for a reference that does not parse,
/// which costs no registry call to work out again. At most
/// [`MAX_LOOKUPS`] lookups run at once in the process; a caller's lookup
/// ends when the caller stops waiting for it.
#[derive(Clone)]
pub struct Resolver {
    registry: Registry,
    cache_for: Duration,
    cache: Arc<Mutex<Answers>>,
    lookups: Arc<tokio::sync::Semaphore>,
}

/// Answers kept at most.
pub const MAX_ANSWERS: usize = 256;
/// The longest release and repository, together, whose answer is kept: the
/// CRD's `maxLength` of each (512) twice.
pub const MAX_KEY: usize = 1024;
/// Lookups running at once; each reads one registry answer at a time.
pub const MAX_LOOKUPS: usize = 4;

/// By (release, repository, whether the ConfigMap exists): when the answer
/// was had, and the answer.
type Answers = BTreeMap<(String, String, bool), (Instant, Result<Found, LookupError>)>;

impl Default for Resolver {
    fn default() -> Self {
        Resolver::with_cache_for(CACHE_FOR)
    }
}

static SHARED: OnceLock<Resolver> = OnceLock::new();

impl Resolver {
    /// Under the process's [`RegistryPolicy`].
    pub fn with_cache_for(cache_for: Duration) -> Resolver {
        Resolver::new(cache_for, RegistryPolicy::installed())
    }

    pub fn new(cache_for: Duration, policy: RegistryPolicy) -> Resolver {
        Resolver {
            registry: Registry::with_policy(policy),
            cache_for,
            cache: Arc::default(),
            lookups: Arc::new(tokio::sync::Semaphore::new(MAX_LOOKUPS)),
        }
    }

    /// The process's one resolver, so that what the controller learns the
    /// webhook knows; made on first use, under the installed policy.
    pub fn shared() -> Resolver {
        SHARED.get_or_init(Resolver::default).clone()
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

    fn keep(&self, l: &Lookup, answer: &Result<Found, LookupError>) {
        // A registry down for a moment does not replace what was known, and
        // what the text alone decides is not worth a place.
        let worth_keeping = match answer {
            Ok(_) => true,
            Err(e) => !e.transient() && !e.from_text_alone(),
        };
        if !worth_keeping || l.release_image.len() + l.repository.len() > MAX_KEY {
            return;
        }
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        cache.insert(Self::key(l), (Instant::now(), answer.clone()));
        while cache.len() > MAX_ANSWERS {
            let oldest = cache
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => cache.remove(&k),
                None => break,
            };
        }
    }

    /// How many answers are kept, for tests and metrics.
    pub fn answers_kept(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or_default()
    }

    /// What is known without asking a registry: the ConfigMap's entry for a
    /// release whose tag names its version, a reference that cannot be
    /// looked up at all, or the last answer kept (however old). `None`
    /// when only a registry could say.
    pub fn known(&self, l: &Lookup) -> Option<Result<Found, LookupError>> {
        match version_from_tag(&l.release_image) {
            Err(e) => return Some(Err(e)),
            Ok(Some(v)) => {
                if let Some(found) = configured(l, &v) {
                    return Some(Ok(found));
                }
            }
            Ok(None) => {
                if ImageRef::parse(&l.release_image).is_none() {
                    return Some(Err(LookupError::InvalidImageFormat(
                        l.release_image.clone(),
                    )));
                }
            }
        }
        self.cached(l, false)
    }

    /// The answer, from the cache while fresh. With `deadline`, a lookup
    /// that takes longer is answered from the last known result; so is one
    /// the registry fails for a moment. With none known, either is a
    /// transient error. A lookup the caller stops waiting for is ended.
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
        let registry_of = || {
            ImageRef::parse(&l.repository)
                .map(|r| r.registry)
                .unwrap_or_default()
        };
        let lookup = async {
            let _turn = self.lookups.acquire().await;
            let answer = resolve(&self.registry, l).await;
            self.keep(l, &answer);
            answer
        };
        let answer = match deadline {
            Some(d) => match tokio::time::timeout(d, lookup).await {
                Ok(answer) => answer,
                Err(_) => {
                    return self.cached(l, false).unwrap_or_else(|| {
                        Err(LookupError::RegistryAccess {
                            registry: registry_of(),
                            detail: format!("no answer within {d:?} and none known before"),
                        })
                    })
                }
            },
            None => lookup.await,
        };
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
    fn a_blob_redirect_stays_on_https_unless_the_registry_is_plain_http() {
        let https: http::Uri = "https://quay.io/v2/ocp/release/blobs/sha256:1"
            .parse()
            .unwrap();
        let plain: http::Uri = "http://127.0.0.1:5000/v2/r/blobs/sha256:1".parse().unwrap();
        assert_eq!(
            redirect_target(&https, "https://cdn.example/blob?sig=x")
                .unwrap()
                .to_string(),
            "https://cdn.example/blob?sig=x"
        );
        assert_eq!(
            redirect_target(&https, "/v2/ocp/release/blobs/uploads/x")
                .unwrap()
                .to_string(),
            "https://quay.io/v2/ocp/release/blobs/uploads/x"
        );
        assert!(redirect_target(&https, "http://cdn.example/blob").is_none());
        assert!(redirect_target(&https, "ftp://cdn.example/blob").is_none());
        assert_eq!(
            redirect_target(&plain, "http://127.0.0.1:5000/other")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:5000/other"
        );
        assert!(redirect_target(&https, "not a url").is_none());
    }

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

    /// A registry of our own on loopback that answers every `/v2/` request
    /// with `answer` and a token request with a token; what was asked.
    struct Fake {
        port: u16,
        asked: Arc<Mutex<Vec<String>>>,
        task: tokio::task::JoinHandle<()>,
    }

    #[derive(Clone)]
    enum Answer {
        Challenge(String),
        Endless,
        Empty,
        Json(Bytes),
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// `answer` is given the fake's port.
    async fn fake(answer: impl FnOnce(u16) -> Answer) -> Fake {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = answer(port);
        let asked: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = asked.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    return;
                };
                let (answer, log) = (answer.clone(), log.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let line = String::from_utf8_lossy(&head)
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let token = line.contains("/token");
                    log.lock().unwrap().push(line);
                    let _ = match (&answer, token) {
                        (_, true) => {
                            tcp.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"token\":\"t\"}\r\n")
                                .await
                        }
                        (Answer::Challenge(realm), false) => {
                            tcp.write_all(format!("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"{realm}\",service=\"x\"\r\nContent-Length: 0\r\n\r\n").as_bytes())
                                .await
                        }
                        (Answer::Empty, false) => {
                            tcp.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                                .await
                        }
                        (Answer::Json(body), false) => {
                            let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                            match tcp.write_all(head.as_bytes()).await {
                                Ok(()) => tcp.write_all(body).await,
                                Err(e) => Err(e),
                            }
                        }
                        (Answer::Endless, false) => {
                            let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                            if tcp.write_all(head).await.is_err() {
                                return;
                            }
                            let chunk = format!("10000\r\n{}\r\n", "[".repeat(0x10000));
                            // Until the client hangs up.
                            while tcp.write_all(chunk.as_bytes()).await.is_ok() {}
                            Ok(())
                        }
                    };
                });
            }
        });
        Fake { port, asked, task }
    }

    fn loopback() -> RegistryPolicy {
        RegistryPolicy {
            allow_loopback: true,
            ..RegistryPolicy::default()
        }
    }

    #[tokio::test]
    async fn a_token_realm_elsewhere_or_over_plain_http_is_refused() {
        for (realm, why) in [
            ("https://other.example/token", "not on the registry's host"),
            ("https://127.0.0.2/token", "not on the registry's host"),
            ("http://127.0.0.1:PORT/token", "not HTTPS"),
        ] {
            let server =
                fake(|port| Answer::Challenge(realm.replace("PORT", &port.to_string()))).await;
            let realm = realm.replace("PORT", &server.port.to_string());
            let image =
                ImageRef::parse(&format!("127.0.0.1:{}/org/bfb:4.19.0", server.port)).unwrap();
            let e = Registry::with_policy(loopback())
                .exists(&image, &Credentials::default())
                .await
                .unwrap_err();
            assert!(
                matches!(&e, LookupError::RealmRefused { why: w, .. } if *w == why),
                "{realm}: {e}"
            );
            assert!(e.to_string().contains(&realm), "{e}");
            assert!(!e.transient());
            // The pull secret never went anywhere: no token was asked for.
            let asked = server.asked.lock().unwrap().clone();
            assert!(asked.iter().all(|l| !l.contains("/token")), "{asked:?}");
        }
    }

    #[tokio::test]
    async fn an_endless_body_is_cut_at_the_cap() {
        let server = fake(|_| Answer::Endless).await;
        let release = ImageRef::parse(&format!(
            "127.0.0.1:{}/ocp/release@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            server.port
        ))
        .unwrap();
        let started = Instant::now();
        let e = Registry::with_policy(loopback())
            .release_version(&release, &Credentials::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LookupError::RegistryAccess { detail, .. } if detail.contains("over 4 MiB")),
            "{e}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn loopback_and_link_local_registries_are_refused_unless_allowed() {
        let server = fake(|_| Answer::Empty).await;
        let creds = Credentials::default();
        for name in [
            format!("127.0.0.1:{}", server.port),
            format!("localhost:{}", server.port),
        ] {
            let image = ImageRef::parse(&format!("{name}/org/bfb:4.19.0")).unwrap();
            let e = Registry::with_policy(RegistryPolicy::default())
                .exists(&image, &creds)
                .await
                .unwrap_err();
            assert!(
                matches!(&e, LookupError::AddressRefused { address, .. } if address.is_loopback()),
                "{name}: {e}"
            );
            assert_eq!(e.reason(), "RegistryNotAllowed");
        }
        assert!(server.asked.lock().unwrap().is_empty());
        // Link-local (the cloud metadata address) even with loopback let
        // through: refused before any connection.
        let metadata = ImageRef::parse("169.254.169.254/org/bfb:4.19.0").unwrap();
        let e = Registry::with_policy(loopback())
            .exists(&metadata, &creds)
            .await
            .unwrap_err();
        assert!(matches!(e, LookupError::AddressRefused { .. }), "{e}");
        // An allowlist: other registries are refused by name.
        let listed = RegistryPolicy {
            allowed: vec![
                "registry.example".into(),
                format!("127.0.0.1:{}", server.port),
            ],
            allow_loopback: true,
        };
        let e = Registry::with_policy(listed.clone())
            .exists(&ImageRef::parse("quay.io/org/bfb:4.19.0").unwrap(), &creds)
            .await
            .unwrap_err();
        assert!(matches!(e, LookupError::RegistryNotAllowed { .. }), "{e}");
        assert!(e.to_string().contains("registry.example"), "{e}");
        // Allowed: the registry is asked.
        let image = ImageRef::parse(&format!("127.0.0.1:{}/org/bfb:4.19.0", server.port)).unwrap();
        assert!(!Registry::with_policy(listed)
            .exists(&image, &creds)
            .await
            .unwrap());
        assert_eq!(server.asked.lock().unwrap().len(), 1);
    }
    /// A provisioner's registry cannot point the
    /// lookup at the cluster's inside (Services, pods, machines) unless the
    /// operator lists the registries it may ask.
    #[test]
    fn private_addresses_are_refused_unless_registries_are_listed() {
        let at = |ip: &str| [SocketAddr::new(ip.parse().unwrap(), 443)];
        let open = RegistryPolicy::default();
        for ip in [
            "10.96.0.1",
            "172.16.5.4",
            "192.168.1.10",
            "100.64.0.9",
            "fd00::1",
        ] {
            assert!(open.refused_address(&at(ip)).is_some(), "{ip} reached");
        }
        for ip in ["8.8.8.8", "100.128.0.1", "2606:4700::1111"] {
            assert!(open.refused_address(&at(ip)).is_none(), "{ip} refused");
        }
        let listed = RegistryPolicy {
            allowed: vec!["mirror.internal:5000".into()],
            allow_loopback: false,
        };
        assert!(listed.refused_address(&at("10.0.0.5")).is_none());
        assert!(listed.refused_address(&at("169.254.169.254")).is_some());
    }

    const REGISTRY_ATTACK: &str = "dpf::bluefield::tests::hostile_registry_answers_in_parallel_keep_the_lookups_within_their_memory_bound";

    /// A registry answers every lookup
    /// with the largest JSON the client reads, `{"manifests":[0,0,…]}`,
    /// while 16 lookups run at once. The lookups, in a child process of
    /// their own, keep its peak memory (VmHWM) within 48 MiB of where it
    /// started.
    #[test]
    fn hostile_registry_answers_in_parallel_keep_the_lookups_within_their_memory_bound() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let lookups = 16;
        if crate::child_process::is_child(REGISTRY_ATTACK) {
            let port: u16 = std::env::var("CAUSEWAY_TEST_REGISTRY")
                .unwrap()
                .parse()
                .unwrap();
            rt.block_on(async {
                let resolver = Resolver::new(Duration::ZERO, loopback());
                println!("BASELINE {}", crate::child_process::peak_kib());
                let mut tasks = Vec::new();
                for i in 0..lookups {
                    let (resolver, l) = (
                        resolver.clone(),
                        Lookup {
                            release_image: format!("127.0.0.1:{port}/ocp/release@sha256:{i:064x}"),
                            repository: format!("127.0.0.1:{port}/org/bfb"),
                            configured: None,
                            configmap_namespace: "ops".into(),
                            credentials: Credentials::default(),
                        },
                    );
                    tasks.push(tokio::spawn(
                        async move { resolver.resolve(&l, None).await },
                    ));
                }
                let mut outcomes = Vec::new();
                for t in tasks {
                    outcomes.push(match t.await.unwrap() {
                        Ok(f) => f.image,
                        Err(e) => e.reason().to_string(),
                    });
                }
                println!("OUTCOMES {outcomes:?}");
                println!("PEAK {}", crate::child_process::peak_kib());
            });
            return;
        }
        let mut body = b"{\"manifests\":[0".to_vec();
        while body.len() + 4 < MAX_JSON {
            body.extend_from_slice(b",0");
        }
        body.extend_from_slice(b"]}");
        let body = Bytes::from(body);
        let registry = rt.block_on(fake(|_| Answer::Json(body.clone())));
        let mut child = crate::child_process::spawn(
            REGISTRY_ATTACK,
            &[("CAUSEWAY_TEST_REGISTRY", registry.port.to_string())],
        );
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let baseline: u64 = crate::child_process::line(&mut out, "BASELINE")
            .parse()
            .unwrap();
        let outcomes = crate::child_process::line(&mut out, "OUTCOMES");
        let peak: u64 = crate::child_process::line(&mut out, "PEAK")
            .parse()
            .unwrap();
        assert!(child.wait().unwrap().success());
        let asked = registry.asked.lock().unwrap().len();
        let rise = peak.saturating_sub(baseline);
        println!(
            "lookups' VmHWM {baseline} KiB at rest, {peak} KiB at most with {lookups} lookups of {} KiB [0,0,…] answers (+{rise} KiB); registry asked {asked} times; outcomes {outcomes}",
            body.len() >> 10
        );
        assert!(asked >= lookups, "the registry was asked {asked} times");
        assert!(
            rise < 48 << 10,
            "the lookups' peak memory rose {} MiB with {lookups} hostile registry answers (bound 48 MiB)",
            rise >> 10
        );
    }

    /// References the text alone refutes are never kept,
    /// and however many distinct references are looked up, at most
    /// [`MAX_ANSWERS`] answers are.
    #[tokio::test]
    async fn the_answers_kept_are_bounded_and_invalid_references_are_not_kept() {
        let resolver = Resolver::new(Duration::from_secs(300), RegistryPolicy::default());
        for i in 0..64 {
            let l = Lookup {
                release_image: format!("not a reference {i} {}", "x".repeat(4096)),
                repository: "quay.io/org/bfb".into(),
                configured: None,
                configmap_namespace: "ops".into(),
                credentials: Credentials::default(),
            };
            let e = resolver.resolve(&l, None).await.unwrap_err();
            assert_eq!(e.reason(), "InvalidImageFormat");
        }
        assert_eq!(resolver.answers_kept(), 0, "invalid references were kept");
        for i in 0..(MAX_ANSWERS + 100) {
            let l = Lookup {
                release_image: format!("quay.io/ocp/release:4.{i}.0-x86_64"),
                repository: "quay.io/org/bfb".into(),
                configured: None,
                configmap_namespace: "ops".into(),
                credentials: Credentials::default(),
            };
            resolver.keep(
                &l,
                &Err(LookupError::VersionNotFound {
                    release: l.release_image.clone(),
                    version: format!("4.{i}.0"),
                    searched: Vec::new(),
                }),
            );
        }
        assert_eq!(resolver.answers_kept(), MAX_ANSWERS);
        // The oldest went first.
        let asked = |i: usize| Lookup {
            release_image: format!("quay.io/ocp/release:4.{i}.0-x86_64"),
            repository: "quay.io/org/bfb".into(),
            configured: None,
            configmap_namespace: "ops".into(),
            credentials: Credentials::default(),
        };
        assert!(resolver.cached(&asked(0), false).is_none());
        assert!(resolver.cached(&asked(MAX_ANSWERS + 99), false).is_some());
        // A valid reference past the key bound is answered, not kept.
        let long = Lookup {
            release_image: format!("quay.io/ocp/{}:4.1.0-x86_64", "r".repeat(MAX_KEY)),
            ..asked(0)
        };
        resolver.keep(
            &long,
            &Err(LookupError::VersionNotFound {
                release: long.release_image.clone(),
                version: "4.1.0".into(),
                searched: Vec::new(),
            }),
        );
        assert!(resolver.cached(&long, false).is_none());
    }
}
