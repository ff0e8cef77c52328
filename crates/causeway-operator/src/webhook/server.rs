//! The webhook's HTTPS endpoint: `POST /validate` with an AdmissionReview.
//! Every read comes from a cache (the BlueField table, the bridge's
//! settings, the BlueField answers the controller learned): a review makes
//! no API call and no registry call, whoever sent it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Client;
use tokio::sync::Semaphore;

use super::admit::{self, ImageCheck};
use super::tls::{CertError, ReloadingCert};
use crate::dpf::bluefield::{self, Lookup, Resolver};
use crate::dpf::crd::{BridgeSettings, DPFHCPProvisionerConfig, DPFHCPProvisionerSpec};
use crate::k8s::json_limits::{JsonLimits, JsonShape};
use crate::k8s::watch::cached;
use crate::registry::Credentials;

/// The path the webhook configuration names.
pub const PATH: &str = "/validate";
/// hyper's read buffer per connection. A review's headers are a few
/// hundred bytes; hyper's default (about 400 KiB) times every connection
/// slot would be 100 MiB of headers held by clients that never finish.
const READ_BUFFER: usize = 64 << 10;

/// What one client, and all of them together, may hold of the webhook.
/// Every connection that can reach the port gets a slot; these bound how
/// long a slot is kept by a client that does not finish, how many slots
/// and how much memory one source address may hold, and how much memory
/// request bodies and their parsing take.
#[derive(Debug, Clone)]
pub struct Limits {
    pub handshake: Duration,
    /// From the first byte awaited to the end of the request's headers.
    /// hyper starts it again as soon as a response is written, so it is
    /// also how long an idle kept-alive connection stays open.
    pub header_read: Duration,
    /// From the end of the headers to the end of the body (including the
    /// wait for room among the bodies in flight).
    pub body_read: Duration,
    /// The largest body read. The API server's objects are at most
    /// 1.5 MiB (etcd's default request limit), and a review carries two
    /// (object and oldObject) and a small envelope, so 4 MiB admits every
    /// review the API server can send and refuses anything larger unread.
    pub max_body: usize,
    /// What a review may hold: a real one of our kinds, with both objects'
    /// managedFields, is a few thousand values.
    pub review_json: JsonLimits,
    /// Memory held for requests across all connections at once. When a
    /// body's first bytes arrive, its request takes its declared length
    /// (or `max_body`) and the most parsing that much JSON can cost
    /// within `review_json` ([`JsonShape::parsed_bytes`]): 12 MiB for the
    /// largest body, a few hundred KiB for a real review. It is kept until
    /// answered. A header that declares a length holds nothing.
    pub memory_in_flight: usize,
    /// The share of `memory_in_flight` one source address may hold.
    pub memory_per_source: usize,
    pub max_connections: usize,
    /// Connections one source address may hold: the API server's calls
    /// are spread over a few, an attacker's over as many as it can open.
    pub connections_per_source: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            max_body: 4 << 20,
            review_json: JsonLimits {
                max_values: 65_536,
                max_depth: 64,
            },
            memory_in_flight: 32 << 20,
            memory_per_source: 16 << 20,
            max_connections: 256,
            connections_per_source: 64,
        }
    }
}

impl Limits {
    /// What a body of `len` bytes is charged: itself and the most its parse
    /// can cost, since each value after the first takes at least two bytes
    /// of text and no more than `review_json` allows are parsed at all.
    pub fn charge(&self, len: usize) -> usize {
        JsonShape {
            bytes: len,
            values: self.review_json.max_values.min(len / 2 + 1),
            depth: 0,
        }
        .parsed_bytes()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook certificate: {0}")]
    Cert(#[from] CertError),
    #[error("webhook listener on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

struct Context {
    operator_namespace: String,
    images: Store<ConfigMap>,
    configs: Store<DPFHCPProvisionerConfig>,
    resolver: Resolver,
}

/// Turns a review's body into the response review's JSON.
type Answer =
    Arc<dyn Fn(Bytes) -> Pin<Box<dyn std::future::Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// Room for requests' memory across connections and per source, and what
/// is held now.
struct Memory {
    room: Semaphore,
    per_source: usize,
    connections_per_source: usize,
    sources: Mutex<HashMap<IpAddr, Arc<Source>>>,
    /// Bytes held for requests (bodies and parse charges) not yet answered.
    held: AtomicUsize,
    /// The most `held` has been, for tests.
    #[cfg_attr(not(test), allow(dead_code))]
    peak: AtomicUsize,
}

/// One source address's share: its connections and its room.
struct Source {
    connections: AtomicUsize,
    room: Semaphore,
}

impl Memory {
    fn new(limits: &Limits) -> Memory {
        Memory {
            room: Semaphore::new(limits.memory_in_flight.min(Semaphore::MAX_PERMITS)),
            per_source: limits.memory_per_source.min(Semaphore::MAX_PERMITS),
            connections_per_source: limits.connections_per_source,
            sources: Mutex::default(),
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// A connection from `ip`, or `None` when that source holds its share
    /// of connections already. The entry goes when its last connection
    /// does, so the table is never larger than the connections open.
    fn connect(self: &Arc<Self>, ip: IpAddr) -> Option<Connection> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let source = sources
            .entry(ip.to_canonical())
            .or_insert_with(|| {
                Arc::new(Source {
                    connections: AtomicUsize::new(0),
                    room: Semaphore::new(self.per_source),
                })
            })
            .clone();
        if source.connections.load(Ordering::Relaxed) >= self.connections_per_source {
            return None;
        }
        source.connections.fetch_add(1, Ordering::Relaxed);
        Some(Connection {
            memory: self.clone(),
            ip: ip.to_canonical(),
            source,
        })
    }

    fn add(&self, n: usize) {
        let now = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// A connection's place in [`Memory`]: its source's share.
struct Connection {
    memory: Arc<Memory>,
    ip: IpAddr,
    source: Arc<Source>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut sources = self
            .memory
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.source.connections.fetch_sub(1, Ordering::Relaxed) == 1 {
            sources.remove(&self.ip);
        }
    }
}

/// What one request holds of [`Memory`], given back when dropped.
struct Held<'a> {
    memory: &'a Memory,
    bytes: usize,
    own: Option<tokio::sync::SemaphorePermit<'a>>,
    all: Option<tokio::sync::SemaphorePermit<'a>>,
}

impl<'a> Held<'a> {
    /// Takes `n` more bytes of room, from the source's share and from the
    /// whole, waiting no later than `deadline`; `false` if there was none.
    async fn take(&mut self, source: &'a Source, n: usize, deadline: tokio::time::Instant) -> bool {
        let Ok(n32) = u32::try_from(n) else {
            return false;
        };
        if n32 == 0 {
            return true;
        }
        let both = async {
            let own = source.room.acquire_many(n32).await.ok()?;
            let all = self.memory.room.acquire_many(n32).await.ok()?;
            Some((own, all))
        };
        match tokio::time::timeout_at(deadline, both).await {
            Ok(Some((own, all))) => {
                merge(&mut self.own, own);
                merge(&mut self.all, all);
                self.memory.add(n);
                self.bytes += n;
                true
            }
            _ => false,
        }
    }
}

fn merge<'a>(
    into: &mut Option<tokio::sync::SemaphorePermit<'a>>,
    more: tokio::sync::SemaphorePermit<'a>,
) {
    match into {
        Some(p) => p.merge(more),
        None => *into = Some(more),
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.memory.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Binds `listen` and serves until `shutdown`. The certificate must load
/// now; later changes to its files are picked up as they come, and
/// `expiry` follows the served one's notAfter.
pub async fn run(
    listen: SocketAddr,
    cert_dir: &Path,
    client: Client,
    operator_namespace: String,
    expiry: Option<prometheus::IntGauge>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, WebhookError> {
    let cert = Arc::new(ReloadingCert::with_expiry(cert_dir, expiry)?);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cert.server_config()));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| WebhookError::Listen(listen, e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| WebhookError::Listen(listen, e))?;
    let (images, images_stream) = cached(
        Api::<ConfigMap>::namespaced(client.clone(), &operator_namespace),
        watcher::Config::default()
            .fields(&format!("metadata.name={}", bluefield::IMAGES_CONFIGMAP)),
    );
    let (configs, configs_stream) = cached(
        Api::<DPFHCPProvisionerConfig>::all(client.clone()),
        watcher::Config::default(),
    );
    let ctx = Arc::new(Context {
        operator_namespace,
        images,
        configs,
        resolver: Resolver::shared(),
    });
    tracing::info!(listen = %bound, cert = %cert_dir.display(), "admission webhook serving");
    let answer: Answer = Arc::new(move |body| {
        let ctx = ctx.clone();
        Box::pin(async move { review(&ctx, &body) })
    });
    let caches = futures::stream::select(images_stream.map(|_| ()), configs_stream.map(|_| ()))
        .for_each(|()| async {});
    let limits = Limits::default();
    let memory = Arc::new(Memory::new(&limits));
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => {}
            _ = serve(listener, acceptor, limits, memory, answer) => {}
            _ = caches => {}
        }
    });
    Ok(bound)
}

/// Accepts connections and answers reviews on them, within `limits`.
async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    limits: Limits,
    memory: Arc<Memory>,
    answer: Answer,
) {
    let limits = Arc::new(limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors or similar: wait rather than spin.
                tracing::warn!(error = %e, "webhook accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Closed at once, before it can take a slot of the whole.
        let Some(connection) = memory.connect(peer.ip()) else {
            tracing::debug!(%peer, "webhook: the source holds its share of connections");
            continue;
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (acceptor, limits, answer) = (acceptor.clone(), limits.clone(), answer.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let connection = Arc::new(connection);
            let tls = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "webhook TLS handshake");
                    return;
                }
                Err(_) => return,
            };
            let conn_limits = limits.clone();
            let service = service_fn(move |req| {
                handle(conn_limits.clone(), connection.clone(), answer.clone(), req)
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .max_buf_size(READ_BUFFER)
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "webhook connection");
            }
        });
    }
}

fn reply(status: u16, content_type: &str, body: Vec<u8>) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn text(status: u16, message: String) -> http::Response<Full<Bytes>> {
    let mut r = reply(status, "text/plain", message.into_bytes());
    // A body left unread ends the connection: say so rather than have the
    // client find out on its next request.
    if status >= 400 {
        r.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    r
}

async fn handle(
    limits: Arc<Limits>,
    connection: Arc<Connection>,
    answer: Answer,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != PATH {
        return Ok(text(404, format!("not found: the webhook is at {PATH}\n")));
    }
    if req.method() != http::Method::POST {
        return Ok(text(405, "POST an AdmissionReview\n".into()));
    }
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_big = || {
        text(
            413,
            format!(
                "request body over {} bytes: an AdmissionReview is never that large\n",
                limits.max_body
            ),
        )
    };
    let reserve = match declared {
        Some(n) if n > limits.max_body as u64 => return Ok(too_big()),
        Some(n) => usize::try_from(n).unwrap_or(limits.max_body),
        None => limits.max_body,
    };
    let charge = limits.charge(reserve);
    let no_room = || text(503, "too many request bodies in flight; try again\n".into());
    let deadline = tokio::time::Instant::now() + limits.body_read;
    let memory = &*connection.memory;
    let source = &*connection.source;
    let mut held = Held {
        memory,
        bytes: 0,
        own: None,
        all: None,
    };
    let mut body = req.into_body();
    let mut buffer = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Ok(text(
                    408,
                    format!(
                        "the request body did not arrive within {:?}\n",
                        limits.body_read
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Ok(text(400, format!("request body: {e}\n"))),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if buffer.len() + data.len() > reserve {
                return Ok(too_big());
            }
            // Room is taken when the body's first bytes arrive, not when its
            // length is declared: a client that sends headers and nothing
            // more holds nothing. It is taken whole, for the body and its
            // parse at once, so two requests can never each hold half of
            // what the other waits for.
            if held.bytes == 0 && !data.is_empty() && !held.take(source, charge, deadline).await {
                return Ok(no_room());
            }
            buffer.extend_from_slice(&data);
        }
    }
    if let Err(e) = limits.review_json.measure(&buffer) {
        return Ok(text(
            413,
            format!("AdmissionReview refused unparsed: {e}; a review of these kinds is never that large\n"),
        ));
    }
    let response = answer(buffer.freeze()).await;
    drop(held);
    Ok(reply(200, "application/json", response))
}

/// The response review for a request review's body.
fn review(ctx: &Context, body: &[u8]) -> Vec<u8> {
    let response = match admit::parse(body) {
        Err(invalid) => {
            tracing::warn!(message = %invalid.result.message, "webhook: unreadable AdmissionReview");
            *invalid
        }
        Ok(request) => {
            let image = match admit::wants_image(&request) {
                Some(spec) => image_check(ctx, &spec),
                None => ImageCheck::NotAsked,
            };
            let response = admit::decide(&request, &image);
            if !response.allowed {
                tracing::info!(kind = %request.kind.kind, name = %request.name, namespace = ?request.namespace, operation = ?request.operation, reason = %response.result.message, "webhook denied");
            }
            response
        }
    };
    serde_json::to_vec(&response.into_review()).unwrap_or_default()
}

/// What is known of the new provisioner's BlueField image, without a
/// Secret read or a registry call: the review's sender is not known to be
/// the API server (anyone who reaches the port can send one), so nothing
/// it names is read or contacted on its word. The controller, which acts
/// only on stored objects, does the lookups; what it learned is known here.
fn image_check(ctx: &Context, spec: &DPFHCPProvisionerSpec) -> ImageCheck {
    let settings = BridgeSettings::resolve(
        ctx.configs
            .get(&ObjectRef::new("default"))
            .map(|c| c.spec.clone())
            .as_ref(),
        &ctx.operator_namespace,
    );
    let lookup = Lookup {
        release_image: spec.ocp_release_image.clone(),
        repository: settings.blue_field_repo.clone(),
        configured: ctx
            .images
            .get(&ObjectRef::new(bluefield::IMAGES_CONFIGMAP).within(&ctx.operator_namespace))
            .map(|cm| cm.data.clone().unwrap_or_default()),
        configmap_namespace: ctx.operator_namespace.clone(),
        credentials: Credentials::default(),
    };
    match ctx.resolver.known(&lookup) {
        Some(Ok(found)) => ImageCheck::Found(found.image),
        Some(Err(e)) => ImageCheck::Failed(e),
        None => ImageCheck::Unknown,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::webhook::selfsigned;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;

    struct Server {
        addr: SocketAddr,
        memory: Arc<Memory>,
        tls: tokio_rustls::TlsConnector,
        _dir: tempfile::TempDir,
    }

    const SERVER_NAME: &str = "webhook.ns.svc";

    /// A serving pair for [`SERVER_NAME`] in a directory of its own, and
    /// a client that trusts it.
    fn pki() -> (tempfile::TempDir, tokio_rustls::TlsConnector) {
        let pair = selfsigned::generate(&selfsigned::Names {
            namespace: "ns".into(),
            secret: "s".into(),
            service: "webhook".into(),
            configuration: "c".into(),
            extra_sans: Vec::new(),
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for f in ["tls.crt", "tls.key", "ca.crt"] {
            std::fs::write(dir.path().join(f), &pair[f].0).unwrap();
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pair["ca.crt"].0) {
            roots.add(c.unwrap()).unwrap();
        }
        use rustls::pki_types::pem::PemObject;
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        (dir, tokio_rustls::TlsConnector::from(Arc::new(client)))
    }

    /// The real TLS server and HTTP stack, from the pair in `dir`, with the
    /// admission decisions of [`admit`] and without the BlueField lookup
    /// (no provisioner creates are sent here); its address.
    async fn serve_from(dir: &std::path::Path, limits: Limits) -> (SocketAddr, Arc<Memory>) {
        let cert = Arc::new(ReloadingCert::new(dir).unwrap());
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cert.server_config()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answer: Answer = Arc::new(|body| {
            Box::pin(async move {
                let r = match admit::parse(&body) {
                    Err(invalid) => *invalid,
                    Ok(req) => admit::decide(&req, &ImageCheck::NotAsked),
                };
                serde_json::to_vec(&r.into_review()).unwrap()
            })
        });
        let memory = Arc::new(Memory::new(&limits));
        tokio::spawn(serve(listener, acceptor, limits, memory.clone(), answer));
        (addr, memory)
    }

    async fn start(limits: Limits) -> Server {
        let (dir, tls) = pki();
        let (addr, memory) = serve_from(dir.path(), limits).await;
        Server {
            addr,
            memory,
            tls,
            _dir: dir,
        }
    }

    impl Server {
        async fn connect(&self) -> TlsStream<TcpStream> {
            let tcp = TcpStream::connect(self.addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
            self.tls.connect(name, tcp).await.unwrap()
        }
    }

    /// A valid Infra CREATE review, with `pad` bytes in an annotation.
    fn infra_review(pad: usize) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "operation": "CREATE",
                "kind": {"group": "hostedcluster.densityops.com", "version": "v1alpha1", "kind": "Infra"},
                "resource": {"group": "hostedcluster.densityops.com", "version": "v1alpha1", "resource": "infras"},
                "name": "x", "namespace": "ns", "userInfo": {"username": "someone"},
                "object": {
                    "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
                    "metadata": {"name": "x", "namespace": "ns", "annotations": {"pad": "p".repeat(pad)}},
                    "spec": {
                        "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1", "networkAttachmentDefinition": "vlan"},
                        "infraComponents": {
                            "dhcp": {"enabled": true, "serverIP": "192.168.100.2", "rangeStart": "192.168.100.10", "rangeEnd": "192.168.100.200"},
                            "dns": {"enabled": true, "serverIP": "192.168.100.3", "clusterName": "c", "baseDomain": "example.com"},
                            "proxy": {"enabled": true, "serverIP": "192.168.100.4"},
                        },
                    },
                },
            },
        }))
        .unwrap()
    }

    /// One admission through hyper's client: the HTTP status and whether
    /// the review was allowed; the connection's task, which ends when
    /// the server closes it.
    async fn admit_once(
        server: &Server,
        body: Vec<u8>,
    ) -> (u16, bool, tokio::task::JoinHandle<()>) {
        let stream = server.connect().await;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::post(PATH)
            .header(http::header::HOST, SERVER_NAME)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let allowed = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["response"]["allowed"].as_bool())
            .unwrap_or(false);
        (status, allowed, conn)
    }

    /// Reads until the server closes the connection; what it said.
    async fn until_closed(stream: &mut (impl AsyncReadExt + Unpin)) -> String {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&all).into_owned(),
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    }

    const BOUND: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn slow_and_silent_clients_are_cut_and_a_real_admission_gets_through() {
        let limits = Limits {
            header_read: Duration::from_millis(500),
            body_read: Duration::from_millis(500),
            max_connections: 3,
            ..Limits::default()
        };
        let server = start(limits).await;
        let started = tokio::time::Instant::now();
        // Every slot taken: one silent after the handshake, one sending
        // its headers a byte at a time, one that never sends its body.
        let mut silent = server.connect().await;
        let dribbling = server.connect().await;
        let (mut dribble_read, mut dribble_write) = tokio::io::split(dribbling);
        let dribbler = tokio::spawn(async move {
            let head = format!("POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nX-Slow: ");
            for b in head.bytes().chain(std::iter::repeat(b'a')) {
                if dribble_write.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let mut bodiless = server.connect().await;
        bodiless
            .write_all(format!("POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{").as_bytes())
            .await
            .unwrap();

        let (status, allowed, conn) =
            tokio::time::timeout(BOUND, admit_once(&server, infra_review(0)))
                .await
                .expect("a real admission while slow clients held every slot");
        assert_eq!((status, allowed), (200, true));

        let said = tokio::time::timeout(BOUND, until_closed(&mut silent))
            .await
            .expect("the silent client was not cut");
        assert!(said.is_empty(), "{said}");
        tokio::time::timeout(BOUND, until_closed(&mut dribble_read))
            .await
            .expect("the client sending headers a byte at a time was not cut");
        let said = tokio::time::timeout(BOUND, until_closed(&mut bodiless))
            .await
            .expect("the client that never sent its body was not cut");
        assert!(said.starts_with("HTTP/1.1 408"), "{said}");
        // A kept-alive connection left idle is closed too.
        tokio::time::timeout(BOUND, conn)
            .await
            .expect("an idle kept-alive connection stayed open")
            .unwrap();
        assert!(started.elapsed() < 2 * BOUND);
        dribbler.abort();
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_without_being_read() {
        let limits = Limits::default();
        let most = limits.charge(limits.max_body);
        let server = start(limits).await;
        // Declared: refused before a byte of it is read.
        let mut declared = server.connect().await;
        let eight = 8usize << 20;
        declared
            .write_all(format!("POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Length: {eight}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        declared.write_all(&vec![b' '; 64 << 10]).await.unwrap();
        let said = tokio::time::timeout(BOUND, until_closed(&mut declared))
            .await
            .expect("no answer to an 8 MiB body");
        assert!(said.starts_with("HTTP/1.1 413"), "{said}");
        assert_eq!(server.memory.peak.load(Ordering::Relaxed), 0);
        // Chunked, no length given: read up to the cap, then refused.
        let chunked = server.connect().await;
        let (mut read, mut write) = tokio::io::split(chunked);
        let writer = tokio::spawn(async move {
            let head = format!(
                "POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nTransfer-Encoding: chunked\r\n\r\n"
            );
            write.write_all(head.as_bytes()).await?;
            let chunk = vec![b' '; 64 << 10];
            for _ in 0..(eight / chunk.len()) {
                write
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                write.write_all(&chunk).await?;
                write.write_all(b"\r\n").await?;
            }
            write.write_all(b"0\r\n\r\n").await
        });
        let said = tokio::time::timeout(BOUND, until_closed(&mut read))
            .await
            .expect("no answer to an 8 MiB chunked body");
        assert!(said.starts_with("HTTP/1.1 413"), "{said}");
        let peak = server.memory.peak.load(Ordering::Relaxed);
        assert!(peak <= most, "{peak} bytes held for one body");
        writer.abort();
        assert_eq!(server.memory.held.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn bodies_in_flight_stay_within_their_bound() {
        let limits = Limits {
            max_body: 256 << 10,
            review_json: JsonLimits {
                max_values: 1000,
                max_depth: 64,
            },
            memory_in_flight: 1 << 20,
            memory_per_source: 1 << 20,
            ..Limits::default()
        };
        let bound = limits.memory_in_flight;
        let server = Arc::new(start(limits).await);
        let review = infra_review(200 << 10);
        let clients = 24;
        let barrier = Arc::new(tokio::sync::Barrier::new(clients));
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (server, review, barrier) = (server.clone(), review.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let mut stream = server.connect().await;
                stream
                    .write_all(format!("POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", review.len()).as_bytes())
                    .await
                    .unwrap();
                // Every client has part of its body out before any ends
                // one: without a bound, all of them are held at once.
                let (first, rest) = review.split_at(64 << 10);
                stream.write_all(first).await.unwrap();
                stream.flush().await.unwrap();
                barrier.wait().await;
                stream.write_all(rest).await.unwrap();
                stream.flush().await.unwrap();
                until_closed(&mut stream).await
            }));
        }
        for t in tasks {
            let said = tokio::time::timeout(2 * BOUND, t)
                .await
                .expect("a client got no answer")
                .unwrap();
            assert!(
                said.starts_with("HTTP/1.1 200") && said.contains(r#""allowed":true"#),
                "{}",
                &said[..said.len().min(300)]
            );
        }
        let peak = server.memory.peak.load(Ordering::Relaxed);
        assert!(
            peak <= bound,
            "{peak} body bytes held at once, bound {bound}"
        );
        assert!(peak >= review.len(), "{peak}: not even one body counted");
    }
    /// A TLS connection to `server` from `source`, a loopback address of
    /// its own, as another pod would come from another address.
    async fn connect_from(
        addr: SocketAddr,
        tls: &tokio_rustls::TlsConnector,
        source: std::net::Ipv4Addr,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((source, 0)))?;
        let tcp = socket.connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        tls.connect(name, tcp).await
    }

    /// How long one real admission from 127.0.0.1 takes, from its connect to
    /// its answer (asserted `200`), within 15 s each for both.
    async fn timed_admission(server: &Server) -> Duration {
        let began = tokio::time::Instant::now();
        let stream = tokio::time::timeout(
            Duration::from_secs(15),
            connect_from(server.addr, &server.tls, [127, 0, 0, 1].into()),
        )
        .await
        .expect("no connection in 15 s")
        .unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::post(PATH)
            .header(http::header::HOST, SERVER_NAME)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(infra_review(0))))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(15), send.send_request(req))
            .await
            .expect("no answer in 15 s")
            .unwrap();
        assert_eq!(resp.status(), 200);
        began.elapsed()
    }

    /// An Infra review whose spec is `[0,0,…]` up to `len` bytes: two bytes
    /// a value of text, 32 or more once parsed into JSON values.
    fn zeros_review(len: usize) -> Vec<u8> {
        let head = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","kind":{"group":"hostedcluster.densityops.com","version":"v1alpha1","kind":"Infra"},"resource":{"group":"hostedcluster.densityops.com","version":"v1alpha1","resource":"infras"},"name":"x","namespace":"ns","object":{"metadata":{"name":"x"},"spec":[0"#;
        let tail = b"]}}}";
        let mut body = head.to_vec();
        while body.len() + 2 + tail.len() <= len {
            body.extend_from_slice(b",0");
        }
        body.extend_from_slice(tail);
        body
    }

    const PARSE_ATTACK: &str = "webhook::server::tests::hostile_reviews_in_parallel_keep_the_webhook_within_its_memory_bound";

    /// Concurrent largest-size reviews whose spec is
    /// `[0,0,…]`. The webhook, in a child process of its own with the
    /// production limits, must keep its peak memory (VmHWM) within 64 MiB
    /// of where it started, whatever the number of such bodies.
    #[test]
    fn hostile_reviews_in_parallel_keep_the_webhook_within_its_memory_bound() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        if crate::child_process::is_child(PARSE_ATTACK) {
            let dir = std::env::var("CAUSEWAY_TEST_CERTS").unwrap();
            rt.block_on(async {
                let (addr, _) = serve_from(std::path::Path::new(&dir), Limits::default()).await;
                println!("LISTENING {}", addr.port());
                println!("BASELINE {}", crate::child_process::peak_kib());
                let mut line = String::new();
                tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line))
                    .await
                    .unwrap()
                    .unwrap();
                println!("PEAK {}", crate::child_process::peak_kib());
            });
            return;
        }
        let (dir, tls) = pki();
        let mut child = crate::child_process::spawn(
            PARSE_ATTACK,
            &[("CAUSEWAY_TEST_CERTS", dir.path().display().to_string())],
        );
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let port: u16 = crate::child_process::line(&mut out, "LISTENING")
            .parse()
            .unwrap();
        let baseline: u64 = crate::child_process::line(&mut out, "BASELINE")
            .parse()
            .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let body = Bytes::from(zeros_review(Limits::default().max_body - 1024));
        let clients = 16;
        let statuses = rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let (tls, body) = (tls.clone(), body.clone());
                tasks.push(tokio::spawn(async move {
                    let tcp = TcpStream::connect(addr).await.unwrap();
                    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
                    let mut stream = tls.connect(name, tcp).await.unwrap();
                    let head = format!("POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                    if stream.write_all(head.as_bytes()).await.is_err()
                        || stream.write_all(&body).await.is_err()
                    {
                        return "write failed".to_string();
                    }
                    let said = until_closed(&mut stream).await;
                    said.lines().next().unwrap_or("closed").to_string()
                }));
            }
            let mut statuses = Vec::new();
            for t in tasks {
                statuses.push(
                    tokio::time::timeout(Duration::from_secs(60), t)
                        .await
                        .expect("a hostile client got no answer in 60 s")
                        .unwrap(),
                );
            }
            statuses
        });
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"report\n").unwrap();
        let peak: u64 = crate::child_process::line(&mut out, "PEAK")
            .parse()
            .unwrap();
        assert!(child.wait().unwrap().success());
        let rise = peak.saturating_sub(baseline);
        println!(
            "webhook VmHWM {baseline} KiB at rest, {peak} KiB at most under {clients} concurrent {} KiB [0,0,…] reviews (+{rise} KiB); answers {statuses:?}",
            body.len() >> 10
        );
        assert!(
            rise < 64 << 10,
            "the webhook's peak memory rose {} MiB under {clients} concurrent hostile reviews (bound 64 MiB)",
            rise >> 10
        );
    }

    /// A stream of connections that send a request's
    /// headers, declaring the largest body, and nothing more, from one
    /// address, about 28 a second. A real admission from another address
    /// meanwhile completes in under a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_of_header_only_requests_cannot_starve_a_real_admission() {
        let server = Arc::new(start(Limits::default()).await);
        let attacker = {
            let server = server.clone();
            tokio::spawn(async move {
                let mut held = Vec::new();
                // Bounded: 8 s at most, 224 connections at most.
                for _ in 0..224 {
                    if let Ok(mut s) =
                        connect_from(server.addr, &server.tls, [127, 0, 0, 2].into()).await
                    {
                        let head = format!("POST {PATH} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Length: {}\r\n\r\n", 4 << 20);
                        let _ = s.write_all(head.as_bytes()).await;
                        held.push(s);
                    }
                    tokio::time::sleep(Duration::from_millis(35)).await;
                }
                held
            })
        };
        // Let the stream build up past the body budget first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut slowest = Duration::ZERO;
        for _ in 0..3 {
            slowest = slowest.max(timed_admission(&server).await);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        attacker.abort();
        println!("slowest real admission during the header-only stream: {slowest:?}");
        assert!(
            slowest < Duration::from_secs(1),
            "a real admission took {slowest:?} during a header-only connection stream"
        );
    }

    /// One address opens more connections than the webhook has slots and
    /// sends nothing on them; an admission from another address still
    /// completes in under a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_source_holding_every_slot_cannot_starve_a_real_admission() {
        let server = Arc::new(start(Limits::default()).await);
        let mut silent = Vec::new();
        for _ in 0..300 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::from(([127, 0, 0, 3], 0))).unwrap();
            if let Ok(tcp) = socket.connect(server.addr).await {
                silent.push(tcp);
            }
        }
        let took = timed_admission(&server).await;
        println!("admission with 300 silent connections from one other address: {took:?}");
        assert!(
            took < Duration::from_secs(1),
            "a real admission took {took:?} while one address held 300 silent connections"
        );
    }
}
