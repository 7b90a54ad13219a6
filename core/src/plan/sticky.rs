//! Sticky re-creation: the IPs of recently released Services, so a Service deleted and
//! re-created under the same namespace/name (a `kubectl replace --force`, a Helm
//! re-install) gets its old IPs back. The planner keeps them reserved for that key while
//! they are remembered (see the module docs of [`crate::plan`]). Pure; time is a parameter.
//!
//! Memory is bounded twice: entries expire after [`STICKY_FOR`], and at most
//! [`STICKY_CAPACITY`] are kept (the oldest go first).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::ServiceKey;

/// How long the IPs of a released Service are remembered.
pub const STICKY_FOR: Duration = Duration::from_secs(600);
/// How many released Services are remembered at most.
pub const STICKY_CAPACITY: usize = 10_000;

/// Recently released Services and their IPs.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// Key -> (IPs, released at).
    by_key: HashMap<ServiceKey, (Vec<IpAddr>, Instant)>,
    /// Release order; may hold stale duplicates (a key released twice), recognised by
    /// their instant not matching `by_key`.
    order: VecDeque<(ServiceKey, Instant)>,
}

impl Recent {
    /// Remembers that `key` released `ips` at `now`. Returns whether older entries were
    /// forgotten to keep within [`STICKY_CAPACITY`].
    pub(super) fn remember(&mut self, key: ServiceKey, ips: Vec<IpAddr>, now: Instant) -> bool {
        self.by_key.insert(key.clone(), (ips, now));
        self.order.push_back((key, now));
        let mut forgot = false;
        while self.by_key.len() > STICKY_CAPACITY || self.order.len() > 2 * STICKY_CAPACITY {
            self.pop_front();
            forgot = true;
        }
        forgot
    }

    /// Forgets what was released [`STICKY_FOR`] or longer before `now`. Returns whether it
    /// forgot anything.
    pub(super) fn expire(&mut self, now: Instant) -> bool {
        let mut forgot = false;
        while self
            .order
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= STICKY_FOR)
        {
            self.pop_front();
            forgot = true;
        }
        forgot
    }

    /// When `key` released the IPs remembered for it, if any are.
    pub(super) fn released_at(&self, key: &ServiceKey) -> Option<Instant> {
        self.by_key.get(key).map(|(_, at)| *at)
    }

    /// The IPs `key` released recently, if any.
    pub(super) fn get(&self, key: &ServiceKey) -> &[IpAddr] {
        self.by_key.get(key).map_or(&[], |(ips, _)| ips.as_slice())
    }

    fn pop_front(&mut self) {
        if let Some((key, at)) = self.order.pop_front()
            && self.by_key.get(&key).is_some_and(|(_, t)| *t == at)
        {
            self.by_key.remove(&key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("default", name)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn expires_after_ttl_and_keeps_the_newest_release() {
        let t0 = Instant::now();
        let mut recent = Recent::default();
        recent.remember(key("a"), vec![ip("10.0.0.1")], t0);
        recent.remember(
            key("a"),
            vec![ip("10.0.0.2")],
            t0 + Duration::from_secs(300),
        );
        recent.expire(t0 + STICKY_FOR);
        assert_eq!(
            recent.get(&key("a")),
            [ip("10.0.0.2")],
            "the stale first release must not evict the second"
        );
        recent.expire(t0 + Duration::from_secs(300) + STICKY_FOR);
        assert!(recent.get(&key("a")).is_empty());
    }

    #[test]
    fn bounded_to_capacity_oldest_first() {
        let t0 = Instant::now();
        let mut recent = Recent::default();
        for i in 0..STICKY_CAPACITY + 5 {
            recent.remember(key(&format!("s{i}")), vec![ip("10.0.0.1")], t0);
        }
        assert_eq!(recent.len(), STICKY_CAPACITY);
        assert!(recent.get(&key("s0")).is_empty());
        assert!(
            !recent
                .get(&key(&format!("s{}", STICKY_CAPACITY + 4)))
                .is_empty()
        );
    }
}
