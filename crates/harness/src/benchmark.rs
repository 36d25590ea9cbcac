//! Measurements behind `ccol bench` and the criterion benches, written once
//! over any [`Transport`] so every engine runs the same loop.
//!
//! - [`bench_state`]: the benchmark's [`FrameState`] — `sources` tensors of
//!   shape `(8, 16, 4)` named `s0, s1, …`, where every third source has dim 0
//!   `8 + rank` (so ranks differ and the fast path does not apply).
//! - [`measure_exchange`]: per round, interleaved on one transport so that
//!   noise hits all of them: the raw engine floor (a lengths all_gather of 8
//!   bytes, then an all_gather of the envelope's byte count), our exchange
//!   (`Channel::exchange_in_place` of the rank's state: slot round,
//!   envelopes that did not fit, checks, every peer's payload joined into
//!   the state), the same exchange returning a new value
//!   (`Channel::exchange`: rank 0's payload decoded, the others joined into
//!   it), the fast path (identical states) and its floor (a 16-byte
//!   all_gather). Each timing follows a barrier. Every round
//!   builds its states afresh (equal-valued, new allocations), so nothing
//!   keyed on a value's identity can serve a round. With a [`HeapCounter`]
//!   the first [`HEAP_ROUNDS`] recorded rounds add one untimed exchange of
//!   differing states whose allocations are counted.
//! - [`simulate`]: in-process ranks (threads) exchanging 20-source states,
//!   flat or hierarchical, with the bytes each rank received.

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::protocol::envelope::{Envelope, Limits, WIRE_VERSION};
use compiler_collectives_core::protocol::join::Join;
use compiler_collectives_core::protocol::{
    encode_payload, Channel, ChannelOptions, ExchangeOptions,
};
use compiler_collectives_core::transport::counting::CountingTransport;
use compiler_collectives_core::transport::inprocess::InProcessGroup;
use compiler_collectives_core::transport::{Deadline, Transport};
use compiler_collectives_core::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Recorded rounds whose extra, untimed exchange counts allocations.
pub const HEAP_ROUNDS: usize = 20;

/// Compile key of the benchmark's exchanges.
pub const BENCH_KEY: &str = "bench";

/// The benchmark's state of `sources` sources on `rank` (see the module docs).
pub fn bench_state(sources: usize, rank: u64) -> FrameState {
    let mut s = FrameState::new();
    for i in 0..sources {
        let d0 = if i % 3 == 0 { 8 + rank } else { 8 };
        s.record(&format!("s{i}"), &Observation::tensor([d0, 16, 4]));
    }
    s
}

/// Bytes of the envelope one exchange of `value` sends (header, kind, key
/// [`BENCH_KEY`], empty configuration, payload).
///
/// # Errors
/// [`Error::InvalidArgument`] if the value cannot be encoded.
pub fn envelope_bytes<J: Join>(value: &J) -> Result<usize> {
    let env = Envelope {
        version: WIRE_VERSION,
        seq: 0,
        kind: J::KIND.to_owned(),
        key: BENCH_KEY.to_owned(),
        config: String::new(),
        payload: encode_payload(value)?,
    };
    env.encode(&Limits::default())
        .map(|b| b.len())
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// Process-wide allocator counters at one instant (bytes as requested of
/// the allocator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCount {
    /// Bytes allocated since the process started (a realloc counts its new size).
    pub allocated_bytes: u64,
    /// Allocations since the process started (a realloc counts one).
    pub allocations: u64,
    /// Bytes allocated and not freed since the last [`HeapCounter::start`].
    pub live_bytes: u64,
    /// Most of [`HeapCount::live_bytes`] at once since the last [`HeapCounter::start`].
    pub peak_live_bytes: u64,
}

/// A counting global allocator's view, for the allocation figures of
/// [`measure_exchange`] (the `ccol` binary and the c10d worker install one:
/// [`crate::heap`]).
pub trait HeapCounter: Sync {
    /// Starts counting: live and peak bytes start from zero.
    fn start(&self);
    /// Stops counting (the counters keep their values for [`HeapCounter::read`]).
    fn stop(&self);
    /// The counters now; `None` when no counting allocator is installed.
    fn read(&self) -> Option<HeapCount>;
}

/// This rank's timings for one state size, in milliseconds per round.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Sources in the state.
    pub sources: usize,
    /// Bytes of this rank's envelope.
    pub envelope_bytes: usize,
    /// Lengths all_gather + all_gather of `envelope_bytes` bytes.
    pub floor_ms: Vec<f64>,
    /// `Channel::exchange_in_place` with rank-dependent states (the state
    /// becomes the join).
    pub ours_ms: Vec<f64>,
    /// `Channel::exchange` with rank-dependent states (the join is a new
    /// value, dropped after the timing).
    pub owned_ms: Vec<f64>,
    /// `Channel::exchange` with identical states (fast path).
    pub fast_ms: Vec<f64>,
    /// One 16-byte all_gather.
    pub floor16_ms: Vec<f64>,
    /// Per counted exchange of differing states (the first [`HEAP_ROUNDS`]
    /// recorded rounds): bytes allocated (empty without a [`HeapCounter`]).
    pub alloc_bytes: Vec<u64>,
    /// Per counted exchange: allocations.
    pub allocations: Vec<u64>,
    /// Per counted exchange: the most bytes it had allocated and not yet
    /// freed at once (frees of blocks older than the exchange count
    /// against it, so this is a lower bound).
    pub peak_live_bytes: Vec<u64>,
}

fn timed(t: &dyn Transport, deadline: Deadline, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    t.barrier(deadline)?;
    let start = Instant::now();
    f()?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// One rank's samples as the JSON `ccol bench` reads back from each rank
/// (`bench-rank-<R>.json`): `{"rank": R, "sizes": [{"sources", "envelope_bytes",
/// "floor_ms", "ours_ms", "owned_ms", "fast_ms", "floor16_ms", "alloc_bytes",
/// "allocations", "peak_live_bytes"}, …]}`, times in ms.
pub fn samples_json(rank: u32, samples: &[Samples]) -> serde_json::Value {
    serde_json::json!({
        "rank": rank,
        "sizes": samples.iter().map(|s| serde_json::json!({
            "sources": s.sources,
            "envelope_bytes": s.envelope_bytes,
            "floor_ms": s.floor_ms,
            "ours_ms": s.ours_ms,
            "owned_ms": s.owned_ms,
            "fast_ms": s.fast_ms,
            "floor16_ms": s.floor16_ms,
            "alloc_bytes": s.alloc_bytes,
            "allocations": s.allocations,
            "peak_live_bytes": s.peak_live_bytes,
        })).collect::<Vec<_>>(),
    })
}

/// Runs the interleaved measurement of the module docs for each state size
/// in `sizes`: `warmup` rounds, then `rounds` recorded ones. Every rank must
/// call it with the same arguments. `heap`, when given and installed,
/// records the allocations of each recorded exchange of differing states
/// ([`Samples::alloc_bytes`]).
///
/// Cost per round: 5 barriers, 4 all_gathers of ≤ 4096 bytes, 3 of the
/// envelope's size.
///
/// # Errors
/// The transport's or the channel's errors; [`Error::InvalidArgument`] if a
/// round took the wrong path (fast path on differing states or not on
/// identical ones).
pub fn measure_exchange(
    transport: Arc<dyn Transport>,
    sizes: &[usize],
    warmup: usize,
    rounds: usize,
    timeout: Duration,
    heap: Option<&dyn HeapCounter>,
) -> Result<Vec<Samples>> {
    let rank = u64::from(transport.rank());
    let t = &*transport;
    let opts = ChannelOptions::default().with_timeout(timeout);
    let mut channel = Channel::with_options(Arc::clone(&transport), opts)?;
    let max = Limits::default().max_message_bytes;
    let mut out = Vec::new();
    for &sources in sizes {
        let len = envelope_bytes(&bench_state(sources, rank))?;
        let filler = vec![0x5au8; len];
        let mut s = Samples {
            sources,
            envelope_bytes: len,
            ..Samples::default()
        };
        for round in 0..warmup + rounds {
            // Fresh, equal-valued states every round (see the module docs).
            let mut state = bench_state(sources, rank);
            let other = bench_state(sources, rank);
            let same = bench_state(sources, 0);
            let deadline = Deadline::after(timeout);
            let floor = timed(t, deadline, || {
                t.all_gather_fixed(&(len as u64).to_le_bytes(), deadline)?;
                t.all_gather(&filler, max, deadline).map(|_| ())
            })?;
            let mut fast_path = true;
            let in_place = ExchangeOptions::default();
            let ours = timed(t, deadline, || {
                fast_path = channel
                    .exchange_in_place(BENCH_KEY, &mut state, &in_place)?
                    .fast_path();
                Ok(())
            })?;
            // The join as a new value; dropping it is the caller's cost, later.
            let mut result = None;
            let owned = timed(t, deadline, || {
                let g = channel.exchange(BENCH_KEY, &other)?;
                fast_path |= g.fast_path();
                result = Some(g);
                Ok(())
            })?;
            drop(result);
            // The heap figures come from an exchange of their own, untimed,
            // in the first recorded rounds: counting slows the allocator.
            let mut counted = None;
            if let Some(h) = heap.filter(|_| round >= warmup && round < warmup + HEAP_ROUNDS) {
                let mut fresh = bench_state(sources, rank);
                t.barrier(deadline)?;
                let before = h.read();
                h.start();
                let got = channel
                    .exchange_in_place(BENCH_KEY, &mut fresh, &in_place)
                    .map(drop);
                h.stop();
                got?;
                counted = before.zip(h.read());
            }
            let mut fast_ok = false;
            let fast = timed(t, deadline, || {
                fast_ok = channel.exchange(BENCH_KEY, &same)?.fast_path();
                Ok(())
            })?;
            let floor16 = timed(t, deadline, || {
                t.all_gather_fixed(&[0u8; 16], deadline).map(|_| ())
            })?;
            if (t.world_size() > 1 && fast_path) || !fast_ok {
                return Err(Error::InvalidArgument(format!(
                    "round {round}: the fast path {} on {} states",
                    if fast_ok { "applied" } else { "did not apply" },
                    if fast_ok { "differing" } else { "identical" }
                )));
            }
            if round >= warmup {
                s.floor_ms.push(floor);
                s.ours_ms.push(ours);
                s.owned_ms.push(owned);
                s.fast_ms.push(fast);
                s.floor16_ms.push(floor16);
                if let Some((b, a)) = counted {
                    s.alloc_bytes.push(a.allocated_bytes - b.allocated_bytes);
                    s.allocations.push(a.allocations - b.allocations);
                    s.peak_live_bytes.push(a.peak_live_bytes);
                }
            }
        }
        out.push(s);
    }
    Ok(out)
}

/// One simulated world: time of one exchange and bytes received.
#[derive(Clone, Debug)]
pub struct SimResult {
    /// Ranks (threads).
    pub world_size: u32,
    /// Whether the tree exchange ran.
    pub hierarchical: bool,
    /// Wall time of the measured exchange, ms (slowest rank, from a common
    /// start after a barrier).
    pub exchange_ms: f64,
    /// The most bytes any rank received in that exchange.
    pub max_received_bytes: u64,
    /// Bytes of one rank's payload (postcard of its state).
    pub payload_bytes: usize,
}

/// Simulates `world_size` in-process ranks (one thread each, 256 KiB
/// stacks) exchanging [`bench_state`]`(sources, rank)`: one warm-up exchange,
/// then one measured. `hierarchical` forces the tree (or the flat exchange).
///
/// # Errors
/// [`Error::InvalidArgument`] for a world of 0 or a thread that cannot be
/// started; any rank's exchange error.
pub fn simulate(
    world_size: u32,
    sources: usize,
    hierarchical: bool,
    timeout: Duration,
) -> Result<SimResult> {
    let ranks = InProcessGroup::create(world_size)?;
    let opts = ChannelOptions::default()
        .with_timeout(timeout)
        .with_hierarchical_from(if hierarchical { 2 } else { u32::MAX });
    let payload_bytes = encode_payload(&bench_state(sources, 1))?.len();
    let mut handles = Vec::with_capacity(ranks.len());
    for t in ranks {
        let opts = opts.clone();
        let h = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || -> Result<(Instant, Instant, u64)> {
                let state = bench_state(sources, u64::from(t.rank()));
                let t = CountingTransport::new(t);
                let counts = t.counts();
                let transport: Arc<dyn Transport> = Arc::new(t);
                let mut ch = Channel::with_options(Arc::clone(&transport), opts)?;
                ch.exchange(BENCH_KEY, &state)?;
                transport.barrier(Deadline::after(timeout))?;
                counts.reset();
                let released = Instant::now();
                ch.exchange(BENCH_KEY, &state)?;
                Ok((released, Instant::now(), counts.received()))
            })
            .map_err(|e| Error::InvalidArgument(format!("cannot start a rank thread: {e}")))?;
        handles.push(h);
    }
    // From the first rank released by the barrier to the last rank done.
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut max_received = 0;
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok((released, end, got))) => {
                first = Some(first.map_or(released, |f| f.min(released)));
                last = Some(last.map_or(end, |l| l.max(end)));
                max_received = max_received.max(got);
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(Error::InvalidArgument("a rank thread panicked".into()));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let exchange_ms = match (first, last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f).as_secs_f64() * 1e3,
        _ => 0.0,
    };
    Ok(SimResult {
        world_size,
        hierarchical,
        exchange_ms,
        max_received_bytes: max_received,
        payload_bytes,
    })
}
