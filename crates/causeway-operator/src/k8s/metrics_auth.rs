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
    remembered: Mutex<Remembered>,
    hasher: RandomState,
}

/// The answers given lately, by a hash of the token (never the token).
#[derive(Default)]
struct Remembered {
    answers: HashMap<u64, (Access, Instant)>,
}

impl Remembered {
    fn get(&self, key: u64, now: Instant) -> Option<Access> {
        self.answers
            .get(&key)
            .filter(|(_, until)| now < *until)
            .map(|(access, _)| *access)
    }

    fn put(&mut self, key: u64, access: Access, now: Instant) {
        let keep = if access == Access::Allowed {
            ALLOWED_FOR
        } else {
            REFUSED_FOR
        };
        if self.answers.len() >= REMEMBERED {
            self.answers.clear();
        }
        self.answers.insert(key, (access, now + keep));
    }
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            remembered: Mutex::new(Remembered::default()),
            hasher: RandomState::new(),
        }
    }

    pub async fn check(&self, token: Option<String>) -> Access {
        let Some(token) = token else {
            return Access::Unauthenticated;
        };
        let key = self.hasher.hash_one(&token);
        let now = Instant::now();
        if let Some(access) = self.remembered.lock().ok().and_then(|r| r.get(key, now)) {
            return access;
        }
        let access = match self.review(token).await {
            Ok(a) => a,
            // The API server cannot be asked: refuse, and remember nothing.
            Err(e) => {
                tracing::warn!(error = %e, "cannot review a metrics scraper's token");
                return Access::Unauthenticated;
            }
        };
        if let Ok(mut remembered) = self.remembered.lock() {
            remembered.put(key, access, now);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowed_token_is_remembered_a_minute_and_a_refused_one_ten_seconds() {
        let t0 = Instant::now();
        let mut r = Remembered::default();
        r.put(1, Access::Allowed, t0);
        r.put(2, Access::Forbidden, t0);
        r.put(3, Access::Unauthenticated, t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(r.get(1, at(59)), Some(Access::Allowed));
        assert_eq!(r.get(1, at(60)), None);
        assert_eq!(r.get(2, at(9)), Some(Access::Forbidden));
        assert_eq!(r.get(2, at(10)), None);
        assert_eq!(r.get(3, at(9)), Some(Access::Unauthenticated));
        assert_eq!(r.get(4, at(0)), None);
    }

    #[test]
    fn the_memory_is_bounded() {
        let t0 = Instant::now();
        let mut r = Remembered::default();
        for key in 0..REMEMBERED as u64 {
            r.put(key, Access::Allowed, t0);
        }
        assert_eq!(r.answers.len(), REMEMBERED);
        r.put(u64::MAX, Access::Allowed, t0);
        assert_eq!(r.answers.len(), 1, "full: forgotten, then the new one kept");
        assert_eq!(r.get(0, t0), None);
    }
}
