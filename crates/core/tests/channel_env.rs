//! A channel reads no environment variable; `ChannelOptions::from_env` is
//! the one place `CCOL_TIMEOUT_S`, `CCOL_TRACE_DIR` and
//! `CCOL_HIERARCHICAL_FROM` are read. One test:
//! it sets process-wide variables.

use compiler_collectives_core::{Channel, ChannelOptions, Error, InProcessGroup};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn only_from_env_reads_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("CCOL_TIMEOUT_S", "7.5");
    std::env::set_var("CCOL_TRACE_DIR", dir.path());
    let t = InProcessGroup::create(1).unwrap().pop().unwrap();
    let plain = Channel::new(std::sync::Arc::new(t)).unwrap();
    assert_eq!(plain.timeout(), Duration::from_secs(300));
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "no trace file"
    );

    let opts = ChannelOptions::from_env().unwrap();
    assert_eq!(opts.timeout, Some(Duration::from_millis(7500)));
    assert_eq!(opts.trace_dir.as_deref(), Some(dir.path()));
    let t = InProcessGroup::create(1).unwrap().pop().unwrap();
    let from_env =
        Channel::with_options(Arc::new(t), opts.with_timeout(Duration::from_secs(2))).unwrap();
    assert_eq!(
        from_env.timeout(),
        Duration::from_secs(2),
        "later with_… wins"
    );
    assert!(dir.path().join("rank-0.jsonl").exists());

    std::env::set_var("CCOL_TIMEOUT_S", "abc");
    let err = ChannelOptions::from_env().unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("CCOL_TIMEOUT_S") && m.contains("abc")),
        "{err}"
    );
    let t = InProcessGroup::create(1).unwrap().pop().unwrap();
    assert!(
        Channel::new(std::sync::Arc::new(t)).is_ok(),
        "a channel ignores the bad variable"
    );
    std::env::set_var("CCOL_TIMEOUT_S", "");
    // The tree's threshold: a world size from 2, else a typed error naming it.
    std::env::set_var("CCOL_HIERARCHICAL_FROM", " 8 ");
    assert_eq!(ChannelOptions::from_env().unwrap().hierarchical_from, 8);
    for bad in ["1", "x", "-3", "4294967296"] {
        std::env::set_var("CCOL_HIERARCHICAL_FROM", bad);
        let err = ChannelOptions::from_env().unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("CCOL_HIERARCHICAL_FROM") && m.contains(bad)),
            "{err}"
        );
    }
    // Empty counts as unset, for all three.
    std::env::set_var("CCOL_TRACE_DIR", "");
    std::env::set_var("CCOL_HIERARCHICAL_FROM", "");
    let empty = ChannelOptions::from_env().unwrap();
    assert_eq!((empty.timeout, empty.trace_dir), (None, None));
    assert_eq!(
        empty.hierarchical_from,
        ChannelOptions::default().hierarchical_from
    );
    std::env::remove_var("CCOL_TIMEOUT_S");
    std::env::remove_var("CCOL_TRACE_DIR");
    std::env::remove_var("CCOL_HIERARCHICAL_FROM");
}
