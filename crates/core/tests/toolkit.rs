//! The backend toolkit: the variable-length all_gather over a fixed-size
//! one applies the smallest limit of all ranks to every length (so every
//! rank takes the same branch), and the argument checks.

use compiler_collectives_core::transport::toolkit::{all_gather_varlen, check_peer, check_root};
use compiler_collectives_core::{Deadline, DecodeError, Error};
use std::time::Duration;

/// This rank is rank 0 of `rows.len()` ranks, sending `rows[0].0` bytes with
/// limit `rows[0].1`; the "engine" answers the lengths round with `rows`
/// and the padded round with each rank's bytes (value = rank). `want` is
/// the first rank over the smallest limit with its length and that limit.
fn check(rows: &[(u64, u64)], want: Option<(u32, u64, u64)>) {
    let (len, max) = rows[0];
    let data = vec![0u8; usize::try_from(len).unwrap()];
    let mut round = 0;
    let got = all_gather_varlen(
        &data,
        usize::try_from(max).unwrap(),
        Deadline::after(Duration::from_secs(1)),
        |bytes, _| {
            round += 1;
            if round == 1 {
                assert_eq!(bytes.len(), 16);
                Ok(rows
                    .iter()
                    .flat_map(|&(l, m)| [l.to_le_bytes(), m.to_le_bytes()].concat())
                    .collect())
            } else {
                let n = bytes.len();
                Ok((0..rows.len())
                    .flat_map(|r| vec![u8::try_from(r).unwrap(); n])
                    .collect())
            }
        },
    );
    match (got, want) {
        (Ok(bufs), None) => {
            for (r, (b, &(l, _))) in bufs.iter().zip(rows).enumerate() {
                assert_eq!(b.len(), usize::try_from(l).unwrap(), "{rows:?}");
                assert!(b.iter().all(|&x| usize::from(x) == r), "{rows:?}");
            }
        }
        (
            Err(Error::Decode {
                rank: Some(r),
                reason: DecodeError::TooLarge { len, limit, .. },
            }),
            Some(w),
        ) => assert_eq!((r, len, limit), w, "{rows:?}"),
        (other, want) => panic!("{rows:?}: got {other:?}, want {want:?}"),
    }
}

#[test]
fn the_smallest_limit_of_all_ranks_applies_to_every_length() {
    check(&[(8, 32), (8, 32)], None);
    check(&[(32, 32), (0, 32)], None);
    check(&[(0, 16), (0, 16), (0, 16)], None);
    // The last rank sends 64 where the others accept 32 (its own limit is 64).
    check(&[(8, 32), (8, 32), (64, 64)], Some((2, 64, 32)));
    // Seen from the big sender itself: the same error, naming itself.
    check(&[(64, 64), (8, 32)], Some((0, 64, 32)));
    check(&[(40, 64), (50, 32)], Some((0, 40, 32)));
}

#[test]
fn over_its_own_limit_and_a_broken_engine_are_typed_errors() {
    let d = Deadline::after(Duration::from_secs(1));
    let e = all_gather_varlen(&[0; 9], 8, d, |_, _| Ok(Vec::new())).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let e = all_gather_varlen(&[0; 4], 8, d, |_, _| Ok(vec![0; 15])).unwrap_err();
    assert!(matches!(e, Error::Decode { rank: None, .. }), "{e:?}");
}

#[test]
fn peers_and_roots_are_checked_alike_everywhere() {
    assert!(check_peer(1, 0, 2).is_ok());
    let self_send = check_peer(0, 0, 2).unwrap_err().to_string();
    assert!(
        self_send.contains("peer 0 is not another rank of a group of 2 (this is rank 0)"),
        "{self_send}"
    );
    assert!(matches!(
        check_peer(2, 0, 2),
        Err(Error::InvalidArgument(_))
    ));
    assert!(check_root(1, 2).is_ok());
    let root = check_root(2, 2).unwrap_err().to_string();
    assert!(
        root.contains("broadcast root 2 is not a rank of a group of 2"),
        "{root}"
    );
}
