//! The webhook's HTTPS endpoint: `POST /validate` with an AdmissionReview.
//! Reads come from caches (the BlueField table and the bridge's settings)
//! except the new provisioner's pull secret, one GET bounded by the
//! lookup's deadline.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Client;

use super::admit::{self, ImageCheck};
use super::tls::{CertError, ReloadingCert};
use crate::controller::cached;
use crate::dpf::bluefield::{self, Credentials, Lookup, Resolver};
use crate::dpf::crd::{BridgeSettings, DPFHCPProvisioner, DPFHCPProvisionerConfig};

/// The path the webhook configuration names.
pub const PATH: &str = "/validate";
/// How long the BlueField lookup may take before the last known answer is
/// used: well inside the configuration's timeout.
const LOOKUP_DEADLINE: Duration = Duration::from_secs(3);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// AdmissionReviews are bounded by the API server's request size (3 MiB
/// objects, old and new).
const MAX_BODY: usize = 8 << 20;
const MAX_CONNECTIONS: usize = 256;

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

/// Binds `listen` and serves until `shutdown`. The certificate must load
/// now; later changes to its files are picked up as they come.
pub async fn run(
    listen: SocketAddr,
    cert_dir: &Path,
    client: Client,
    operator_namespace: String,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, WebhookError> {
    let cert = Arc::new(ReloadingCert::new(cert_dir)?);
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
    tokio::spawn(async move {
        let caches = futures::stream::select(images_stream.map(|_| ()), configs_stream.map(|_| ()))
            .for_each(|()| async {});
        let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let accept = async {
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
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let tls =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(t)) => t,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "webhook TLS handshake");
                                return;
                            }
                            Err(_) => return,
                        };
                    let service = service_fn(move |req| handle(ctx.clone(), req));
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await
                    {
                        tracing::debug!(%peer, error = %e, "webhook connection");
                    }
                });
            }
        };
        tokio::select! {
            _ = shutdown => {}
            _ = accept => {}
            _ = caches => {}
        }
    });
    Ok(bound)
}

fn reply(status: u16, content_type: &str, body: Vec<u8>) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

async fn handle(
    ctx: Arc<Context>,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != PATH {
        return Ok(reply(
            404,
            "text/plain",
            format!("not found: the webhook is at {PATH}\n").into_bytes(),
        ));
    }
    if req.method() != http::Method::POST {
        return Ok(reply(
            405,
            "text/plain",
            b"POST an AdmissionReview\n".to_vec(),
        ));
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(reply(
                413,
                "text/plain",
                format!("request body: {e}\n").into_bytes(),
            ))
        }
    };
    let response = match admit::parse(&body) {
        Err(invalid) => {
            tracing::warn!(message = %invalid.result.message, "webhook: unreadable AdmissionReview");
            *invalid
        }
        Ok(request) => {
            let image = match admit::wants_image(&request) {
                Some(p) => {
                    image_check(&ctx, &p, request.namespace.as_deref().unwrap_or_default()).await
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
    let body = serde_json::to_vec(&response.into_review()).unwrap_or_default();
    Ok(reply(200, "application/json", body))
}

async fn image_check(ctx: &Context, p: &DPFHCPProvisioner, namespace: &str) -> ImageCheck {
    let settings = BridgeSettings::resolve(
        ctx.configs
            .get(&ObjectRef::new("default"))
            .map(|c| c.spec.clone())
            .as_ref(),
        &ctx.operator_namespace,
    );
    let pull_secret = match p.spec.pull_secret_ref.as_ref() {
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
        release_image: p.spec.ocp_release_image.clone(),
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
