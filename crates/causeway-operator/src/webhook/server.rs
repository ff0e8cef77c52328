//! The webhook's HTTPS endpoint: `POST /validate` with an AdmissionReview.
//! Reads come from caches (the BlueField table and the bridge's settings)
//! except the new provisioner's pull secret, one GET bounded by the
//! lookup's deadline.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Client;
use tokio::sync::Semaphore;

use super::admit::{self, ImageCheck};
use super::tls::{CertError, ReloadingCert};
use crate::dpf::bluefield::{self, Credentials, Lookup, Resolver};
use crate::dpf::crd::{BridgeSettings, DPFHCPProvisionerConfig, DPFHCPProvisionerSpec};
use crate::k8s::watch::cached;

/// The path the webhook configuration names.
pub const PATH: &str = "/validate";
/// How long the BlueField lookup may take before the last known answer is
/// used: well inside the configuration's timeout.
const LOOKUP_DEADLINE: Duration = Duration::from_secs(3);
/// hyper's read buffer per connection. A review's headers are a few
/// hundred bytes; hyper's default (about 400 KiB) times every connection
/// slot would be 100 MiB of headers held by clients that never finish.
const READ_BUFFER: usize = 64 << 10;

/// What one client, and all of them together, may hold of the webhook.
/// Every connection that can reach the port gets a slot; these bound how
/// long a slot is kept by a client that does not finish and how much
/// memory request bodies take.
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
    /// Body bytes held across all connections at once. A request reserves
    /// its declared length (or `max_body` when it declares none) before
    /// its body is read and keeps it until answered, so parsing is inside
    /// the bound too: 16 MiB is four of the largest reviews at once, well
    /// inside the pod's memory limit, and thousands of real ones.
    pub bodies_in_flight: usize,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(10),
            max_body: 4 << 20,
            bodies_in_flight: 16 << 20,
            max_connections: 256,
        }
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
    client: Client,
    operator_namespace: String,
    images: Store<ConfigMap>,
    configs: Store<DPFHCPProvisionerConfig>,
    resolver: Resolver,
}

/// Turns a review's body into the response review's JSON.
type Answer =
    Arc<dyn Fn(Bytes) -> Pin<Box<dyn std::future::Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// Room for request bodies across connections, and what is held now.
struct Bodies {
    room: Semaphore,
    /// Bytes read into request bodies and not yet released.
    held: AtomicUsize,
    /// The most `held` has been, for tests.
    #[cfg_attr(not(test), allow(dead_code))]
    peak: AtomicUsize,
}

impl Bodies {
    fn new(limit: usize) -> Bodies {
        Bodies {
            room: Semaphore::new(limit.min(Semaphore::MAX_PERMITS)),
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn add(&self, n: usize) {
        let now = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// What a body has added to [`Bodies::held`], given back when dropped.
struct Held<'a>(&'a Bodies, usize);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(self.1, Ordering::Relaxed);
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
        client,
        operator_namespace,
        images,
        configs,
        resolver: Resolver::default(),
    });
    tracing::info!(listen = %bound, cert = %cert_dir.display(), "admission webhook serving");
    let answer: Answer = Arc::new(move |body| {
        let ctx = ctx.clone();
        Box::pin(async move { review(&ctx, &body).await })
    });
    let caches = futures::stream::select(images_stream.map(|_| ()), configs_stream.map(|_| ()))
        .for_each(|()| async {});
    let limits = Limits::default();
    let bodies = Arc::new(Bodies::new(limits.bodies_in_flight));
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => {}
            _ = serve(listener, acceptor, limits, bodies, answer) => {}
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
    bodies: Arc<Bodies>,
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
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (acceptor, limits, bodies, answer) = (
            acceptor.clone(),
            limits.clone(),
            bodies.clone(),
            answer.clone(),
        );
        tokio::spawn(async move {
            let _slot = slot;
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
                handle(conn_limits.clone(), bodies.clone(), answer.clone(), req)
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
    bodies: Arc<Bodies>,
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
    let deadline = tokio::time::Instant::now() + limits.body_read;
    let permits = u32::try_from(reserve).unwrap_or(u32::MAX);
    let room = match tokio::time::timeout_at(deadline, bodies.room.acquire_many(permits)).await {
        Ok(Ok(room)) => room,
        _ => {
            return Ok(text(
                503,
                "too many request bodies in flight; try again\n".into(),
            ))
        }
    };
    let mut held = Held(&bodies, 0);
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
            bodies.add(data.len());
            held.1 += data.len();
            buffer.extend_from_slice(&data);
        }
    }
    let response = answer(buffer.freeze()).await;
    drop((held, room));
    Ok(reply(200, "application/json", response))
}

/// The response review for a request review's body.
async fn review(ctx: &Context, body: &[u8]) -> Vec<u8> {
    let response = match admit::parse(body) {
        Err(invalid) => {
            tracing::warn!(message = %invalid.result.message, "webhook: unreadable AdmissionReview");
            *invalid
        }
        Ok(request) => {
            let image = match admit::wants_image(&request) {
                Some(spec) => {
                    image_check(ctx, &spec, request.namespace.as_deref().unwrap_or_default()).await
                }
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

async fn image_check(ctx: &Context, spec: &DPFHCPProvisionerSpec, namespace: &str) -> ImageCheck {
    let settings = BridgeSettings::resolve(
        ctx.configs
            .get(&ObjectRef::new("default"))
            .map(|c| c.spec.clone())
            .as_ref(),
        &ctx.operator_namespace,
    );
    let pull_secret = match spec.pull_secret_ref.as_ref() {
        Some(r) => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
            match tokio::time::timeout(LOOKUP_DEADLINE, secrets.get_opt(&r.name)).await {
                Ok(Ok(Some(s))) => s
                    .data
                    .and_then(|d| {
                        d.get(crate::dpf::render::PULL_SECRET_KEY)
                            .map(|b| b.0.clone())
                    })
                    .unwrap_or_default(),
                _ => Vec::new(),
            }
        }
        None => Vec::new(),
    };
    let lookup = Lookup {
        release_image: spec.ocp_release_image.clone(),
        repository: settings.blue_field_repo.clone(),
        configured: ctx
            .images
            .get(&ObjectRef::new(bluefield::IMAGES_CONFIGMAP).within(&ctx.operator_namespace))
            .map(|cm| cm.data.clone().unwrap_or_default()),
        configmap_namespace: ctx.operator_namespace.clone(),
        credentials: Credentials::from_docker_config(&pull_secret),
    };
    match ctx.resolver.resolve(&lookup, Some(LOOKUP_DEADLINE)).await {
        Ok(found) => ImageCheck::Found(found.image),
        Err(e) => ImageCheck::Failed(e),
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
        bodies: Arc<Bodies>,
        tls: tokio_rustls::TlsConnector,
        _dir: tempfile::TempDir,
    }

    const SERVER_NAME: &str = "webhook.ns.svc";

    /// The real TLS server and HTTP stack with the admission decisions of
    /// [`admit`], without the BlueField lookup (no provisioner creates are
    /// sent here).
    async fn start(limits: Limits) -> Server {
        let pair = selfsigned::generate(&selfsigned::Names {
            namespace: "ns".into(),
            secret: "s".into(),
            service: "webhook".into(),
            configuration: "c".into(),
            extra_sans: Vec::new(),
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for f in ["tls.crt", "tls.key"] {
            std::fs::write(dir.path().join(f), &pair[f].0).unwrap();
        }
        let cert = Arc::new(ReloadingCert::new(dir.path()).unwrap());
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cert.server_config()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
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
        let answer: Answer = Arc::new(|body| {
            Box::pin(async move {
                let r = match admit::parse(&body) {
                    Err(invalid) => *invalid,
                    Ok(req) => admit::decide(&req, &ImageCheck::NotAsked),
                };
                serde_json::to_vec(&r.into_review()).unwrap()
            })
        });
        let bodies = Arc::new(Bodies::new(limits.bodies_in_flight));
        tokio::spawn(serve(listener, acceptor, limits, bodies.clone(), answer));
        Server {
            addr,
            bodies,
            tls: tokio_rustls::TlsConnector::from(Arc::new(client)),
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
        let max_body = limits.max_body;
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
        assert_eq!(server.bodies.peak.load(Ordering::Relaxed), 0);
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
        let peak = server.bodies.peak.load(Ordering::Relaxed);
        assert!(peak <= max_body, "{peak} bytes held for one body");
        writer.abort();
        assert_eq!(server.bodies.held.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn bodies_in_flight_stay_within_their_bound() {
        let limits = Limits {
            max_body: 256 << 10,
            bodies_in_flight: 512 << 10,
            ..Limits::default()
        };
        let bound = limits.bodies_in_flight;
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
        let peak = server.bodies.peak.load(Ordering::Relaxed);
        assert!(
            peak <= bound,
            "{peak} body bytes held at once, bound {bound}"
        );
        assert!(peak >= review.len(), "{peak}: not even one body counted");
    }
}
