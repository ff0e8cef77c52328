//! Who may read the operator's `/metrics`: the bearer token a scraper
//! sends is authenticated by a TokenReview, and its user must be allowed
//! `get` on the non-resource URL `/metrics` by a SubjectAccessReview, as
//! the API server's own metrics are guarded. Answers are remembered for a
//! short while, so a scrape every few seconds is not two API calls.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use causeway_runtime::admin::Access;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;

/// How long an allowed token is trusted without asking again.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
/// How long a refused token is refused without asking again.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Tokens remembered at most; past it the memory starts again, so a stream
/// of made-up tokens costs API calls, not memory.
const REMEMBERED: usize = 256;

pub struct MetricsAuth {
    client: Client,
    /// Keyed by a hash of the token, never the token itself.
    seen: Mutex<HashMap<u64, (Access, Instant)>>,
    hasher: RandomState,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            seen: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        }
    }

    pub async fn check(&self, token: Option<String>) -> Access {
        let Some(token) = token else {
            return Access::Unauthenticated;
        };
        let key = self.hasher.hash_one(&token);
        let now = Instant::now();
        if let Some((access, until)) = self.seen.lock().ok().and_then(|s| s.get(&key).copied()) {
            if now < until {
                return access;
            }
        }
        let access = match self.review(token).await {
            Ok(a) => a,
            // The API server cannot be asked: refuse, and remember nothing.
            Err(e) => {
                tracing::warn!(error = %e, "cannot review a metrics scraper's token");
                return Access::Unauthenticated;
            }
        };
        let keep = if access == Access::Allowed {
            ALLOWED_FOR
        } else {
            REFUSED_FOR
        };
        if let Ok(mut seen) = self.seen.lock() {
            if seen.len() >= REMEMBERED {
                seen.clear();
            }
            seen.insert(key, (access, now + keep));
        }
        access
    }

    async fn review(&self, token: String) -> Result<Access, kube::Error> {
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec {
                        token: Some(token),
                        ..TokenReviewSpec::default()
                    },
                    ..TokenReview::default()
                },
            )
            .await?;
        let Some(status) = reviewed.status else {
            return Ok(Access::Unauthenticated);
        };
        let (true, Some(user)) = (status.authenticated == Some(true), status.user) else {
            return Ok(Access::Unauthenticated);
        };
        let asked = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: user.username,
                        groups: user.groups,
                        uid: user.uid,
                        extra: user.extra,
                        non_resource_attributes: Some(NonResourceAttributes {
                            path: Some("/metrics".into()),
                            verb: Some("get".into()),
                        }),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                },
            )
            .await?;
        Ok(match asked.status {
            Some(s) if s.allowed => Access::Allowed,
            _ => Access::Forbidden,
        })
    }
}
