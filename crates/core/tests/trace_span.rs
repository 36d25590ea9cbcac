//! The `tracing` span and event of every exchange.
//!
//! Its own test binary: `tracing` caches per call site whether anyone is
//! interested, so exchanges of other tests running at the same time, with no
//! subscriber, could register the call sites as uninteresting first.

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::Channel;
use std::sync::Arc;

mod each_rank;
use each_rank::on_threads;

/// What was seen: (`span:<name>` or `event:<target>`, its fields).
type Seen = Vec<(String, std::collections::BTreeMap<String, String>)>;

/// A `tracing` subscriber that keeps every span's and event's fields.
#[derive(Clone, Default)]
struct Capture {
    seen: Arc<std::sync::Mutex<Seen>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut f = std::collections::BTreeMap::new();
        attrs.record(&mut Fields(&mut f));
        let name = format!("span:{}", attrs.metadata().name());
        self.seen.lock().expect("lock").push((name, f));
        tracing::span::Id::from_u64(
            1 + self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = std::collections::BTreeMap::new();
        event.record(&mut Fields(&mut f));
        let name = format!("event:{}", event.metadata().target());
        self.seen.lock().expect("lock").push((name, f));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn every_exchange_has_a_span_and_an_event_with_its_figures() {
    let capture = Capture::default();
    // One dispatcher, registered before any exchange reaches a call site.
    let dispatch = tracing::Dispatch::new(capture.clone());
    on_threads(2, move |t| {
        tracing::dispatcher::with_default(&dispatch, || {
            let mut ch = Channel::new(std::sync::Arc::new(t)).expect("channel");
            let mut seen = FrameState::new();
            seen.record("x", &Observation::tensor([4, 10]));
            ch.exchange("step", &seen).expect("exchange");
        })
    });
    let seen = capture.seen.lock().expect("lock").clone();
    let spans: Vec<_> = seen.iter().filter(|(n, _)| n == "span:exchange").collect();
    let events: Vec<_> = seen
        .iter()
        .filter(|(n, _)| n == "event:ccol::exchange")
        .collect();
    assert_eq!(spans.len(), 2, "{seen:?}");
    assert_eq!(events.len(), 2, "{seen:?}");
    for (_, f) in spans {
        assert_eq!(f["seq"], "0");
        assert_eq!(f["key"], "\"step\"");
        assert_eq!(f["kind"], "\"shape.frame_state\"");
    }
    for (_, f) in events {
        // Identical envelopes: the fast path, one 4096-byte slot each way.
        assert_eq!(f["fast_path"], "true");
        assert_eq!(f["outcome"], "\"ok\"");
        assert_eq!(f["bytes_sent"], "4096");
        assert_eq!(f["bytes_received"], "8192");
        assert!(f["duration_us"].parse::<u64>().is_ok(), "{f:?}");
    }
}
