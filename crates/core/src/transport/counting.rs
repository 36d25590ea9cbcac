//! [`CountingTransport`]: a [`Transport`] wrapper that counts the bytes this
//! rank receives and sends, for benchmarks and tests (e.g. the per-rank
//! bytes of the flat and hierarchical exchanges).

use crate::error::Result;
use crate::transport::{Deadline, Transport};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Byte counts of one rank, shared between a [`CountingTransport`] and
/// whoever reads them after the transport moved into a channel.
#[derive(Debug, Default)]
pub struct ByteCounts {
    received: AtomicU64,
    sent: AtomicU64,
    longest: AtomicU64,
}

impl ByteCounts {
    /// Bytes that came from other ranks (payload bytes, not engine headers).
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Bytes this rank handed to the engine for other ranks (an all_gather
    /// counts its buffer once per peer).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// The longest buffer (bytes) any rank contributed to the last
    /// variable-length all_gather: an exchange's envelope size when the
    /// fast path did not serve it. 0 before the first.
    pub fn last_gather_longest(&self) -> u64 {
        self.longest.load(Ordering::Relaxed)
    }

    /// Sets every count to zero.
    pub fn reset(&self) {
        self.received.store(0, Ordering::Relaxed);
        self.sent.store(0, Ordering::Relaxed);
        self.longest.store(0, Ordering::Relaxed);
    }

    fn add(&self, received: usize, sent: usize) {
        self.received.fetch_add(
            u64::try_from(received).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.sent
            .fetch_add(u64::try_from(sent).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// Wraps a transport and counts payload bytes per operation: an all_gather
/// receives every other rank's buffer; a broadcast's non-root ranks receive
/// the root's; a `recv` receives its message. Costs one atomic add per call.
///
/// Every method of [`Transport`], the provided ones too, is forwarded to the
/// inner transport's own, so a backend's native rounds run as they would
/// unwrapped (tests/counting.rs checks that none is left out).
#[derive(Debug)]
pub struct CountingTransport<T: ?Sized> {
    inner: Arc<T>,
    counts: Arc<ByteCounts>,
}

impl<T: Transport> CountingTransport<T> {
    /// Wraps `inner` with fresh counts.
    pub fn new(inner: T) -> Self {
        Self::shared(Arc::new(inner))
    }
}

impl<T: Transport + ?Sized> CountingTransport<T> {
    /// Wraps a transport the caller keeps using too (its own calls are not
    /// counted), with fresh counts.
    pub fn shared(inner: Arc<T>) -> Self {
        CountingTransport {
            inner,
            counts: Arc::new(ByteCounts::default()),
        }
    }

    /// The counts (shared: they keep counting after the transport moved).
    pub fn counts(&self) -> Arc<ByteCounts> {
        Arc::clone(&self.counts)
    }
}

impl<T: Transport + ?Sized> Transport for CountingTransport<T> {
    fn rank(&self) -> u32 {
        self.inner.rank()
    }

    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> crate::Capabilities {
        self.inner.capabilities()
    }

    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>> {
        let out = self.inner.all_gather(data, max_bytes, deadline)?;
        let me = self.rank() as usize;
        let got = out
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != me)
            .map(|(_, b)| b.len())
            .sum();
        self.counts
            .add(got, data.len() * out.len().saturating_sub(1));
        let longest = out.iter().map(Vec::len).max().unwrap_or(0);
        self.counts.longest.store(
            u64::try_from(longest).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        Ok(out)
    }

    fn all_gather_fixed(&self, data: &[u8], deadline: Deadline) -> Result<Vec<u8>> {
        let out = self.inner.all_gather_fixed(data, deadline)?;
        let peers = (self.world_size() as usize).saturating_sub(1);
        self.counts.add(data.len() * peers, data.len() * peers);
        Ok(out)
    }

    fn all_gather_sized(
        &self,
        data: &[u8],
        lens: &[usize],
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>> {
        let out = self.inner.all_gather_sized(data, lens, deadline)?;
        let me = self.rank() as usize;
        let got = lens
            .iter()
            .enumerate()
            .filter(|&(r, _)| r != me)
            .map(|(_, &len)| len)
            .sum();
        self.counts
            .add(got, data.len() * lens.len().saturating_sub(1));
        Ok(out)
    }

    fn broadcast(
        &self,
        data: &[u8],
        root: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<u8>> {
        let out = self.inner.broadcast(data, root, max_bytes, deadline)?;
        let peers = (self.world_size() as usize).saturating_sub(1);
        if root == self.rank() {
            self.counts.add(0, data.len() * peers);
        } else {
            self.counts.add(out.len(), 0);
        }
        Ok(out)
    }

    fn barrier(&self, deadline: Deadline) -> Result<()> {
        self.inner.barrier(deadline)
    }

    fn send(&self, peer: u32, tag: u32, data: &[u8], deadline: Deadline) -> Result<()> {
        self.inner.send(peer, tag, data, deadline)?;
        self.counts.add(0, data.len());
        Ok(())
    }

    fn recv(&self, peer: u32, tag: u32, max_bytes: usize, deadline: Deadline) -> Result<Vec<u8>> {
        let out = self.inner.recv(peer, tag, max_bytes, deadline)?;
        self.counts.add(out.len(), 0);
        Ok(out)
    }

    fn shutdown(&self) -> Result<()> {
        self.inner.shutdown()
    }

    fn abort(&self) -> Result<()> {
        self.inner.abort()
    }
}
