//! Profiles: decisions persisted across runs of a job (profile-guided
//! optimisation, PGO).
//!
//! A [`Profile`] maps a compile key and a decision kind to the joined state
//! of that decision — today the [`FrameState`] of automatic-dynamic shapes.
//! A restarted job loads it before its first compile, so a dimension that
//! became dynamic in an earlier run is dynamic from step 0 instead of costing
//! a static compile and a recompile. This is the role of PyTorch's
//! `torch._dynamo.pgo` (per code object, the source → `FrameStateSizeEntry`
//! map of automatic dynamic, stored per job id); the file format, locking and
//! cross-rank rule here are this project's own.
//!
//! # How ranks keep identical profiles (docs/protocol.md)
//! In a frame compile every rank contributes (persisted state ⊔ its
//! observation) to the one exchange ([`crate::cache::CompileCache`] does it),
//! so every rank ends the compile holding the same join and saves the same
//! entry. **Every rank saves** (no rank is special): saving joins what is on
//! disk with what is saved, under a file lock, so N ranks saving identical
//! content leave exactly that content, and ranks on other hosts with their
//! own directories each get it. [`exchange_profile`] joins whole profiles
//! over a channel, for keys only some ranks compiled.
//!
//! # Files
//! A [`ProfileStore`] is one directory per job id holding:
//! - `profile.ccol` — the profile ([`Profile::encode`]): a 32-byte header
//!   then a postcard body, written only by rename;
//! - `profile.ccol.lock` — the lock file (never deleted: deleting a lock
//!   file lets two writers lock different files);
//! - `.profile.ccol.tmp-<pid>-<n>` — a save in progress. A writer killed
//!   mid-save leaves its temp file behind; the next save removes every such
//!   file while it holds the lock (a live writer only has one while holding
//!   the lock, so whatever is there belongs to a dead one). Readers never
//!   look at temp files.
//!
//! Saving is: take the lock (waiting at most [`ProfileStore::lock_timeout`],
//! else [`ProfileError::LockTimeout`]) → read the current file → join →
//! write a temp file in the same directory → fsync it → rename it over
//! `profile.ccol` → fsync the directory → unlock. So concurrent writers
//! never lose an entry, and a writer killed at any instant leaves either the
//! old or the new file, never a partial one.
//!
//! ```text
//! profile.ccol, little-endian:
//!   0  magic     8 bytes  "CCOLPGO\0"
//!   8  version   u16      PROFILE_VERSION
//!  10  flags     u16      0
//!  12  body len  u32      bytes after the header
//!  16  checksum  16 bytes XXH3-128 of the body
//!  32  body      postcard of the entries, canonical (re-encoding gives the same bytes)
//! ```
//!
//! # Code layout
//! This file holds the [`Profile`] and its join; the file format
//! ([`Profile::encode`], [`Profile::decode`], [`ProfileLimits`]) is in
//! `profile/format.rs`, the views `ccol profile show|diff` print
//! ([`Profile::to_json`], [`Profile::diff`]) in `profile/view.rs`, and the
//! files, the lock and the save protocol ([`ProfileStore`], [`read_profile`],
//! [`write_profile_atomic`], [`ProfileError`]) in `profile/store.rs`.

use crate::decisions::join_map;
use crate::decisions::shapes::FrameState;
use crate::error::Error;
use crate::protocol::join::Join;
use crate::protocol::Channel;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod format;
mod store;
mod view;

pub use format::{ProfileLimits, PROFILE_HEADER_LEN, PROFILE_MAGIC, PROFILE_VERSION};
pub use store::{
    read_profile, write_profile_atomic, ProfileError, ProfileStore, DEFAULT_LOCK_TIMEOUT,
    JOB_ID_ENV, LOCK_FILE, PROFILE_DIR_ENV, PROFILE_FILE, TORCHELASTIC_RUN_ID_ENV,
};
pub use view::persisted_decision;

/// Where an entry of a profile belongs: a compile key and a decision kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProfileKey {
    /// The compile key (canonical, equal on every rank), e.g. `"train_step@model.rs:88"`.
    pub key: String,
    /// The decision kind ([`Join::KIND`]), e.g. `"shape.frame_state"`.
    pub kind: String,
}

/// A persisted decision. One variant per decision kind; new kinds are new
/// variants (the postcard tag of existing ones does not change).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ProfileValue {
    /// Automatic-dynamic shapes of one frame ([`FrameState::KIND`]).
    Shapes(FrameState),
}

impl ProfileValue {
    /// The decision kind of this value.
    pub fn kind(&self) -> &'static str {
        match self {
            ProfileValue::Shapes(_) => FrameState::KIND,
        }
    }

    fn join(&mut self, other: &Self) {
        match (self, other) {
            (ProfileValue::Shapes(a), ProfileValue::Shapes(b)) => a.join(b),
        }
    }
}

/// Persisted decisions: (compile key, kind) → joined state.
///
/// Its serde form is the postcard body of the file (keys are structs, so
/// not JSON: use [`Profile::to_json`]).
///
/// Join: per entry, missing = ⊥ (a [`Join`], kind `"profile"`), so profiles
/// from several ranks or runs merge order-independently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    entries: BTreeMap<ProfileKey, ProfileValue>,
}

impl Join for Profile {
    const KIND: &'static str = "profile";
    fn join(&mut self, other: &Self) {
        join_map(&mut self.entries, &other.entries, ProfileValue::join);
    }
}

impl Profile {
    /// An empty profile.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins `state` into the shapes entry of compile key `key`.
    pub fn record_shapes(&mut self, key: &str, state: &FrameState) {
        let k = ProfileKey {
            key: key.to_owned(),
            kind: FrameState::KIND.to_owned(),
        };
        match self.entries.get_mut(&k) {
            Some(ProfileValue::Shapes(s)) => s.join(state),
            None => {
                self.entries.insert(k, ProfileValue::Shapes(state.clone()));
            }
        }
    }

    /// The shapes state persisted for compile key `key`, if any.
    pub fn shapes(&self, key: &str) -> Option<&FrameState> {
        let k = ProfileKey {
            key: key.to_owned(),
            kind: FrameState::KIND.to_owned(),
        };
        match self.entries.get(&k) {
            Some(ProfileValue::Shapes(s)) => Some(s),
            None => None,
        }
    }

    /// Every entry, in (key, kind) order.
    pub fn entries(&self) -> impl Iterator<Item = (&ProfileKey, &ProfileValue)> {
        self.entries.iter()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Joins `local` with every rank's profile over `channel` (one exchange
/// under compile key `"ccol.profile"`), so every rank can save the same
/// profile even for keys only some ranks compiled.
///
/// Cost: one exchange (the digest fast path when every rank already holds
/// the same profile).
///
/// # Errors
/// The channel's errors ([`Error::Timeout`], [`Error::Desync`], …).
pub fn exchange_profile(channel: &mut Channel, local: &Profile) -> Result<Profile, Error> {
    Ok(channel.exchange("ccol.profile", local)?.into_merged())
}
