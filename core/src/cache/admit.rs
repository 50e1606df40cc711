//! Admitting client requests: lock their lines or wait in arrival order (`wait.rs`), retry
//! the waiting ones as lines are released, release throttled writes, and plan a request once
//! it holds its locks (after a write intent where one is needed, `intent.rs`). Part of the
//! request path (`request.rs`).

use super::Cache;
use super::lock::lock_key;
use super::request::{Op, Request};
use crate::event::{Action, ReqError};
use crate::units::ReqId;

impl Cache {
    /// Starts a request if its lines are free and no earlier waiting request overlaps it;
    /// otherwise queues it.
    pub(crate) fn admit(&mut self, id: ReqId, actions: &mut Vec<Action>) {
        let r = &self.reqs[&id];
        let (core, first, last) = (r.core, r.first, r.last);
        if !self.waits.overlaps(core, first, last) && self.locks.can_lock(core, first, last, r.lock)
        {
            self.start_locked(id, actions);
        } else {
            self.counters.deferred += 1;
            self.waits.push_back(id, core, first, last);
            self.locks.record_releases(true);
        }
    }

    /// Queues request `id` (in `reqs`) again, at the back or (it arrived before every request
    /// waiting now) at the front, to be looked at by the next retry.
    pub(crate) fn requeue(&mut self, id: ReqId, front: bool) {
        let r = &self.reqs[&id];
        let (core, first, last) = (r.core, r.first, r.last);
        if front {
            self.waits.push_front(id, core, first, last);
        } else {
            self.waits.push_back(id, core, first, last);
        }
        self.locks.record_releases(true);
        self.locks.note_released(lock_key(core, first));
        self.counters.deferred += 1;
    }

    /// Retries waiting requests in arrival order; a request never passes an earlier waiting
    /// request it overlaps. Only the requests that head the queue of a line released since the
    /// last retry can start, and those that come to head a queue as the ones before them start
    /// (`wait.rs`). The order is the queue order; a line released during the retry whose
    /// first request comes before the one being looked at is left for the next retry (as a
    /// scan of one arrival-ordered list, which this replaces, would do).
    pub(crate) fn retry_waiting(&mut self, actions: &mut Vec<Action>) {
        let mut keys = std::mem::take(&mut self.wait_keys);
        let mut work = std::mem::take(&mut self.wait_work);
        let mut later: Vec<u64> = Vec::new();
        let mut cursor = 0u64;
        loop {
            self.locks.take_released(&mut keys);
            for &key in &keys {
                if let Some((s, id)) = self.waits.front_of(key) {
                    if s < cursor {
                        later.push(key);
                    } else {
                        work.push(std::cmp::Reverse((s, id)));
                    }
                }
            }
            let Some(std::cmp::Reverse((s, id))) = work.pop() else {
                break;
            };
            if self.waits.seq(id) != Some(s) {
                continue; // started already (a second entry), or queued again since
            }
            cursor = s;
            let r = &self.reqs[&id];
            if !self.waits.is_first(id) || !self.locks.can_lock(r.core, r.first, r.last, r.lock) {
                continue;
            }
            self.waits
                .remove_first(id, &mut |s, id| work.push(std::cmp::Reverse((s, id))));
            self.start_locked(id, actions);
        }
        self.locks.record_releases(!self.waits.is_empty());
        for key in later {
            self.locks.note_released(key);
        }
        self.wait_keys = keys;
        self.wait_work = work;
    }

    /// Releases throttled writes whose time has come, oldest first.
    pub(crate) fn release_throttled(&mut self, actions: &mut Vec<Action>) {
        let now = self.now;
        let mut due: Vec<(crate::units::Nanos, ReqId)> = self
            .throttled
            .iter()
            .copied()
            .filter(|&(t, _)| t <= now)
            .collect();
        if due.is_empty() {
            return;
        }
        self.throttled.retain(|&(t, _)| t > now);
        due.sort();
        for (_, id) in due {
            self.admit(id, actions);
        }
    }

    /// Locks the lines of waiting request `id` and plans it.
    fn start_locked(&mut self, id: ReqId, actions: &mut Vec<Action>) {
        let r = self.reqs.remove(&id).expect("request exists");
        self.start(r, false, actions);
    }

    /// Locks the request's lines and plans it. `fresh`: its parts were looked up during this
    /// same event and nothing has changed the mapping since (else they are looked up again).
    fn start(&mut self, r: Box<Request>, fresh: bool, actions: &mut Vec<Action>) {
        self.locks.lock(r.core, r.first, r.last, r.lock);
        self.plan(r, fresh, actions);
    }

    /// Plans a request whose lines were just locked (see [`Cache::start`] for `fresh`).
    pub(crate) fn plan(&mut self, mut r: Box<Request>, fresh: bool, actions: &mut Vec<Action>) {
        r.locked = true;
        if !fresh {
            self.lookup_parts(&mut r);
        }
        self.plan_locked(r, actions);
    }

    /// Plans a request holding its locks, its parts looked up. A change to lines whose clean
    /// state may be proven waits first for a durable write intent (`intent.rs`).
    fn plan_locked(&mut self, r: Box<Request>, actions: &mut Vec<Action>) {
        if r.op != Op::Read
            && self.meta.is_some()
            && let Some(upto) = self.intent_gate(r.core, r.first, r.parts.iter().map(|p| p.line))
        {
            let id = r.id;
            self.reqs.insert(id, r);
            return self.intent_park(id, upto);
        }
        match r.op {
            Op::Read => self.plan_read(r, actions),
            _ => self.plan_write(r, actions),
        }
    }

    /// A request parked by [`Self::plan_locked`] fails: the intent it waited for could not be
    /// written. Nothing of it was done.
    pub(crate) fn fail_after_intent(
        &mut self,
        id: ReqId,
        e: crate::event::IoError,
        actions: &mut Vec<Action>,
    ) {
        let r = self.reqs.remove(&id).expect("parked request");
        self.finish(r, Err(ReqError::Io(e)), actions);
    }

    /// A request parked by [`Self::plan_locked`] may go on: look its lines up again and plan.
    pub(crate) fn resume_after_intent(&mut self, id: ReqId, actions: &mut Vec<Action>) {
        let mut r = self.reqs.remove(&id).expect("parked request");
        self.lookup_parts(&mut r);
        self.plan_locked(r, actions);
    }
}
