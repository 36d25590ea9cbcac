//! Exchange traces: every rank writes one JSON line per exchange, and
//! `first_divergence` names the first exchange where ranks differ.

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::protocol::trace::{first_divergence, read_trace, TraceRecord};
use compiler_collectives_core::{Channel, ChannelOptions, InProcessGroup, Transport};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod each_rank;
use each_rank::on_threads;

/// Runs 2 ranks, each exchanging under the keys of its list, with traces in `dir`.
fn run(dir: &Path, keys: [&'static [&'static str]; 2]) -> Vec<(u32, Vec<TraceRecord>)> {
    let trace_dir = dir.to_owned();
    on_threads(2, move |t| {
        let r = t.rank();
        let opts = ChannelOptions::default()
            .with_timeout(Duration::from_secs(5))
            .with_trace_dir(&trace_dir);
        let mut ch = Channel::with_options(Arc::new(t), opts).expect("channel");
        for key in keys[r as usize] {
            let mut seen = FrameState::new();
            seen.record("x", &Observation::tensor([u64::from(r) + 4, 10]));
            if ch.exchange(key, &seen).is_err() {
                break;
            }
        }
        ch.abort();
    });
    (0..2)
        .map(|r| {
            (
                r,
                read_trace(&dir.join(format!("rank-{r}.jsonl"))).expect("trace"),
            )
        })
        .collect()
}

#[test]
fn ranks_that_agree_have_no_divergence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = run(dir.path(), [&["a", "b"], &["a", "b"]]);
    for (r, recs) in &traces {
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].seq, 1);
        assert_eq!(recs[1].key, "b");
        assert_eq!(recs[1].rank, *r);
        assert_eq!(recs[1].outcome, "ok");
        // Ranks saw different sizes: the slow path, both envelopes gathered.
        assert_eq!(recs[0].fast_path, Some(false));
        assert!(recs[0].bytes_received > recs[0].bytes_sent);
    }
    // Local payloads differ; the merged value does not.
    assert_ne!(traces[0].1[0].payload_digest, traces[1].1[0].payload_digest);
    assert_eq!(traces[0].1[0].merged_digest, traces[1].1[0].merged_digest);
    assert!(traces[0].1[0].merged_digest.is_some());
    assert_eq!(first_divergence(&traces), None);
}

#[test]
fn a_desync_is_named_at_its_exchange_with_both_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = run(dir.path(), [&["a", "train", "c"], &["a", "eval", "c"]]);
    for (_, recs) in &traces {
        assert_eq!(recs.len(), 2, "the desync ends the run: {recs:?}");
        assert_eq!(recs[1].outcome, "desync");
        assert!(recs[1]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("desync")));
    }
    let d = first_divergence(&traces).expect("diverges");
    assert_eq!(d.seq, 1);
    assert_eq!(d.groups.len(), 2);
    assert_eq!(d.groups[0].ranks, [0]);
    assert!(d.groups[0].what.starts_with("#1 'train'"), "{d}");
    assert!(d.groups[1].what.starts_with("#1 'eval'"), "{d}");
    assert!(
        d.to_string()
            .starts_with("first divergence at exchange #1: rank [0]: #1 'train'"),
        "{d}"
    );
}

#[test]
fn a_missing_exchange_is_a_divergence() {
    let mk = |seq: u64| TraceRecord {
        rank: 0,
        world_size: 2,
        seq,
        key: "k".into(),
        kind: "shape.frame_state".into(),
        config_digest: "0".into(),
        payload_digest: "1".into(),
        merged_digest: Some("2".into()),
        bytes_sent: 32,
        bytes_received: 64,
        duration_us: 5,
        fast_path: Some(true),
        outcome: "ok".into(),
        error: None,
    };
    let traces = vec![(0, vec![mk(0), mk(1), mk(2)]), (1, vec![mk(0), mk(1)])];
    let d = first_divergence(&traces).expect("diverges");
    assert_eq!(d.seq, 2);
    assert_eq!(d.groups[1].ranks, [1]);
    assert_eq!(d.groups[1].what, "no exchange #2 (trace ends at #1)");
    // A truncated trace stops the comparison there.
    let mut cut = mk(2);
    cut.outcome = compiler_collectives_core::protocol::trace::TRUNCATED.into();
    let traces = vec![(0, vec![mk(0), mk(1), cut]), (1, vec![mk(0), mk(1)])];
    assert_eq!(first_divergence(&traces), None);
}

#[test]
fn a_malformed_trace_line_names_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("rank-0.jsonl");
    std::fs::write(&p, "\n{\"not\": \"a record\"}\n").expect("write");
    let e = read_trace(&p).expect_err("malformed").to_string();
    assert!(
        e.contains("rank-0.jsonl: line 2: not a trace record"),
        "{e}"
    );
}

#[test]
fn a_divergence_at_the_last_sequence_number_is_found() {
    // A trace file is input: its seq may be any u64, u64::MAX included.
    let mk = |key: &str| TraceRecord {
        rank: 0,
        world_size: 2,
        seq: u64::MAX,
        key: key.into(),
        kind: "shape.frame_state".into(),
        config_digest: "0".into(),
        payload_digest: "1".into(),
        merged_digest: None,
        bytes_sent: 0,
        bytes_received: 0,
        duration_us: 0,
        fast_path: None,
        outcome: "ok".into(),
        error: None,
    };
    let traces = vec![(0, vec![mk("a")]), (1, vec![mk("b")])];
    let d = first_divergence(&traces).expect("the keys differ");
    assert_eq!(d.seq, u64::MAX);
    assert_eq!(d.groups.len(), 2);
    let traces = vec![(0, vec![mk("a")]), (1, vec![])];
    assert_eq!(first_divergence(&traces).map(|d| d.seq), Some(u64::MAX));
}

#[test]
fn a_last_line_cut_short_is_ignored_and_the_records_before_it_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = run(dir.path(), [&["a", "b"], &["a", "b"]]);
    let p = dir.path().join("rank-0.jsonl");
    let full = std::fs::read_to_string(&p).expect("read");
    // The disk filled up in the middle of the second record.
    let second = full.find('\n').expect("two lines") + 1;
    std::fs::write(&p, &full[..second + 40]).expect("write");
    let cut = read_trace(&p).expect("the whole first record is readable");
    assert_eq!(cut, traces[0].1[..1]);
    // A malformed line that does end with its newline is still an error.
    std::fs::write(&p, format!("{}{{\"seq\": 1}}\n", &full[..second])).expect("write");
    let e = read_trace(&p).expect_err("malformed").to_string();
    assert!(e.contains("line 2: not a trace record"), "{e}");
}

#[test]
fn the_tree_exchange_records_its_bytes_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let world = 5;
    let ranks = InProcessGroup::create(world).expect("group");
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            let dir = dir.path().to_owned();
            std::thread::spawn(move || {
                let r = t.rank();
                let opts = ChannelOptions::default()
                    .with_timeout(Duration::from_secs(5))
                    .with_hierarchical_from(2)
                    .with_trace_dir(&dir);
                let mut ch = Channel::with_options(Arc::new(t), opts).expect("channel");
                // Identical states (the tree's digest round), then rank-dependent ones.
                for size in [4, u64::from(r) + 4] {
                    let mut seen = FrameState::new();
                    seen.record("x", &Observation::tensor([size, 10]));
                    ch.exchange("k", &seen).expect("exchange");
                }
                ch.shutdown().expect("shutdown");
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank");
    }
    for r in 0..world {
        let t = read_trace(&dir.path().join(format!("rank-{r}.jsonl"))).expect("trace");
        assert_eq!(t.len(), 2, "rank {r}");
        assert_eq!(t[0].fast_path, Some(true));
        assert_eq!(t[1].fast_path, Some(false));
        for rec in &t {
            // Every rank of a tree receives from its parent or its children.
            assert!(rec.bytes_received > 0, "rank {r}: {rec:?}");
            assert!(rec.bytes_sent > 0, "rank {r}: {rec:?}");
        }
    }
}
