//! A client for OCI registries (the distribution API): manifests, blobs
//! and whether a tag exists, with the pull secret's credentials and
//! registries' bearer-token challenges, and nothing more. The BlueField
//! image lookup and the DPU service templates read registries through it.
//!
//! Registry hosts come from users (a release pinned by digest, a
//! repository setting, a chart reference), and some lookups run during
//! admission, so every connection is held to a [`RegistryPolicy`]: no
//! loopback, link-local or unspecified address is ever connected to
//! (checked on every address a name resolves to, by the connector itself,
//! so a name cannot resolve differently between the check and the
//! connection), an optional allowlist of registry hosts, a token realm only
//! over HTTPS on the registry's own host, and bodies read no further than
//! [`MAX_JSON`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::k8s::json_limits::JsonLimits;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// A registry that does not answer within this is an access error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a registry's JSON answer read: far above any real
/// manifest, index or image config.
pub const MAX_JSON: usize = 4 << 20;
/// How many redirects a blob GET follows.
const MAX_REDIRECTS: usize = 3;

/// What a registry answered, or why it could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("registry {registry} refused the pull secret's credentials (HTTP {status})")]
    Auth { registry: String, status: u16 },
    #[error("registry {registry}: {detail}")]
    Access { registry: String, detail: String },
    #[error("registry {registry} is not one of the allowed registries ({}); the operator's --bluefield-allowed-registries (chart value dpf.bluefield.allowedRegistries) lists them", allowed.join(", "))]
    NotAllowed {
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

    pub(crate) fn installed() -> RegistryPolicy {
        POLICY.get().cloned().unwrap_or_default()
    }

    fn permits_host(&self, registry: &str) -> Result<(), RegistryError> {
        if self.allowed.is_empty()
            || self
                .allowed
                .iter()
                .any(|a| a.trim().eq_ignore_ascii_case(registry))
        {
            return Ok(());
        }
        Err(RegistryError::NotAllowed {
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
    pub(crate) fn refused_address(&self, addrs: &[SocketAddr]) -> Option<IpAddr> {
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
    async fn check_registry(&self, image: &ImageRef) -> Result<(), RegistryError> {
        self.policy.permits_host(&image.registry)?;
        let base = image.base();
        let authority = base.split_once("://").map_or(base.as_str(), |(_, a)| a);
        let (host, port) = host_and_port(authority, 443);
        let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(RegistryError::Access {
                    registry: image.registry.clone(),
                    detail: format!("resolving {host}: {e}"),
                })
            }
        };
        match self.policy.refused_address(&addrs) {
            Some(address) => Err(RegistryError::AddressRefused {
                registry: image.registry.clone(),
                address,
            }),
            None => Ok(()),
        }
    }

    /// A bearer realm is where the pull secret's credentials go: only
    /// over HTTPS and to the registry's own host (Docker Hub's token
    /// service, auth.docker.io, is the one other host it names).
    fn check_realm(image: &ImageRef, realm: &str) -> Result<http::Uri, RegistryError> {
        let refused = |why: &'static str| RegistryError::RealmRefused {
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
    ) -> Result<http::Response<hyper::body::Incoming>, RegistryError> {
        let access = |detail: String| RegistryError::Access {
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
            return Err(RegistryError::Auth {
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
            return Err(RegistryError::Auth {
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
    pub async fn exists(
        &self,
        image: &ImageRef,
        creds: &Credentials,
    ) -> Result<bool, RegistryError> {
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
            s @ (401 | 403) => Err(RegistryError::Auth {
                registry: image.registry.clone(),
                status: s,
            }),
            s => Err(RegistryError::Access {
                registry: image.registry.clone(),
                detail: format!("HEAD {url}: HTTP {s}"),
            }),
        }
    }

    pub async fn get_json(
        &self,
        image: &ImageRef,
        path: &str,
        creds: &Credentials,
    ) -> Result<Value, RegistryError> {
        let url = format!("{}/v2/{}/{path}", image.base(), image.repository);
        let r = self
            .authorized(http::Method::GET, image, &url, MANIFEST_TYPES, creds)
            .await?;
        match r.status().as_u16() {
            200..=299 => read_json(r).await.map_err(|detail| RegistryError::Access {
                registry: image.registry.clone(),
                detail,
            }),
            s @ (401 | 403) => Err(RegistryError::Auth {
                registry: image.registry.clone(),
                status: s,
            }),
            s => Err(RegistryError::Access {
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
    ) -> Result<Value, RegistryError> {
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
    ) -> Result<http::Response<hyper::body::Incoming>, RegistryError> {
        let access = |detail: String| RegistryError::Access {
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
                    return Err(RegistryError::Auth {
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
}
