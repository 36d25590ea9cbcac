//! criterion benches of the CPU work of an exchange: join throughput
//! (64 ranks × 1000 sources), envelope encode/decode, and the wire bytes per
//! state (printed; compare with the pickle sizes `ccol bench` prints for
//! PyTorch's `all_gather_object`).
//!
//! `cargo bench -p compiler-collectives-core --bench exchange`; PyTorch's
//! join on the same states: `python bench/pytorch_bench.py join --sources 1000
//! --ranks 64 --pickle-sizes 20,200,2000 --out join.json` (or `ccol bench`,
//! which runs both and prints the ratio).

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::protocol::envelope::{Envelope, Limits, WIRE_VERSION};
use compiler_collectives_core::protocol::{decode_payload, encode_payload};
use compiler_collectives_core::Join;
use compiler_collectives_harness::benchmark::{bench_state, envelope_bytes, BENCH_KEY};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn join(c: &mut Criterion) {
    let (ranks, sources) = (64u64, 1000usize);
    let states: Vec<FrameState> = (0..ranks).map(|r| bench_state(sources, r)).collect();
    let mut g = c.benchmark_group("join");
    g.throughput(Throughput::Elements(ranks * sources as u64));
    g.bench_function("64 ranks x 1000 sources", |b| {
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

fn envelope(c: &mut Criterion) {
    let limits = Limits::default();
    let mut g = c.benchmark_group("envelope");
    for sources in [20usize, 200, 2000] {
        let state = bench_state(sources, 1);
        println!(
            "wire bytes, {sources} sources: {} (envelope)",
            envelope_bytes(&state).unwrap_or(0)
        );
        let make = |s: &FrameState| Envelope {
            version: WIRE_VERSION,
            seq: 7,
            kind: "shape.frame_state".into(),
            key: BENCH_KEY.into(),
            config: String::new(),
            payload: encode_payload(s).unwrap_or_default(),
        };
        let bytes = make(&state).encode(&limits).unwrap_or_default();
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(BenchmarkId::new("encode", sources), &state, |b, s| {
            b.iter(|| make(black_box(s)).encode(&limits))
        });
        g.bench_with_input(BenchmarkId::new("decode", sources), &bytes, |b, bytes| {
            b.iter(|| {
                let env = Envelope::decode(black_box(bytes), &limits).ok()?;
                decode_payload::<FrameState>(&env.payload).ok()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, join, envelope);
criterion_main!(benches);
