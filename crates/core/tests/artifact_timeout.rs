//! Without cache-hit agreement, a rank whose persistent artifact cache is
//! warm skips the backend compile — and the compile's own collective — while
//! a cold rank enters it: the cold rank gets a timeout naming the warm rank,
//! within the deadline plus 1 s (not a hang). A deadline bound, so this file
//! holds one test and runs alone.

use compiler_collectives_core::cache::{CacheOptions, CompileCache, Inputs};
use compiler_collectives_core::decisions::autotune::{autotune, Strategy};
use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_core::persistence::artifacts::{ArtifactOrigin, DiskArtifacts};
use compiler_collectives_core::{Channel, ChannelOptions, Error, InProcessGroup, Transport};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn without_agreement_the_cold_rank_times_out_naming_the_warm_rank() {
    let timeout = Duration::from_secs(1);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let x: Inputs = [("x".to_string(), Observation::tensor([8, 16]))].into();
    let mut options = CacheOptions::default();
    options.cache_hit_agreement = false;
    // Warm rank 0's disk with a run of one rank.
    {
        let mut alone = options.clone();
        alone.collectives = false;
        let mut c: CompileCache<String> = CompileCache::new("step", alone);
        let store = DiskArtifacts::open(dirs[0].path()).unwrap();
        c.call_persistent(&x, None, &store, |_, _| Ok("kernel".into()))
            .unwrap();
    }
    let handles: Vec<_> = InProcessGroup::create(2)
        .unwrap()
        .into_iter()
        .map(|t| {
            let dir = dirs[t.rank() as usize].path().to_owned();
            let (x, options) = (x.clone(), options.clone());
            std::thread::spawn(move || {
                let rank = t.rank();
                let mut ch = Channel::with_options(
                    Arc::new(t),
                    ChannelOptions::default().with_timeout(timeout),
                )
                .unwrap();
                let store = DiskArtifacts::open(dir).unwrap();
                let mut c: CompileCache<String> = CompileCache::new("step", options);
                let start = Instant::now();
                let r = c.call_persistent(&x, Some(&mut ch), &store, |_, ch| {
                    let ch = ch.expect("a channel");
                    autotune(ch, "step/autotune", &["a", "b"], Strategy::Sharded, |_| {
                        Ok(vec![Duration::from_micros(5)])
                    })?;
                    Ok("kernel".to_string())
                });
                let waited = start.elapsed();
                if rank == 0 {
                    // Alive, but at no exchange, until well past the cold rank's deadline.
                    std::thread::sleep(timeout * 2);
                    ch.shutdown().unwrap();
                }
                (r, waited)
            })
        })
        .collect();
    let out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let (warm, _) = &out[0];
    assert_eq!(
        warm.as_ref().map(|c| c.origin).ok(),
        Some(Some(ArtifactOrigin::Loaded))
    );
    let (cold, waited) = &out[1];
    match cold {
        Err(e @ Error::Timeout { missing_ranks, .. }) => {
            assert_eq!(missing_ranks, &[0], "{e}");
            assert!(e.to_string().contains("step/autotune"), "{e}");
        }
        other => panic!("expected a timeout naming rank 0, got {other:?}"),
    }
    assert!(
        *waited >= timeout && *waited < timeout + Duration::from_secs(1),
        "waited {waited:?}"
    );
}
