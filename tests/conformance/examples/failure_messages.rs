//! Prints the error every rank gets for each kind of failure, as the README's
//! "Failure behaviour and security" section shows them: 3 in-process ranks,
//! rank 2 misbehaving, channels limited to 4096-byte messages. `cargo run -p compiler-collectives-conformance --example failure_messages`

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::protocol::envelope::{self, Envelope, Limits, WIRE_VERSION};
use compiler_collectives_core::{Channel, ChannelOptions, Deadline, InProcessGroup, Transport};
use std::sync::Arc;
use std::time::Duration;

type Odd = fn(&mut Channel) -> Option<compiler_collectives_core::Error>;
type Role = fn(u32, &mut Channel) -> Option<compiler_collectives_core::Error>;

fn state(batch: u64) -> FrameState {
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor([batch, 10]));
    s
}

/// Rank 0's second exchange, as in every case.
fn second(rank: u32, ch: &mut Channel) -> Option<compiler_collectives_core::Error> {
    ch.exchange("train_step@model.rs:88", &state(8 + u64::from(rank)))
        .err()
}

/// Runs one case: ranks 0 and 1 exchange under `train_step@model.rs:88`;
/// rank 2 does `odd`. Prints every rank's error.
fn case(title: &str, odd: Odd) {
    roles(
        title,
        |rank, ch| if rank == 2 { None } else { second(rank, ch) },
        odd,
    );
}

/// Runs one case where every rank's second step is `role` (rank 2's is
/// `odd`) after a first exchange together. Prints every rank's error.
fn roles(title: &str, role: Role, odd: Odd) {
    let ranks = InProcessGroup::create(3).expect("group");
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let rank = t.rank();
                let limits = Limits::default().with_max_message_bytes(4096);
                let opts = ChannelOptions::default()
                    .with_timeout(Duration::from_secs(2))
                    .with_limits(limits);
                let mut ch = Channel::with_options(Arc::new(t), opts).expect("channel");
                ch.exchange("train_step@model.rs:88", &state(8))
                    .expect("first exchange");
                if rank == 2 {
                    odd(&mut ch)
                } else {
                    role(rank, &mut ch)
                }
            })
        })
        .collect();
    let errors: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect();
    println!("## {title}");
    for (r, e) in errors.iter().enumerate() {
        match e {
            Some(e) => println!("rank {r} [{}]: {e}", e.kind()),
            None => println!("rank {r}: (no error: the misbehaving rank)"),
        }
    }
    println!();
}

fn raw(ch: &Channel, digest_version: u16, payload: Vec<u8>) {
    let t = ch.transport();
    let env = Envelope {
        version: WIRE_VERSION,
        seq: 1,
        kind: "shape.frame_state".into(),
        key: "train_step@model.rs:88".into(),
        config: String::new(),
        payload,
    };
    let bytes = env.encode(&Limits::default()).expect("encode");
    let d = envelope::encode_digest_msg(digest_version, 1, &envelope::digest(&bytes));
    let deadline = Deadline::after(Duration::from_secs(2));
    if t.all_gather_fixed(&d, deadline).is_ok() && digest_version == WIRE_VERSION {
        let _ = t.all_gather(&bytes, 1 << 20, deadline);
    }
}

fn main() {
    // RUST_LOG, CCOL_LOG_FORMAT: the library's `tracing` events on stderr.
    compiler_collectives_harness::logging::init();
    case("desync: another compile key", |ch| {
        ch.exchange("eval_step@model.rs:120", &state(8)).err()
    });
    case("desync: another sequence number (a second channel)", |ch| {
        let opts = ChannelOptions::default().with_timeout(Duration::from_secs(2));
        let mut fresh = Channel::with_options(Arc::clone(ch.transport()), opts).expect("channel");
        fresh.exchange("train_step@model.rs:88", &state(8)).err()
    });
    case("configuration disagreement", |ch| {
        ch.exchange_with(
            "train_step@model.rs:88",
            &state(8),
            &compiler_collectives_core::ExchangeOptions::default()
                .with_config("overrides={x=force_static}"),
        )
        .err()
    });
    case("another wire version (a v2 digest)", |ch| {
        raw(ch, 2, Vec::new());
        None
    });
    case("a corrupted payload", |ch| {
        raw(ch, WIRE_VERSION, vec![0xff; 9]);
        None
    });
    case("an oversized message (limit 4096 bytes)", |ch| {
        raw(ch, WIRE_VERSION, vec![0; 10_000]);
        None
    });
    case("a rank that never arrives (2 s deadline)", |ch| {
        std::thread::sleep(Duration::from_millis(2500));
        ch.abort();
        None
    });
    case("a rank that shuts its channel down", |ch| {
        ch.shutdown().err()
    });
    case("a rank that aborts after an error of its own", |ch| {
        ch.abort();
        None
    });
    roles(
        "two ranks leave at different times (rank 2 at once, rank 1 after 300 ms)",
        |rank, ch| {
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(300));
                return ch.shutdown().err();
            }
            second(rank, ch)
        },
        |ch| ch.shutdown().err(),
    );
    roles(
        "one rank left, one silent (rank 1 sleeps past the 2 s deadline)",
        |rank, ch| {
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(2500));
                ch.abort();
                return None;
            }
            second(rank, ch)
        },
        |ch| ch.shutdown().err(),
    );
    roles(
        "use after shutdown (every rank shuts down, then exchanges)",
        |rank, ch| match ch.shutdown() {
            Ok(()) => second(rank, ch),
            Err(e) => Some(e),
        },
        |ch| match ch.shutdown() {
            Ok(()) => second(2, ch),
            Err(e) => Some(e),
        },
    );
}
