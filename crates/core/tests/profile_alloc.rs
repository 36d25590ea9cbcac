//! A profile file that declares more entries than the limit is refused
//! before its entries are decoded: a 64 MiB body of tiny entries would
//! otherwise become over a gigabyte of maps and strings before the entry
//! limit is checked. Its own test binary: it counts every allocation.

use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::persistence::profile::{Profile, ProfileLimits};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn too_many_entries_are_refused_before_decoding_them() {
    let mut big = Profile::new();
    for i in 0..100_000 {
        big.record_shapes(&format!("k{i}"), &FrameState::new());
    }
    let bytes = big.encode().expect("encode");
    drop(big);
    let limits = ProfileLimits::default().with_max_entries(10);
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let err = Profile::decode(&bytes, &limits).expect_err("over the entry limit");
    let extra = PEAK.load(Ordering::Relaxed) - before;
    assert!(err.to_string().contains("100000 entries"), "{err}");
    // The file is about 1 MB; its 100 000 entries decoded would take ~10 MB.
    assert!(extra < 64 << 10, "decoding allocated {extra} bytes");
}
