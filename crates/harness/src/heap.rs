//! A counting global allocator, for the allocation figures of `ccol bench`
//! (per exchange: bytes allocated, allocations, peak live heap).
//!
//! A program opts in by installing it:
//!
//! ```ignore
//! #[global_allocator]
//! static HEAP: compiler_collectives_harness::heap::CountingAlloc =
//!     compiler_collectives_harness::heap::CountingAlloc;
//! ```
//!
//! and passes [`COUNTER`] to
//! [`measure_exchange`](crate::benchmark::measure_exchange).
//! The counts are process-wide (every thread's allocations, the transport's
//! own threads included), in bytes as requested of the allocator; a
//! `realloc` counts as one allocation of the new size. Counting is on only
//! between [`HeapCounter::start`] and [`HeapCounter::stop`] (a relaxed load
//! per call otherwise), so timed exchanges run at the allocator's speed.

use crate::benchmark::{HeapCount, HeapCounter};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static COUNTING: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

fn grew(bytes: usize) {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    let bytes = bytes as u64;
    ALLOCATED.fetch_add(bytes, Ordering::Relaxed);
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        // Blocks allocated before counting began are freed uncounted too
        // often to keep `LIVE` exact: it saturates at zero instead.
        let _ = LIVE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
            Some(l.saturating_sub(bytes as u64))
        });
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only updated, never consulted, on the way.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's pointer, layout and size, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

/// Reads the counters of [`CountingAlloc`]; `None` from
/// [`HeapCounter::read`] until this process installed it (detected by
/// [`COUNTER`] allocating a probe).
#[derive(Debug)]
pub struct Counter;

/// The counter of this process's [`CountingAlloc`].
pub static COUNTER: Counter = Counter;

impl HeapCounter for Counter {
    fn start(&self) {
        COUNTING.store(true, Ordering::Relaxed);
        if !INSTALLED.load(Ordering::Relaxed) {
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            drop(std::hint::black_box(Box::new(0u64)));
            if ALLOCATIONS.load(Ordering::Relaxed) > before {
                INSTALLED.store(true, Ordering::Relaxed);
            }
        }
        LIVE.store(0, Ordering::Relaxed);
        PEAK.store(0, Ordering::Relaxed);
    }

    fn stop(&self) {
        COUNTING.store(false, Ordering::Relaxed);
    }

    fn read(&self) -> Option<HeapCount> {
        INSTALLED.load(Ordering::Relaxed).then(|| HeapCount {
            allocated_bytes: ALLOCATED.load(Ordering::Relaxed),
            allocations: ALLOCATIONS.load(Ordering::Relaxed),
            live_bytes: LIVE.load(Ordering::Relaxed),
            peak_live_bytes: PEAK.load(Ordering::Relaxed),
        })
    }
}
