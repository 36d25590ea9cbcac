//! `ErrorKind`: one kind per `Error` variant, with the stable names that
//! logs, the CLI, the conformance table and the Python package print; the
//! poison a channel or transport keeps after its first failure.

use compiler_collectives_core::{
    DecodeError, Error, ErrorKind, FirstFailure, PeerLoss, Poison, RankGroup,
};
use std::collections::BTreeSet;
use std::time::Duration;

fn one_of_each() -> Vec<Error> {
    let groups = vec![RankGroup {
        ranks: vec![0],
        what: "x".into(),
    }];
    vec![
        Error::timeout(vec![1], vec![], Duration::from_millis(5)),
        Error::peer_lost(vec![(1, PeerLoss::Aborted)], ""),
        Error::Desync {
            groups: groups.clone(),
        },
        Error::VersionMismatch {
            groups: groups.clone(),
        },
        Error::Disagreement {
            what: "config".into(),
            groups,
        },
        Error::Decode {
            rank: Some(1),
            reason: DecodeError::FixedSize {
                len: 3,
                expected: 4,
            },
        },
        Error::backend("gloo", std::io::Error::other("engine")),
        Error::InvalidArgument("x".into()),
        Error::Unsupported("x".into()),
        Error::unusable(FirstFailure::Shutdown, "rank 0 shut its transport down"),
    ]
}

#[test]
fn every_variant_has_its_kind_with_todays_name() {
    let kinds: Vec<ErrorKind> = one_of_each().iter().map(Error::kind).collect();
    assert_eq!(kinds, ErrorKind::ALL);
    let names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "timeout",
            "peer_lost",
            "desync",
            "version_mismatch",
            "disagreement",
            "decode",
            "backend",
            "invalid_argument",
            "unsupported",
            "channel_unusable",
        ]
    );
    assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), names.len());
    for k in ErrorKind::ALL {
        assert_eq!(k.to_string(), k.as_str());
    }
}

#[test]
fn a_poison_keeps_the_first_failure_and_every_later_call_says_it() {
    let first = Error::timeout(vec![2], vec![], Duration::from_millis(1500));
    let poison = Poison::of(&first);
    assert_eq!(poison.first, FirstFailure::Error(ErrorKind::Timeout));
    assert_eq!(poison.cause, first.to_string());
    let later = poison.error();
    assert_eq!(later.kind(), ErrorKind::ChannelUnusable);
    assert_eq!(
        later.to_string(),
        format!(
            "the channel is unusable after timeout ({first}); abort it and rebuild the process group"
        )
    );
    match Error::unusable_after(&first) {
        Error::ChannelUnusable { first: f, cause } => {
            assert_eq!((f, cause), (poison.first, poison.cause.clone()));
        }
        other => panic!("{other:?}"),
    }
    for (first, name) in [
        (FirstFailure::Shutdown, "shutdown"),
        (FirstFailure::Abort, "abort"),
        (FirstFailure::Error(ErrorKind::Backend), "backend"),
    ] {
        assert_eq!(first.as_str(), name);
        let e = Poison::new(first, "why").error();
        assert_eq!(
            e.to_string(),
            format!("the channel is unusable after {name} (why); abort it and rebuild the process group")
        );
    }
}

#[test]
fn the_fixed_size_mismatch_is_a_variant_of_its_own_with_todays_text() {
    let e = Error::Decode {
        rank: Some(3),
        reason: DecodeError::FixedSize {
            len: 1,
            expected: 4,
        },
    };
    assert_eq!(
        e.to_string(),
        "cannot decode the message from rank 3: invalid fixed-size contribution: 1 byte, \
         expected 4; the channel is unusable: abort it"
    );
}

#[test]
fn departures_have_stable_names() {
    let names: Vec<&str> = [
        PeerLoss::Shutdown,
        PeerLoss::Disconnected,
        PeerLoss::Aborted,
    ]
    .iter()
    .map(|p| p.as_str())
    .collect();
    assert_eq!(names, ["shutdown", "disconnected", "aborted"]);
}

/// A file of the repository, read from the workspace root.
fn repo_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every kind is where a reader or a program looks a kind up, so that a new
/// kind cannot be forgotten there (the Python package would make it its base
/// `Error`; the scenario schema would refuse a report carrying it): the
/// kinds' table of docs/failures.md, the scenario report schema's enum (the
/// harness adds `panic` and `profile` of its own, and nothing else), and
/// the Python package's class table.
#[test]
fn every_kind_is_in_the_docs_the_report_schema_and_the_python_package() {
    let names: BTreeSet<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
    let failures = repo_file("docs/failures.md");
    for name in &names {
        assert!(
            failures.contains(&format!("| `{name}` |")),
            "docs/failures.md has no row for `{name}`"
        );
    }
    let schema: serde_json::Value =
        serde_json::from_str(&repo_file("tests/scenarios/scenario.schema.json")).unwrap();
    let mut found = Vec::new();
    fn enums_of_kind(v: &serde_json::Value, out: &mut Vec<BTreeSet<String>>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(e) = m.get("kind").and_then(|k| k.get("enum")) {
                    let set = e.as_array().unwrap().iter();
                    out.push(set.map(|s| s.as_str().unwrap().to_owned()).collect());
                }
                m.values().for_each(|c| enums_of_kind(c, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|c| enums_of_kind(c, out)),
            _ => {}
        }
    }
    enums_of_kind(&schema, &mut found);
    let mut want: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    want.extend(["panic".to_owned(), "profile".to_owned()]);
    assert_eq!(found, vec![want], "the schema's error.kind enum");
    let python = repo_file("crates/python/python/compiler_collectives/_errors.py");
    for name in &names {
        assert!(
            python.contains(&format!("kind = \"{name}\"")),
            "the Python package has no class of kind {name:?}"
        );
    }
}
