//! Writes seed inputs for the fuzz targets into `DIR/<target>/` (default
//! `fuzz/corpus`): valid envelopes, digest messages and payloads of every
//! kind, and the scenario corpus. The fuzzer mutates from there.

use compiler_collectives_core::decisions::agree::AgreedValues;
use compiler_collectives_core::decisions::autotune::{Measure, Timings};
use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::decisions::votes::{AllVote, AnyVote, Max, Min};
use compiler_collectives_core::persistence::profile::Profile;
use compiler_collectives_core::protocol::encode_payload;
use compiler_collectives_core::protocol::envelope::{self, Envelope, Limits, WIRE_VERSION};
use compiler_collectives_core::Join;
use std::path::{Path, PathBuf};

fn write(dir: &Path, target: &str, name: &str, data: &[u8]) -> std::io::Result<()> {
    let d = dir.join(target);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join(format!("seed-{name}")), data)
}

fn frames() -> Vec<FrameState> {
    let mut a = FrameState::new();
    a.record("x", &Observation::tensor([8, 10]));
    a.record("n", &Observation::Int(3));
    let mut b = FrameState::new();
    b.record("x", &Observation::strided([8, 10, 3], [30, 1, 10]));
    b.record("y", &Observation::tensor([0, 1]));
    let mut c = a.clone();
    c.join(&b);
    vec![FrameState::new(), a, b, c]
}

fn envelope_of<J: Join>(v: &J, seq: u64, key: &str) -> anyhow::Result<Vec<u8>> {
    let env = Envelope {
        version: WIRE_VERSION,
        seq,
        kind: J::KIND.into(),
        key: key.into(),
        config: "overrides={}".into(),
        payload: encode_payload(v)?,
    };
    Ok(env.encode(&Limits::default())?)
}

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("fuzz/corpus"), PathBuf::from);
    let mut envs = Vec::new();
    for (i, f) in frames().iter().enumerate() {
        envs.push(envelope_of(f, i as u64, "train_step@model.rs:88")?);
        let p = encode_payload(f)?;
        let mut pair = vec![0u8, u8::try_from(p.len()).unwrap_or(255)];
        pair.extend_from_slice(&p);
        pair.extend_from_slice(&encode_payload(&frames()[(i + 1) % 4])?);
        write(&dir, "payload", &format!("frame-{i}"), &pair)?;
    }
    envs.push(envelope_of(&AnyVote(true), 7, "f")?);
    envs.push(envelope_of(&Max(-5), 1 << 40, "")?);
    for (k, bytes) in [
        (1u8, encode_payload(&AnyVote(true))?),
        (2, encode_payload(&AllVote(false))?),
        (3, encode_payload(&Max(i64::MIN))?),
        (4, encode_payload(&Min(300))?),
    ] {
        let mut pair = vec![k, u8::try_from(bytes.len()).unwrap_or(255)];
        pair.extend_from_slice(&bytes);
        pair.extend_from_slice(&bytes);
        write(&dir, "payload", &format!("vote-{k}"), &pair)?;
    }
    let mut timings = Timings::default();
    let op = timings.0.entry("mm[64x64]".to_owned()).or_default();
    op.insert("c0".to_owned(), Measure::Nanos(1200));
    op.insert("c1".to_owned(), Measure::Failed("out of memory".to_owned()));
    let mut agreed = AgreedValues::default();
    agreed
        .0
        .entry("compiler".to_owned())
        .or_default()
        .insert("2.13.0".to_owned());
    let mut profiles = vec![Profile::new()];
    for (i, f) in frames().iter().enumerate() {
        let mut p = profiles[i].clone();
        p.record_shapes(&format!("scenario:{i}"), f);
        profiles.push(p);
    }
    for (i, p) in profiles.iter().enumerate() {
        let file = p.encode()?;
        // Even first byte: the whole file; odd: the body only (see the check).
        write(
            &dir,
            "profile",
            &format!("file-{i}"),
            &[&[0u8][..], &file].concat(),
        )?;
        write(
            &dir,
            "profile",
            &format!("body-{i}"),
            &[&[1u8][..], &file[32..]].concat(),
        )?;
    }
    for (k, bytes) in [
        (5u8, encode_payload(&timings)?),
        (6, encode_payload(&agreed)?),
        (7, encode_payload(&profiles[profiles.len() - 1])?),
    ] {
        let mut pair = vec![k, u8::try_from(bytes.len()).unwrap_or(255)];
        pair.extend_from_slice(&bytes);
        pair.extend_from_slice(&bytes);
        write(&dir, "payload", &format!("kind-{k}"), &pair)?;
    }
    for (i, e) in envs.iter().enumerate() {
        write(&dir, "envelope", &i.to_string(), e)?;
        let d = envelope::encode_digest_msg(WIRE_VERSION, i as u64, &envelope::digest(e));
        write(&dir, "digest_msg", &i.to_string(), &d)?;
    }
    // Slots: an envelope inline, one that goes in the second round, and
    // the first bytes of another version.
    for (i, e) in envs.iter().enumerate() {
        let len = u32::try_from(e.len())?;
        let mut slot = vec![0u8; 128 + e.len()];
        let limit = Limits::default().max_message_bytes as u64;
        envelope::write_slot_header(&mut slot, i as u64, &envelope::digest(e), len, true, limit);
        slot[envelope::SLOT_HEADER_LEN..][..e.len()].copy_from_slice(e);
        write(&dir, "slot", &format!("inline-{i}"), &slot)?;
        let mut spilled = vec![0u8; 64];
        envelope::write_slot_header(
            &mut spilled,
            i as u64,
            &envelope::digest(e),
            len,
            false,
            4096,
        );
        write(&dir, "slot", &format!("spilled-{i}"), &spilled)?;
    }
    let mut other = vec![0u8; 64];
    other[..4].copy_from_slice(&envelope::MAGIC);
    other[4..6].copy_from_slice(&99u16.to_le_bytes());
    write(&dir, "slot", "v99", &other)?;
    write(
        &dir,
        "digest_msg",
        "v99",
        &envelope::encode_digest_msg(99, 0, &[0; 16]),
    )?;
    let scenarios = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    for entry in std::fs::read_dir(&scenarios)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            write(&dir, "scenario", &name, &std::fs::read(&path)?)?;
        }
    }
    Ok(())
}
