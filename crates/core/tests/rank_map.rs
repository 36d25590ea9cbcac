//! A channel among some of a job's ranks (`ChannelOptions::rank_map`)
//! names ranks by their job rank in every error it returns, from fields
//! mapped before the text is formatted.

use compiler_collectives_core::decisions::agree::must_agree;
use compiler_collectives_core::decisions::votes::AnyVote;
use compiler_collectives_core::{
    Channel, ChannelOptions, DecodeError, Error, InProcessGroup, PeerLoss, RankGroup, RankMap,
};
use std::sync::Arc;
use std::time::Duration;

/// Channels over one in-process group of `global.len()` ranks, whose rank
/// `r` is job rank `global[r]`, with a short deadline.
fn channels(global: &[u32], timeout: Duration) -> Vec<Channel> {
    let map = RankMap::new(global.to_vec()).unwrap();
    InProcessGroup::create(u32::try_from(global.len()).unwrap())
        .unwrap()
        .into_iter()
        .map(|t| {
            let options = ChannelOptions::default()
                .with_timeout(timeout)
                .with_rank_map(map.clone());
            Channel::with_options(Arc::new(t), options).unwrap()
        })
        .collect()
}

/// One exchange on each channel, each in its thread; every one must fail:
/// their errors, in channel order.
fn exchange_on_each(chans: Vec<Channel>) -> Vec<Error> {
    let waiting: Vec<_> = chans
        .into_iter()
        .map(|mut c| std::thread::spawn(move || c.exchange("step", &AnyVote(false)).map(|_| ())))
        .collect();
    waiting
        .into_iter()
        .map(|h| h.join().unwrap().unwrap_err())
        .collect()
}

#[test]
fn a_rank_map_lists_job_ranks_strictly_ascending() {
    assert_eq!(RankMap::new(vec![2, 5, 9]).unwrap().ranks(), &[2, 5, 9]);
    assert_eq!(RankMap::new(vec![2, 5, 9]).unwrap().global(1), 5);
    for bad in [vec![], vec![3, 3], vec![4, 1]] {
        let err = RankMap::new(bad.clone()).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("rank map")),
            "{bad:?}: {err}"
        );
    }
    // One job rank per member: a map of another size is refused.
    let t = InProcessGroup::create(2).unwrap().pop().unwrap();
    let options = ChannelOptions::default().with_rank_map(RankMap::new(vec![1, 4, 6]).unwrap());
    let err = Channel::with_options(Arc::new(t), options).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("3 job ranks") && m.contains("channel of 2")),
        "{err}"
    );
}

#[test]
fn a_timeout_and_a_departure_name_job_ranks() {
    // Job ranks 2, 5 and 9; the member that is job rank 9 never comes.
    let mut chans = channels(&[2, 5, 9], Duration::from_millis(300));
    let absent = chans.pop().unwrap();
    for err in exchange_on_each(chans) {
        match &err {
            Error::Timeout { missing_ranks, .. } => assert_eq!(missing_ranks, &[9], "{err}"),
            other => panic!("expected a timeout, got {other}"),
        }
        assert!(err.to_string().contains("waiting for rank [9]"), "{err}");
    }
    drop(absent);

    // Job rank 5 shuts its channel down: the others lose job rank 5.
    let mut chans = channels(&[2, 5, 9], Duration::from_secs(10));
    let mut leaving = chans.remove(1);
    leaving.shutdown().unwrap();
    for err in exchange_on_each(chans) {
        match &err {
            Error::PeerLost { ranks, left, .. } => {
                assert_eq!(ranks, &[5], "{err}");
                assert_eq!(left, &[(5, PeerLoss::Shutdown)], "{err}");
            }
            other => panic!("expected a lost rank, got {other}"),
        }
    }
}

#[test]
fn a_disagreement_names_job_ranks_and_so_does_the_channel_after_it() {
    let chans = channels(&[3, 7], Duration::from_secs(10));
    let results: Vec<_> = chans
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            std::thread::spawn(move || {
                let first = must_agree(
                    &mut c,
                    "enable",
                    "torch",
                    if i == 0 { "2.13" } else { "2.15" },
                )
                .unwrap_err();
                let later = c.exchange("next", &AnyVote(false)).map(|_| ()).unwrap_err();
                (first, later)
            })
        })
        .collect();
    for h in results {
        let (first, later) = h.join().unwrap();
        match &first {
            Error::Disagreement { groups, .. } => {
                let ranks: Vec<&[u32]> = groups.iter().map(|g| g.ranks.as_slice()).collect();
                assert_eq!(ranks, [&[3][..], &[7][..]], "{first}");
            }
            other => panic!("expected a disagreement, got {other}"),
        }
        // The poisoned channel's later error carries the first one's text,
        // in job ranks.
        let text = later.to_string();
        assert!(
            text.contains("rank [3]") && text.contains("rank [7]"),
            "{text}"
        );
    }
}

#[test]
fn mapping_keeps_kinds_and_maps_every_rank_field() {
    let map = RankMap::new(vec![10, 20, 30]).unwrap();
    let desync = Error::Desync {
        groups: vec![
            RankGroup {
                ranks: vec![0, 2],
                what: "#1 'a'".into(),
            },
            RankGroup {
                ranks: vec![1],
                what: "#1 'b'".into(),
            },
        ],
    }
    .in_global_ranks(&map);
    assert_eq!(
        desync.to_string(),
        "desync: ranks [10,30] at #1 'a'; rank [20] at #1 'b'; the channel is unusable: abort it"
    );
    let decode = Error::message_too_large(2, 9, 8).in_global_ranks(&map);
    assert!(
        matches!(
            decode,
            Error::Decode {
                rank: Some(30),
                reason: DecodeError::TooLarge { .. }
            }
        ),
        "{decode}"
    );
    let other = Error::InvalidArgument("rank 1".into()).in_global_ranks(&map);
    assert_eq!(
        other.to_string(),
        "invalid argument: rank 1",
        "no text is rewritten"
    );
}
