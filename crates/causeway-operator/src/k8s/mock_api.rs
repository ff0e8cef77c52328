//! An API server the test plays, request by request: a [`Client`] whose
//! every request reaches the test as an [`Exchange`] it checks and answers.
//! A reconcile's decisions (what it reads, what it writes, in which order,
//! and what it does with an error) are tested in milliseconds this way;
//! what only a real API server shows (admission, garbage collection, field
//! ownership, watches) stays with the kube suites.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::Client;
use serde_json::Value;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The test's side of the client.
pub struct MockApi {
    handle: Handle,
}

/// A client for the code under test, and the API server behind it.
pub fn client() -> (Client, MockApi) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), MockApi { handle })
}

/// One request, waiting for its answer.
pub struct Exchange {
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The body as JSON, `Null` when empty.
    pub body: Value,
    respond: tower_test::mock::SendResponse<Response<Body>>,
}

impl MockApi {
    /// The next request the code makes, within 5 s.
    pub async fn next(&mut self) -> Exchange {
        let (request, respond) =
            tokio::time::timeout(Duration::from_secs(5), self.handle.next_request())
                .await
                .expect("the code under test made no further request within 5 s")
                .expect("the client was dropped with no further request");
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .expect("a request body that can be read")
            .to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON request body")
        };
        Exchange {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body,
            respond,
        }
    }

    /// Asserts that `method path` comes next, and returns it.
    pub async fn expect(&mut self, method: Method, path: &str) -> Exchange {
        let e = self.next().await;
        assert_eq!(
            (&e.method, e.path.as_str()),
            (&method, path),
            "the request made (query {:?}, body {})",
            e.query,
            e.body
        );
        e
    }
}

impl Exchange {
    /// Answers 200 with `body`.
    pub fn ok(self, body: Value) {
        self.reply(StatusCode::OK, body);
    }

    /// Answers as the API server does when it refuses: a `Status` with
    /// `code` and `reason`.
    pub fn status(self, code: StatusCode, reason: &str) {
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": format!("{reason} (played by the test)"),
            "reason": reason, "code": code.as_u16(),
        });
        self.reply(code, status);
    }

    pub fn reply(self, code: StatusCode, body: Value) {
        let response = Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string().into_bytes()))
            .expect("a response the test builds");
        self.respond.send_response(response);
    }
}
