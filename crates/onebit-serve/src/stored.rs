//! Responses kept in memory for the Responses API's `previous_response_id`
//! and `GET /v1/responses/{id}`: each under its id with the conversation it
//! ended (chat messages, the answer's turn included) and its response
//! object. The store is bounded three ways, all checked on every put and
//! lookup: an entry older than [`STORE_TTL`] is gone, and past
//! [`MAX_STORED`] entries or [`MAX_STORED_BYTES`] of conversation the
//! oldest go first. A leaf: it knows no route, model or engine.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Responses kept at most.
pub const MAX_STORED: usize = 256;
/// How long a response is kept.
pub const STORE_TTL: Duration = Duration::from_secs(3600);
/// Bytes of stored conversations (as JSON text) kept at most.
pub const MAX_STORED_BYTES: usize = 64 << 20;

/// One stored response.
#[derive(Debug)]
pub struct Stored {
    /// The conversation as chat messages, this response's turn last; the
    /// instructions (a system message) are not in it: they do not carry
    /// over to a following response.
    pub history: Value,
    /// The response object as it was answered.
    pub response: Value,
}

struct Entry {
    id: String,
    at: Instant,
    bytes: usize,
    stored: Arc<Stored>,
}

/// The store: entries oldest first.
#[derive(Default)]
pub struct ResponseStore {
    entries: Mutex<VecDeque<Entry>>,
}

impl ResponseStore {
    /// Drops what is past the bounds, `now` being the time of the check.
    fn prune(q: &mut VecDeque<Entry>, now: Instant) {
        while q
            .front()
            .is_some_and(|e| now.duration_since(e.at) > STORE_TTL)
        {
            q.pop_front();
        }
        let mut bytes: usize = q.iter().map(|e| e.bytes).sum();
        while q.len() > MAX_STORED || bytes > MAX_STORED_BYTES {
            match q.pop_front() {
                Some(e) => bytes -= e.bytes,
                None => break,
            }
        }
    }

    /// Keeps `stored` under `id`.
    pub fn put(&self, id: String, stored: Stored) {
        self.put_at(id, stored, Instant::now());
    }

    fn put_at(&self, id: String, stored: Stored, now: Instant) {
        let bytes = stored.history.to_string().len() + stored.response.to_string().len();
        let mut q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|e| e.id != id);
        q.push_back(Entry {
            id,
            at: now,
            bytes,
            stored: Arc::new(stored),
        });
        Self::prune(&mut q, now);
    }

    /// The response stored under `id`, if it is still kept.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Arc<Stored>> {
        let mut q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut q, now);
        q.iter().find(|e| e.id == id).map(|e| e.stored.clone())
    }

    /// Forgets `id`; whether it was kept.
    pub fn delete(&self, id: &str) -> bool {
        let mut q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut q, Instant::now());
        let before = q.len();
        q.retain(|e| e.id != id);
        q.len() != before
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        let mut q = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut q, Instant::now());
        q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a kept response is described when it is not found: what may have
/// happened to it, with the bounds.
pub fn not_kept(id: &str) -> String {
    format!(
        "no response {id:?} is kept on this server: responses are kept in memory only when made with `store` true (the default), at most {MAX_STORED} of them (and {} MiB) for {} minutes, and a restart or DELETE forgets them",
        MAX_STORED_BYTES >> 20,
        STORE_TTL.as_secs() / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(n: usize) -> Stored {
        Stored {
            history: json!([{"role": "user", "content": n.to_string()}]),
            response: json!({"id": n}),
        }
    }

    #[test]
    fn entries_expire_after_the_time_limit() {
        let s = ResponseStore::default();
        let t0 = Instant::now();
        s.put_at("a".into(), one(1), t0);
        assert!(s.get_at("a", t0 + STORE_TTL).is_some());
        assert!(s
            .get_at("a", t0 + STORE_TTL + Duration::from_secs(1))
            .is_none());
        // Once pruned it stays gone.
        assert!(s.get_at("a", t0).is_none());
    }

    #[test]
    fn the_oldest_go_past_the_count_bound() {
        let s = ResponseStore::default();
        let t0 = Instant::now();
        for i in 0..MAX_STORED + 3 {
            s.put_at(format!("r{i}"), one(i), t0);
        }
        assert_eq!(s.len(), MAX_STORED);
        for i in 0..3 {
            assert!(s.get_at(&format!("r{i}"), t0).is_none(), "r{i}");
        }
        let last = s.get_at(&format!("r{}", MAX_STORED + 2), t0).unwrap();
        assert_eq!(last.response["id"], MAX_STORED + 2);
        assert!(s.delete("r3") && !s.delete("r3"));
        assert_eq!(s.len(), MAX_STORED - 1);
    }

    #[test]
    fn the_oldest_go_past_the_byte_bound() {
        let s = ResponseStore::default();
        let t0 = Instant::now();
        // Three conversations of a bit over a third of the bound each: the
        // third put pushes the first out.
        let big = "x".repeat(MAX_STORED_BYTES / 3 + 1);
        for i in 0..3 {
            s.put_at(
                format!("b{i}"),
                Stored {
                    history: json!([{"role": "user", "content": big}]),
                    response: json!({}),
                },
                t0,
            );
        }
        assert!(s.get_at("b0", t0).is_none());
        assert!(s.get_at("b1", t0).is_some() && s.get_at("b2", t0).is_some());
    }
}
