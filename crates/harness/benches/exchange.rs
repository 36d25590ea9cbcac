//! criterion benches of the CPU work of an exchange, per state size
//! (20, 200, 2000 sources of [`bench_state`]):
//! - `encode`: this rank's envelope, written in place as the channel does;
//! - `digest`: XXH3-128 of that envelope (the fast path's comparison);
//! - `decode`: one payload into a frame state (rank 0's, in the exchange);
//! - `join_encoded`: another rank's payload joined straight from its bytes
//!   (every later rank, in `Channel::exchange`);
//! - `join_payloads`: another rank's payload joined into this rank's state,
//!   compared against this rank's own payload (`Channel::exchange_in_place`);
//! - `join`: 64 ranks × 1000 sources, `FrameState::join_all` (two-way
//!   merges into two buffers) and `Join::join` folded in rank order;
//!
//! and the wire bytes per state (printed; compare with the pickle sizes
//!   `ccol bench` prints for PyTorch's `all_gather_object`).
//!
//! `cargo bench -p compiler-collectives-harness --bench exchange`; PyTorch's
//! join on the same states: `python bench/pytorch_bench.py join --sources 1000
//! --ranks 64 --pickle-sizes 20,200,2000 --out join.json` (or `ccol bench`,
//! which runs both and prints the ratio).

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::protocol::envelope::{self, Limits};
use compiler_collectives_core::protocol::{decode_payload, encode_payload, encode_payload_into};
use compiler_collectives_core::Join;
use compiler_collectives_harness::benchmark::{bench_state, envelope_bytes, BENCH_KEY};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn join(c: &mut Criterion) {
    let (ranks, sources) = (64u64, 1000usize);
    let states: Vec<FrameState> = (0..ranks).map(|r| bench_state(sources, r)).collect();
    let mut g = c.benchmark_group("join");
    g.throughput(Throughput::Elements(ranks * sources as u64));
    g.bench_function("64 ranks x 1000 sources, join_all", |b| {
        b.iter(|| FrameState::join_all(black_box(&states)));
    });
    g.bench_function("64 ranks x 1000 sources, folded", |b| {
        b.iter(|| {
            let mut acc = FrameState::new();
            for s in &states {
                acc.join(black_box(s));
            }
            acc
        });
    });
    g.finish();
}

fn wire(c: &mut Criterion) {
    let limits = Limits::default();
    let mut g = c.benchmark_group("wire");
    for sources in [20usize, 200, 2000] {
        let state = bench_state(sources, 1);
        let other = bench_state(sources, 2);
        println!(
            "wire bytes, {sources} sources: {} (envelope)",
            envelope_bytes(&state).unwrap_or(0)
        );
        let payload = encode_payload(&other).unwrap_or_default();
        let mut buf = Vec::new();
        let encode = |s: &FrameState, buf: &mut Vec<u8>| {
            buf.clear();
            envelope::encode_into(buf, 7, FrameState::KIND, BENCH_KEY, "", &limits, |out| {
                encode_payload_into(s, out)
            })
        };
        let _ = encode(&state, &mut buf);
        g.throughput(Throughput::Bytes(buf.len() as u64));
        g.bench_with_input(BenchmarkId::new("encode", sources), &state, |b, s| {
            b.iter(|| encode(black_box(s), &mut buf))
        });
        let bytes = buf.clone();
        g.bench_with_input(BenchmarkId::new("digest", sources), &bytes, |b, bytes| {
            b.iter(|| envelope::digest(black_box(bytes)))
        });
        g.bench_with_input(BenchmarkId::new("decode", sources), &payload, |b, p| {
            b.iter(|| decode_payload::<FrameState>(black_box(p)).ok())
        });
        g.bench_with_input(
            BenchmarkId::new("join_encoded", sources),
            &payload,
            |b, p| {
                b.iter_batched(
                    || state.clone(),
                    |mut acc| {
                        let _ = acc.join_encoded(black_box(p));
                        acc
                    },
                    criterion::BatchSize::SmallInput,
                )
            },
        );
        let own = encode_payload(&state).unwrap_or_default();
        g.bench_with_input(
            BenchmarkId::new("join_payloads", sources),
            &payload,
            |b, p| {
                b.iter_batched(
                    || state.clone(),
                    |mut acc| {
                        let _ = acc.join_payloads(0, black_box(&[own.as_slice(), p.as_slice()]));
                        acc
                    },
                    criterion::BatchSize::SmallInput,
                )
            },
        );
    }
    g.finish();
}

criterion_group!(benches, join, wire);
criterion_main!(benches);
