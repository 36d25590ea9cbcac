//! The in-process engine: ranks are threads of one process.
//!
//! [`InProcessGroup::create`] returns one [`InProcessTransport`] per rank; hand
//! each to a thread. [`InProcessStore`] is a shared key–value store. Tests,
//! simulations and `ccol scenario run` use them; a new backend is written
//! from this one as a template.
//!
//! Collectives are matched by call order: the `k`-th collective of every
//! rank meets in slot `k`. A rank that drops its transport without
//! [`Transport::shutdown`] is reported to peers as
//! [`PeerLoss::Disconnected`]; one that shuts down as [`PeerLoss::Shutdown`].
//! Either way, peers waiting for it fail at once.

use crate::error::{Error, PeerLoss, Result};
use crate::transport::{Deadline, Store, Transport};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

const BACKEND: &str = "in-process";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    AllGather,
    Barrier,
}

#[derive(Debug)]
struct Slot {
    op: OpKind,
    parts: Vec<Option<Arc<[u8]>>>,
    readers: u32,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<u64, Slot>,
    next_op: Vec<u64>,
    departed: Vec<Option<PeerLoss>>,
    mailboxes: HashMap<(u32, u32, u32), VecDeque<Vec<u8>>>,
}

#[derive(Debug)]
struct Shared {
    world_size: u32,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank thread that panicked while holding the lock leaves plain data
        // behind; keep serving the other ranks.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits on the condition variable until `deadline`; returns the guard
    /// and whether the deadline passed.
    fn wait<'a>(
        &self,
        guard: MutexGuard<'a, State>,
        deadline: Deadline,
    ) -> (MutexGuard<'a, State>, bool) {
        let left = deadline.remaining();
        if left.is_zero() {
            return (guard, true);
        }
        let (g, _) = self
            .changed
            .wait_timeout(guard, left)
            .unwrap_or_else(|e| e.into_inner());
        (g, false)
    }
}

/// Builds the ranks of one in-process process group.
#[derive(Debug)]
pub struct InProcessGroup;

impl InProcessGroup {
    /// Creates `world_size` connected transports; element `r` is rank `r`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `world_size` is 0.
    pub fn create(world_size: u32) -> Result<Vec<InProcessTransport>> {
        if world_size == 0 {
            return Err(Error::InvalidArgument(
                "world_size must be at least 1".into(),
            ));
        }
        let n = world_size as usize;
        let shared = Arc::new(Shared {
            world_size,
            state: Mutex::new(State {
                next_op: vec![0; n],
                departed: vec![None; n],
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        Ok((0..world_size)
            .map(|rank| InProcessTransport {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect())
    }
}

/// One rank's end of an in-process process group. See the module docs.
#[derive(Debug)]
pub struct InProcessTransport {
    rank: u32,
    shared: Arc<Shared>,
}

impl InProcessTransport {
    fn check_peer(&self, peer: u32) -> Result<()> {
        crate::transport::toolkit::check_peer(peer, self.rank, self.shared.world_size)
    }

    fn check_alive(&self, st: &State) -> Result<()> {
        if st.departed[self.rank as usize].is_some() {
            return Err(crate::transport::toolkit::shut_down(self.rank));
        }
        Ok(())
    }

    /// Deposits this rank's part of its next collective and waits for all
    /// parts. Returns them, index = rank.
    fn collective(&self, op: OpKind, data: &[u8], deadline: Deadline) -> Result<Vec<Arc<[u8]>>> {
        let start = Instant::now();
        let me = self.rank as usize;
        let n = self.shared.world_size as usize;
        let mut st = self.shared.lock();
        self.check_alive(&st)?;
        let index = st.next_op[me];
        st.next_op[me] += 1;
        let slot = st.slots.entry(index).or_insert_with(|| Slot {
            op,
            parts: vec![None; n],
            readers: 0,
        });
        if slot.op != op {
            let other = slot.op;
            return Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "collective #{index} mismatch: rank {me} called {op:?}, another rank called {other:?}"
                ),
                engine: None,
            });
        }
        slot.parts[me] = Some(Arc::from(data));
        self.shared.changed.notify_all();
        loop {
            let slot = st.slots.get(&index).ok_or_else(|| Error::Backend {
                backend: BACKEND,
                message: format!("collective #{index} vanished"),
                engine: None,
            })?;
            let missing: Vec<u32> = (0..self.shared.world_size)
                .filter(|&r| slot.parts[r as usize].is_none())
                .collect();
            if missing.is_empty() {
                let parts: Vec<Arc<[u8]>> = slot.parts.iter().flatten().cloned().collect();
                let slot = st.slots.get_mut(&index).ok_or_else(|| Error::Backend {
                    backend: BACKEND,
                    message: format!("collective #{index} vanished"),
                    engine: None,
                })?;
                slot.readers += 1;
                if slot.readers == self.shared.world_size {
                    st.slots.remove(&index);
                }
                return Ok(parts);
            }
            // Report once every missing rank is accounted for (left), or at
            // the deadline naming all of them: the same set in every run.
            let lost: Vec<(u32, PeerLoss)> = missing
                .iter()
                .filter_map(|&r| st.departed[r as usize].map(|why| (r, why)))
                .collect();
            if lost.len() == missing.len() {
                return Err(Error::peer_lost(lost, ""));
            }
            let (g, expired) = self.shared.wait(st, deadline);
            st = g;
            if expired {
                return Err(Error::timeout(missing, lost, start.elapsed()));
            }
        }
    }
}

fn too_large(rank: usize, len: usize, limit: usize) -> Error {
    Error::message_too_large(u32::try_from(rank).unwrap_or(u32::MAX), len, limit)
}

impl Transport for InProcessTransport {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.shared.world_size
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// All of them: every rank's queues are in one process.
    fn capabilities(&self) -> crate::Capabilities {
        crate::Capabilities::none()
            .with_names_missing_ranks()
            .with_tells_peers_it_left()
            .with_cheap_point_to_point()
    }

    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>> {
        crate::transport::toolkit::check_size("all_gather", data.len(), max_bytes)?;
        let parts = self.collective(OpKind::AllGather, data, deadline)?;
        if let Some((r, p)) = parts.iter().enumerate().find(|(_, p)| p.len() > max_bytes) {
            return Err(too_large(r, p.len(), max_bytes));
        }
        Ok(parts.iter().map(|p| p.to_vec()).collect())
    }

    fn barrier(&self, deadline: Deadline) -> Result<()> {
        self.collective(OpKind::Barrier, &[], deadline).map(|_| ())
    }

    fn send(&self, peer: u32, tag: u32, data: &[u8], _deadline: Deadline) -> Result<()> {
        self.check_peer(peer)?;
        let mut st = self.shared.lock();
        self.check_alive(&st)?;
        if let Some(reason) = st.departed[peer as usize] {
            return Err(Error::peer_lost(vec![(peer, reason)], ""));
        }
        st.mailboxes
            .entry((self.rank, peer, tag))
            .or_default()
            .push_back(data.to_vec());
        self.shared.changed.notify_all();
        Ok(())
    }

    fn recv(&self, peer: u32, tag: u32, max_bytes: usize, deadline: Deadline) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let start = Instant::now();
        let mut st = self.shared.lock();
        self.check_alive(&st)?;
        let key = (peer, self.rank, tag);
        loop {
            if let Some(q) = st.mailboxes.get_mut(&key) {
                if let Some(msg) = q.pop_front() {
                    if q.is_empty() {
                        st.mailboxes.remove(&key);
                    }
                    if msg.len() > max_bytes {
                        return Err(too_large(peer as usize, msg.len(), max_bytes));
                    }
                    return Ok(msg);
                }
            }
            if let Some(reason) = st.departed[peer as usize] {
                return Err(Error::peer_lost(vec![(peer, reason)], ""));
            }
            let (g, expired) = self.shared.wait(st, deadline);
            st = g;
            if expired {
                return Err(Error::timeout(vec![peer], Vec::new(), start.elapsed()));
            }
        }
    }

    fn shutdown(&self) -> Result<()> {
        self.depart(PeerLoss::Shutdown);
        Ok(())
    }

    fn abort(&self) -> Result<()> {
        self.depart(PeerLoss::Aborted);
        Ok(())
    }
}

impl InProcessTransport {
    /// Marks this rank gone (the first reason sticks) and wakes every waiter.
    fn depart(&self, why: PeerLoss) {
        let mut st = self.shared.lock();
        let me = &mut st.departed[self.rank as usize];
        if me.is_none() {
            *me = Some(why);
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for InProcessTransport {
    fn drop(&mut self) {
        self.depart(PeerLoss::Disconnected);
    }
}

/// A key–value store shared by the threads of one process. Cloning gives
/// another handle to the same store.
#[derive(Clone, Debug, Default)]
pub struct InProcessStore {
    inner: Arc<StoreInner>,
}

#[derive(Debug, Default)]
struct StoreInner {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl InProcessStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.inner.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of keys currently set.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn wait_for<T>(
        &self,
        deadline: Deadline,
        what: &str,
        mut ready: impl FnMut(&HashMap<String, Vec<u8>>) -> Option<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut map = self.lock();
        loop {
            if let Some(v) = ready(&map) {
                return Ok(v);
            }
            let left = deadline.remaining();
            if left.is_zero() {
                tracing::debug!("in-process store: timed out waiting for {what}");
                return Err(Error::timeout(Vec::new(), Vec::new(), start.elapsed()));
            }
            map = self
                .inner
                .changed
                .wait_timeout(map, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Store for InProcessStore {
    fn set(&self, key: &str, value: &[u8], _deadline: Deadline) -> Result<()> {
        self.lock().insert(key.to_owned(), value.to_vec());
        self.inner.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>> {
        self.wait_for(deadline, key, |m| m.get(key).cloned())
    }

    fn add(&self, key: &str, delta: i64, _deadline: Deadline) -> Result<i64> {
        let mut map = self.lock();
        let current = match map.get(key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("store key '{key}' does not hold a counter"))
                })?,
        };
        let new = current
            .checked_add(delta)
            .ok_or_else(|| Error::InvalidArgument(format!("counter '{key}' would overflow")))?;
        map.insert(key.to_owned(), new.to_string().into_bytes());
        drop(map);
        self.inner.changed.notify_all();
        Ok(new)
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        self.wait_for(deadline, "keys", |m| {
            keys.iter().all(|k| m.contains_key(*k)).then_some(())
        })
    }

    fn delete(&self, key: &str, _deadline: Deadline) -> Result<bool> {
        let existed = self.lock().remove(key).is_some();
        self.inner.changed.notify_all();
        Ok(existed)
    }
}
