//! The Rust side's log events (`tracing`) → Python's `logging`.
//!
//! An event of target `compiler_collectives_<crate>::<path>` goes to the
//! logger `compiler_collectives.<crate>.<path>`, one of target
//! `ccol::<name>` (the exchange's own events: `ccol::exchange`) to
//! `compiler_collectives.<name>`, any other to
//! `compiler_collectives.native.<target>`, so `logging.basicConfig` or a
//! handler on the `compiler_collectives` logger shows them. Levels map as
//! ERROR 40, WARN 30, INFO 20, DEBUG 10, TRACE 5, except the exchange's own
//! events (`ccol::exchange`), at DEBUG: the error of a failed exchange
//! reaches the caller anyway.
//!
//! No Rust thread ever takes the GIL for this: an event is queued (at most
//! [`QUEUE_LIMIT`] of them; a count of those dropped beyond is logged in
//! their place), and the queue is handed to `logging` by the thread that
//! called into the package, when its call returns ([`flush`]: it holds the
//! GIL and no lock of this crate). So events of a rank's background threads
//! show when its next call into the package returns. Only events at or
//! above the `compiler_collectives` logger's effective level are formatted
//! (read at each flush).

use pyo3::prelude::*;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The target of the exchange's own events (`exchange done`, `exchange
/// failed`): handed to `logging` at DEBUG here.
const EXCHANGE_TARGET: &str = "ccol::exchange";

/// Most events held between two flushes.
const QUEUE_LIMIT: usize = 1024;

/// Python's level numbers (`logging.ERROR`, …; TRACE is 5).
fn python_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// The Python level an event is logged at: its own, except the
/// exchange's events, at DEBUG at most. The package raises every failed
/// exchange's error to its caller (with rank, exchange and key): the event
/// says nothing more, and at WARNING Python's last-resort handler would
/// print it bare on stderr.
fn event_level(metadata: &Metadata<'_>) -> u8 {
    let level = python_level(metadata.level());
    if metadata.target() == EXCHANGE_TARGET {
        level.min(python_level(&Level::DEBUG))
    } else {
        level
    }
}

/// The `compiler_collectives` logger's effective level (Python's number);
/// events below it are not formatted. WARNING (Python's default) until
/// the first flush reads the logger.
static THRESHOLD: AtomicU8 = AtomicU8::new(30);

struct Record {
    level: u8,
    logger: String,
    message: String,
}

#[derive(Default)]
struct Queue {
    records: VecDeque<Record>,
    dropped: u64,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    records: VecDeque::new(),
    dropped: 0,
});

/// The logger of an event's target.
fn logger_name(target: &str) -> String {
    match target
        .strip_prefix("compiler_collectives_")
        .or_else(|| target.strip_prefix("ccol::"))
    {
        Some(rest) => format!("compiler_collectives.{}", rest.replace("::", ".")),
        None => format!("compiler_collectives.native.{}", target.replace("::", ".")),
    }
}

/// The event's message, then its other fields as ` name=value`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

struct ToPython;

impl<S: Subscriber> Layer<S> for ToPython {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // The threshold changes with Python's configuration: ask each time.
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        event_level(metadata) >= THRESHOLD.load(Ordering::Relaxed)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut text = Text::default();
        event.record(&mut text);
        let metadata = event.metadata();
        let record = Record {
            level: event_level(metadata),
            logger: logger_name(metadata.target()),
            message: text.message + &text.fields,
        };
        let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.records.len() < QUEUE_LIMIT {
            queue.records.push_back(record);
        } else {
            queue.dropped += 1;
        }
    }
}

/// Makes this module the process's `tracing` subscriber (the extension's own
/// copy of `tracing`: other Rust extensions are not affected). Once; a
/// second call does nothing.
pub(crate) fn install() {
    let subscriber = tracing_subscriber::registry().with(ToPython);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Hands the queued events to Python's `logging`, and reads the
/// `compiler_collectives` logger's level for the events to come. Called
/// with the GIL, holding no lock of this crate.
///
/// # Errors
/// Only what is not an `Exception`: a `KeyboardInterrupt` (Python runs its
/// pending signal handlers inside these calls) or `SystemExit` is handed
/// back to be raised; a failure of `logging` itself is ignored (logging must
/// not fail a call).
pub(crate) fn flush(py: Python<'_>) -> PyResult<()> {
    let (records, dropped) = {
        let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
        (
            std::mem::take(&mut queue.records),
            std::mem::take(&mut queue.dropped),
        )
    };
    let outcome = (|| -> PyResult<()> {
        let logging = py.import("logging")?;
        let get = logging.getattr("getLogger")?;
        let root = get.call1(("compiler_collectives",))?;
        let level: u8 = root
            .call_method0("getEffectiveLevel")?
            .extract::<i64>()
            .map(|l| u8::try_from(l.clamp(0, 255)).unwrap_or(u8::MAX))?;
        THRESHOLD.store(level, Ordering::Relaxed);
        for r in records {
            get.call1((r.logger.as_str(),))?
                .call_method1("log", (r.level, "%s", r.message))?;
        }
        if dropped > 0 {
            root.call_method1(
                "warning",
                (
                    "%d log events of the native side were dropped (more than %d between two calls)",
                    dropped,
                    QUEUE_LIMIT,
                ),
            )?;
        }
        Ok(())
    })();
    match outcome {
        Err(e) if !e.is_instance_of::<pyo3::exceptions::PyException>(py) => Err(e),
        _ => Ok(()),
    }
}
