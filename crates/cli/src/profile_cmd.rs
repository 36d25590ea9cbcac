//! `ccol profile show|merge|diff`: profiles (persisted decisions) for people
//! reading them, and the hidden `ccol profile-writer` the crash-safety tests
//! run as concurrent and killed writers.
//!
//! Exit codes: 0 success (and, for `diff`, equal profiles); 1 `diff` found
//! differences; 2 a file that cannot be read or decoded, or bad arguments.

use clap::{Args, Subcommand};
use compiler_collectives::decisions::lattice::SizeEntry;
use compiler_collectives::decisions::shapes::{FrameState, Observation};
use compiler_collectives::persistence::profile::{
    persisted_decision, read_profile, write_profile_atomic, Profile, ProfileLimits, ProfileStore,
    ProfileValue, PROFILE_FILE,
};
use compiler_collectives::Join as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code of an unreadable file or bad arguments.
const EXIT_BAD_INPUT: u8 = 2;

#[derive(Subcommand, Debug)]
pub(crate) enum ProfileCmd {
    /// Print a profile as a table (or JSON): key, kind, sources, sizes, decisions.
    Show(ShowArgs),
    /// Join profiles into one file (written atomically).
    Merge(MergeArgs),
    /// Print what differs between two profiles; exit 1 when they differ.
    Diff(DiffArgs),
}

#[derive(Args, Debug)]
pub(crate) struct ShowArgs {
    /// A profile file, or a profile directory (its `profile.ccol`).
    path: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct MergeArgs {
    /// Profiles (files or directories) to join; at least two.
    #[arg(required = true, num_args = 2..)]
    inputs: Vec<PathBuf>,
    /// Output file (replaced atomically), or a directory (its `profile.ccol`,
    /// replaced under the store's lock, as is any file named `profile.ccol`).
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct DiffArgs {
    /// Profile A (file or directory).
    a: PathBuf,
    /// Profile B (file or directory).
    b: PathBuf,
}

/// A profile path as given: a directory means its `profile.ccol`.
fn file_of(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(PROFILE_FILE)
    } else {
        path.to_owned()
    }
}

/// Reads a profile a user named: unlike a store, a missing file is an error.
fn read_named(path: &Path) -> anyhow::Result<Profile> {
    let file = file_of(path);
    if !file.exists() {
        anyhow::bail!("{}: no such profile", file.display());
    }
    Ok(read_profile(&file, &ProfileLimits::default())?)
}

pub(crate) fn run(cmd: &ProfileCmd) -> ExitCode {
    let result = match cmd {
        ProfileCmd::Show(a) => show(a),
        ProfileCmd::Merge(a) => merge(a),
        ProfileCmd::Diff(a) => diff(a),
    };
    result.unwrap_or_else(|e| {
        // `{e}`, not `{e:#}`: a ProfileError's message already holds its source.
        eprintln!("ccol: {e}");
        ExitCode::from(EXIT_BAD_INPUT)
    })
}

fn show(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let profile = read_named(&args.path)?;
    if args.json {
        println!("{}", profile.to_json());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "profile {}: {}",
        file_of(&args.path).display(),
        crate::count(profile.len(), "entry", "entries")
    );
    println!(
        "{:<32}  {:<18}  {:<10}  {:<18}  {:<18}  {:<8}  dynamic",
        "key", "kind", "source", "size", "stride", "scalar"
    );
    for (k, v) in profile.entries() {
        let ProfileValue::Shapes(state) = v else {
            println!(
                "{:<32}  {:<18}  (a decision kind this build cannot show)",
                k.key, k.kind
            );
            continue;
        };
        if state.is_empty() {
            println!("{:<32}  {:<18}  (no sources)", k.key, k.kind);
        }
        for (source, e) in state.iter() {
            println!(
                "{:<32}  {:<18}  {:<10}  {:<18}  {:<18}  {:<8}  {}",
                k.key,
                k.kind,
                source,
                e.size.to_string(),
                e.stride.to_string(),
                e.scalar.to_string(),
                decision_text(&e)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `dims [0, 1]`, `all`, or `static`.
fn decision_text(e: &SizeEntry) -> String {
    match persisted_decision(e) {
        serde_json::Value::Array(a) if a.is_empty() => "static".into(),
        serde_json::Value::Array(a) => {
            let dims: Vec<String> = a.iter().map(ToString::to_string).collect();
            format!("dims [{}]", dims.join(", "))
        }
        other => other.as_str().unwrap_or("?").to_owned(),
    }
}

fn merge(args: &MergeArgs) -> anyhow::Result<ExitCode> {
    let mut merged = Profile::new();
    for p in &args.inputs {
        merged.join(&read_named(p)?);
    }
    // A directory is a store: replace its profile under its lock, so a job
    // saving into it at the same time loses nothing to a half-done merge.
    // So is the directory of a file named `profile.ccol`.
    let store_dir = if args.output.is_dir() {
        Some(args.output.clone())
    } else if args.output.file_name() == Some(PROFILE_FILE.as_ref()) {
        Some(match args.output.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        })
    } else {
        None
    };
    let out = if let Some(dir) = store_dir {
        let store = ProfileStore::open(dir)?;
        store.replace(&merged)?;
        store.path()
    } else {
        write_profile_atomic(&args.output, &merged)?;
        args.output.clone()
    };
    println!(
        "wrote {} ({} from {})",
        out.display(),
        crate::count(merged.len(), "entry", "entries"),
        crate::count(args.inputs.len(), "profile", "profiles")
    );
    Ok(ExitCode::SUCCESS)
}

fn diff(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let a = read_named(&args.a)?;
    let b = read_named(&args.b)?;
    let lines = a.diff(&b);
    if lines.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "A = {}, B = {}",
        file_of(&args.a).display(),
        file_of(&args.b).display()
    );
    for l in lines {
        println!("{l}");
    }
    Ok(ExitCode::FAILURE)
}

/// `ccol profile-writer`: saves entries `<prefix>-0` … `<prefix>-<count-1>`
/// one save each (the crash-safety tests start several and kill some).
#[derive(Args, Debug)]
pub(crate) struct WriterArgs {
    /// The store directory.
    #[arg(long)]
    dir: PathBuf,
    /// Compile-key prefix of this writer's entries.
    #[arg(long)]
    prefix: String,
    /// Number of saves.
    #[arg(long)]
    count: u32,
    /// Also put this many filler entries into the first save (a large file
    /// makes each save slow enough to be killed in the middle).
    #[arg(long, default_value_t = 0)]
    filler: u32,
}

pub(crate) fn writer(args: &WriterArgs) -> ExitCode {
    let run = || -> anyhow::Result<()> {
        let store = ProfileStore::open(&args.dir)?;
        for i in 0..args.count {
            let mut p = Profile::new();
            if i == 0 {
                for j in 0..args.filler {
                    p.record_shapes(&format!("filler-{j}"), &one_source(u64::from(j)));
                }
            }
            p.record_shapes(&format!("{}-{i}", args.prefix), &one_source(u64::from(i)));
            store.save(&p)?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccol profile-writer: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn one_source(n: u64) -> FrameState {
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor([n + 2, 10]));
    s
}
