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
//! The registry is read through [`crate::registry`], under its policy.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::registry::RegistryError;
use crate::registry::{Credentials, ImageRef, Registry, RegistryPolicy};

pub const IMAGES_CONFIGMAP: &str = "ocp-bluefield-images";
/// The image label a release carries its version in.
const RELEASE_LABEL: &str = "io.openshift.release";
const ARCH_SUFFIXES: [&str; 6] = [
    "-multi", "-amd64", "-arm64", "-ppc64le", "-s390x", "-x86_64",
];
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

impl From<RegistryError> for LookupError {
    fn from(e: RegistryError) -> LookupError {
        match e {
            RegistryError::Auth { registry, status } => {
                LookupError::RegistryAuth { registry, status }
            }
            RegistryError::Access { registry, detail } => {
                LookupError::RegistryAccess { registry, detail }
            }
            RegistryError::NotAllowed { registry, allowed } => {
                LookupError::RegistryNotAllowed { registry, allowed }
            }
            RegistryError::AddressRefused { registry, address } => {
                LookupError::AddressRefused { registry, address }
            }
            RegistryError::RealmRefused {
                registry,
                realm,
                why,
            } => LookupError::RealmRefused {
                registry,
                realm,
                why,
            },
        }
    }
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

/// The OpenShift version of a release pinned by digest: its config's
/// `io.openshift.release` label (of the first image of an index).
pub async fn release_version(
    registry: &Registry,
    release: &ImageRef,
    creds: &Credentials,
) -> Result<String, LookupError> {
    let digest = release.digest.clone().unwrap_or_default();
    let mut manifest = registry
        .get_json(release, &format!("manifests/{digest}"), creds)
        .await?;
    if let Some(first) = manifest["manifests"][0]["digest"].as_str() {
        manifest = registry
            .get_json(release, &format!("manifests/{first}"), creds)
            .await?;
    }
    let config = manifest["config"]["digest"].as_str().ok_or_else(|| {
        LookupError::InvalidImageFormat(format!("{}@{digest}", release.repository))
    })?;
    let config = registry
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
            release_version(registry, &release, &l.credentials).await?
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
    use crate::registry::MAX_JSON;
    use bytes::Bytes;
    use std::net::SocketAddr;

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
                .map_err(LookupError::from)
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
        let e = release_version(
            &Registry::with_policy(loopback()),
            &release,
            &Credentials::default(),
        )
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
                .map_err(LookupError::from)
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
        assert!(matches!(e, RegistryError::AddressRefused { .. }), "{e}");
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
        assert!(matches!(e, RegistryError::NotAllowed { .. }), "{e}");
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
}
