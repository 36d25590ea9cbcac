//! Profiles (persisted decisions): the file format's strict decoding, the
//! join, the store's save protocol (merge under a lock, stale temp files,
//! lock timeout), and the cache starting from a profile so that ranks with
//! different persisted states still end with the same one (docs/protocol.md).

use compiler_collectives_core::cache::{CacheOptions, CompileCache, Inputs, Outcome};
use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::persistence::profile::{
    exchange_profile, Profile, ProfileError, ProfileLimits, ProfileStore, LOCK_FILE,
    PROFILE_HEADER_LEN,
};
use compiler_collectives_core::{Channel, DecodeError, Join, Transport};
use proptest::prelude::*;
use std::time::{Duration, Instant};

mod each_rank;
use each_rank::on_threads;

fn state(source: &str, sizes: &[u64]) -> FrameState {
    let mut s = FrameState::new();
    s.record(source, &Observation::tensor(sizes.to_vec()));
    s
}

fn sample() -> Profile {
    let mut p = Profile::new();
    p.record_shapes("train_step@model.rs:88", &state("x", &[5, 10]));
    p.record_shapes("train_step@model.rs:88", &state("x", &[6, 10]));
    let mut n = FrameState::new();
    n.record("n", &Observation::Int(3));
    p.record_shapes("eval_step", &n);
    p
}

#[test]
fn encode_decode_round_trips_and_keeps_the_join() {
    let p = sample();
    let bytes = p.encode().expect("encodes");
    let back = Profile::decode(&bytes, &ProfileLimits::default()).expect("decodes");
    assert_eq!(back, p);
    assert_eq!(back.len(), 2);
    let x = back
        .shapes("train_step@model.rs:88")
        .expect("entry")
        .get("x");
    assert_eq!(x.size.to_string(), "(Dyn,10)");
    assert!(back.shapes("missing").is_none());
}

#[test]
fn every_truncation_and_every_bit_flip_is_a_typed_error() {
    let bytes = sample().encode().expect("encodes");
    let limits = ProfileLimits::default();
    for n in 0..bytes.len() {
        assert!(
            Profile::decode(&bytes[..n], &limits).is_err(),
            "prefix of {n} bytes decoded"
        );
    }
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(
                Profile::decode(&b, &limits).is_err(),
                "flip of bit {bit} of byte {i} decoded"
            );
        }
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(
        Profile::decode(&longer, &limits),
        Err(DecodeError::Trailing { extra: 1 })
    );
}

#[test]
fn wrong_magic_version_and_oversize_name_the_field() {
    let bytes = sample().encode().expect("encodes");
    let limits = ProfileLimits::default();
    let check = |b: &[u8], limits: &ProfileLimits, want: &str| {
        let e = Profile::decode(b, limits).expect_err("must fail");
        assert!(e.to_string().contains(want), "{e} lacks {want:?}");
    };
    let mut b = bytes.clone();
    b[0] = b'X';
    check(&b, &limits, "not a compiler-collectives profile");
    let mut b = bytes.clone();
    b[8] = 9;
    check(&b, &limits, "profile version 9");
    let small = ProfileLimits::default().with_max_body_bytes(4);
    check(&bytes, &small, "over the limit of 4 bytes");
    let one = ProfileLimits::default().with_max_entries(1);
    check(&bytes, &one, "2 entries, over the limit of 1");
    // A header announcing a 4 GiB body over a short file: truncated, no allocation.
    let mut b = bytes[..PROFILE_HEADER_LEN].to_vec();
    b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let huge = ProfileLimits::default().with_max_body_bytes(usize::MAX);
    assert!(matches!(
        Profile::decode(&b, &huge),
        Err(DecodeError::Truncated { .. })
    ));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Profile::decode(&bytes, &ProfileLimits::default());
        let mut with_header = sample().encode().expect("encodes")[..PROFILE_HEADER_LEN].to_vec();
        with_header.extend_from_slice(&bytes);
        let _ = Profile::decode(&with_header, &ProfileLimits::default());
    }

    #[test]
    fn profile_join_is_commutative_associative_idempotent(
        a in proptest::collection::vec((0u8..3, 1u64..4), 0..4),
        b in proptest::collection::vec((0u8..3, 1u64..4), 0..4),
        c in proptest::collection::vec((0u8..3, 1u64..4), 0..4),
    ) {
        let mk = |v: &[(u8, u64)]| {
            let mut p = Profile::new();
            for &(k, n) in v {
                p.record_shapes(&format!("k{k}"), &state("x", &[n, 10]));
            }
            p
        };
        let (a, b, c) = (mk(&a), mk(&b), mk(&c));
        let mut ab = a.clone(); ab.join(&b);
        let mut ba = b.clone(); ba.join(&a);
        prop_assert_eq!(&ab, &ba);
        let mut ab_c = ab.clone(); ab_c.join(&c);
        let mut bc = b.clone(); bc.join(&c);
        let mut a_bc = a.clone(); a_bc.join(&bc);
        prop_assert_eq!(&ab_c, &a_bc);
        let mut aa = a.clone(); aa.join(&a);
        prop_assert_eq!(&aa, &a);
    }
}

#[test]
fn saves_join_with_what_is_stored_and_leave_no_temp_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ProfileStore::open(dir.path().join("job")).expect("store");
    assert!(store.load().expect("empty").is_empty());
    store
        .save_shapes("f", &state("x", &[5, 10]))
        .expect("save 1");
    store
        .save_shapes("f", &state("x", &[6, 10]))
        .expect("save 2");
    store.save_shapes("g", &state("y", &[3])).expect("save 3");
    let p = store.load().expect("load");
    assert_eq!(p.len(), 2);
    assert_eq!(
        p.shapes("f").expect("f").get("x").size.to_string(),
        "(Dyn,10)"
    );
    assert_eq!(p.shapes("g").expect("g").get("y").size.to_string(), "(3,)");
    // A temp file a killed writer left behind is removed by the next save.
    let stale = store.dir().join(".profile.ccol.tmp-99999-0");
    std::fs::write(&stale, b"partial").expect("write");
    store.save(&Profile::new()).expect("save 4");
    assert!(!stale.exists(), "stale temp file survived a save");
    let mut names: Vec<String> = std::fs::read_dir(store.dir())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["profile.ccol", "profile.ccol.lock"]);
}

#[test]
fn a_held_lock_gives_a_typed_timeout_within_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ProfileStore::open(dir.path())
        .expect("store")
        .with_lock_timeout(Duration::from_millis(300));
    // flock locks belong to an open file: a second open in this process conflicts.
    let holder = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.path().join(LOCK_FILE))
        .expect("open lock");
    fs4::FileExt::try_lock(&holder).expect("lock");
    let start = Instant::now();
    let err = store.save(&sample()).expect_err("lock is held");
    let took = start.elapsed();
    assert!(
        matches!(err, ProfileError::LockTimeout { waited, .. } if waited >= Duration::from_millis(300)),
        "{err}"
    );
    assert!(took < Duration::from_millis(1300), "took {took:?}");
    assert!(err.to_string().contains("lock still held"), "{err}");
    fs4::FileExt::unlock(&holder).expect("unlock");
    store.save(&sample()).expect("saves once the lock is free");
    assert_eq!(store.load().expect("load"), sample());
}

#[test]
fn a_corrupt_file_is_reported_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ProfileStore::open(dir.path()).expect("store");
    std::fs::write(store.path(), b"not a profile at all, longer than a header").expect("write");
    let err = store.save(&sample()).expect_err("corrupt");
    assert!(matches!(err, ProfileError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("move it aside"), "{err}");
    assert_eq!(
        std::fs::read(store.path()).expect("read"),
        b"not a profile at all, longer than a header"
    );
}

#[test]
fn job_ids_must_be_plain_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["", ".", "..", "a/b", "x y", &"j".repeat(201)] {
        assert!(
            matches!(
                ProfileStore::for_job(dir.path(), bad),
                Err(ProfileError::InvalidArgument(_))
            ),
            "{bad:?} accepted"
        );
    }
    let store = ProfileStore::for_job(dir.path(), "run-42.a_b").expect("valid");
    assert_eq!(store.dir(), dir.path().join("run-42.a_b"));
}

fn inputs(sizes: &[u64]) -> Inputs {
    let mut i = Inputs::new();
    i.insert("x".into(), Observation::tensor(sizes.to_vec()));
    i
}

/// Runs one compile per rank, rank r starting from `persisted[r]`, and
/// returns each rank's resulting state and dynamic dims.
fn compile_once(persisted: Vec<FrameState>, seen: &[u64]) -> Vec<(FrameState, Vec<usize>)> {
    let world = u32::try_from(persisted.len()).expect("few ranks");
    let seen = seen.to_vec();
    on_threads(world, move |t| {
        let r = t.rank() as usize;
        let mut ch = Channel::new(std::sync::Arc::new(t)).expect("channel");
        let mut cache: CompileCache<()> =
            CompileCache::new("f", CacheOptions::default()).with_state(persisted[r].clone());
        let out = cache
            .call(&inputs(&[seen[r], 10]), Some(&mut ch), |_| ())
            .expect("call");
        assert_eq!(out, Outcome::Compiled(0));
        let dims = cache.frames()[0]
            .dynamic_dims
            .get("x")
            .cloned()
            .unwrap_or_default();
        (cache.state().clone(), dims)
    })
}

#[test]
fn ranks_with_different_persisted_states_end_with_the_same_one() {
    // Rank 0's host persisted x dim 0 dynamic; rank 1's host has no profile.
    // Both see (4,10) now: the persisted state travels in the exchange, so
    // both decide dim 0 dynamic and both hold (and would save) (Dyn,10).
    let persisted = vec![
        {
            let mut s = state("x", &[5, 10]);
            s.join(&state("x", &[6, 10]));
            s
        },
        FrameState::new(),
    ];
    let out = compile_once(persisted, &[4, 4]);
    for (s, dims) in &out {
        assert_eq!(s.get("x").size.to_string(), "(Dyn,10)");
        assert_eq!(dims, &vec![0]);
    }
    assert_eq!(out[0].0, out[1].0);
    // Without a profile, the same inputs compile static.
    let out = compile_once(vec![FrameState::new(), FrameState::new()], &[4, 4]);
    assert_eq!(out[0].0.get("x").size.to_string(), "(4,10)");
    assert!(out[0].1.is_empty());
}

#[test]
fn exchange_profile_gives_every_rank_every_key() {
    let results: Vec<Profile> = on_threads(3, |t| {
        let r = t.rank();
        let mut ch = Channel::new(std::sync::Arc::new(t)).expect("channel");
        let mut mine = Profile::new();
        mine.record_shapes(&format!("only-rank-{r}"), &state("x", &[u64::from(r) + 2]));
        mine.record_shapes("shared", &state("x", &[u64::from(r) + 2]));
        exchange_profile(&mut ch, &mine).expect("exchange")
    });
    for p in &results {
        assert_eq!(p, &results[0]);
        assert_eq!(p.len(), 4);
        assert_eq!(
            p.shapes("shared")
                .expect("shared")
                .get("x")
                .size
                .to_string(),
            "(Dyn,)"
        );
        assert_eq!(
            p.shapes("only-rank-2")
                .expect("rank 2's")
                .get("x")
                .size
                .to_string(),
            "(4,)"
        );
    }
}

#[test]
fn diff_names_what_differs() {
    let a = sample();
    let mut b = sample();
    b.record_shapes("eval_step", &{
        let mut n = FrameState::new();
        n.record("n", &Observation::Int(4));
        n
    });
    b.record_shapes("new", &state("z", &[1]));
    assert!(a.diff(&a).is_empty());
    let d = b.diff(&a);
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(
        d[0].starts_with("~ 'eval_step' (shape.frame_state) source 'n'"),
        "{d:?}"
    );
    assert_eq!(d[1], "- 'new' (shape.frame_state): only in A");
}

#[test]
fn a_save_over_the_limits_is_refused_and_leaves_a_readable_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = ProfileStore::open(tmp.path())
        .expect("store")
        .with_limits(ProfileLimits::default().with_max_entries(2));
    store.save_shapes("a", &state("x", &[2, 3])).expect("save");
    store.save_shapes("b", &state("x", &[2, 3])).expect("save");
    let err = store
        .save_shapes("c", &state("x", &[2, 3]))
        .expect_err("a third entry is over the limit");
    assert!(matches!(err, ProfileError::InvalidArgument(_)), "{err}");
    // What is stored still loads: the two entries saved before.
    assert_eq!(store.load().expect("loads").len(), 2);
    let mut three = store.load().expect("loads");
    three.record_shapes("c", &state("x", &[2, 3]));
    assert!(store.replace(&three).is_err());
    assert_eq!(store.load().expect("loads").len(), 2);
}
