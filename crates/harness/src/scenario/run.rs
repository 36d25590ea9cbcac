//! Running a scenario: one rank over any transport ([`run_rank`],
//! [`run_rank_with`] with a profile), or every rank as a thread over the
//! in-process engine ([`run_in_process`], [`run_in_process_with`]).

use super::setup::{self, ArtifactSteps};
use super::{Mode, RankError, RankReport, RunReport, Scenario};
use compiler_collectives_core::cache::{CompileCache, Outcome};
use compiler_collectives_core::persistence::artifacts::ArtifactOrigin;
use compiler_collectives_core::protocol::{Channel, ChannelOptions};
use compiler_collectives_core::transport::inprocess::InProcessGroup;
use compiler_collectives_core::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// Most ranks [`run_in_process`] starts (one thread each).
pub const MAX_IN_PROCESS_RANKS: u32 = 4096;

/// The scenario runner's default exchange deadline (docs/scenarios.md): 10 s.
pub const RUNNER_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one rank of `scenario` in `mode` over `channel` (any transport), and
/// shuts the channel down at the end so that peers still waiting fail at
/// once. Never panics on scenario content.
pub fn run_rank(
    scenario: &Scenario,
    mode: Mode,
    rank: u32,
    channel: Option<Channel>,
) -> RankReport {
    run_rank_with(scenario, mode, rank, channel, None)
}

/// [`run_rank`] with a profile: the rank loads the state persisted for the
/// scenario's compile key (`scenario:<name>`) before its first step and
/// saves its state after every compile (see [`compiler_collectives_core::persistence::profile`]).
pub fn run_rank_with(
    scenario: &Scenario,
    mode: Mode,
    rank: u32,
    mut channel: Option<Channel>,
    profile: Option<&compiler_collectives_core::persistence::profile::ProfileStore>,
) -> RankReport {
    let options = scenario.options_for(mode);
    let mut cache: CompileCache<String> =
        CompileCache::new(format!("scenario:{}", scenario.name), options);
    let mut report = RankReport::new(rank);
    if let Some(store) = profile {
        match store.load_shapes(cache.key()) {
            Ok(Some(state)) => cache = cache.with_state(state),
            Ok(None) => {}
            Err(e) => report.error = Some(RankError::from_profile(&e)),
        }
    }
    for (source, (ndim, dims)) in scenario.setup.mark_dynamic.get(&rank).into_iter().flatten() {
        for &d in dims {
            if let Err(e) = cache.mark_dynamic(source, *ndim, d) {
                report.error = Some(RankError::from_error(&e));
            }
        }
    }
    let store = if scenario.setup.artifact_cache {
        match setup::ScenarioStore::new() {
            Ok(s) => Some(s),
            Err(e) => {
                report.error = Some(RankError::from_error(&Error::InvalidArgument(format!(
                    "cannot create the rank's artifact cache directory: {e}"
                ))));
                None
            }
        }
    } else {
        None
    };
    if store.is_some() {
        report.artifacts = Some(ArtifactSteps::default());
    }
    let warm = scenario.setup.warm_cache.get(&rank);
    let cache_key = cache.key().to_owned();
    for (s, step) in scenario.steps.iter().enumerate() {
        let Some(inputs) = step.get(rank as usize) else {
            break;
        };
        if report.error.is_some() {
            break;
        }
        let outcome = match &store {
            None => cache.call(inputs, channel.as_mut(), |_| String::new()),
            Some(store) => {
                store
                    .warm_now
                    .set(warm.is_some_and(|w| w.contains(&(s as u64))));
                cache
                    .call_persistent(inputs, channel.as_mut(), store, |frame, ch| {
                        setup::backend_compile(&cache_key, frame, ch)
                    })
                    .map(|call| {
                        let a = report.artifacts.get_or_insert_with(ArtifactSteps::default);
                        match call.origin {
                            Some(ArtifactOrigin::Loaded) => {
                                a.loaded_steps.push(s as u64);
                                a.disk_hit_steps.push(s as u64);
                            }
                            Some(ArtifactOrigin::Compiled { local_hit }) => {
                                a.compiled_steps.push(s as u64);
                                if local_hit {
                                    a.disk_hit_steps.push(s as u64);
                                }
                            }
                            None => {}
                        }
                        call.outcome
                    })
            }
        };
        let outcome = outcome.map_err(|e| {
            tracing::debug!(rank, step = s, error = %e, "scenario rank failed");
            RankError::from_error(&e)
        });
        let outcome = match (outcome, profile) {
            (Ok(Outcome::Compiled(i)), Some(store)) => store
                .save_shapes(cache.key(), cache.state())
                .map(|()| Outcome::Compiled(i))
                .map_err(|e| {
                    tracing::debug!(rank, step = s, error = %e, "scenario rank: profile not saved");
                    RankError::from_profile(&e)
                }),
            (o, _) => o,
        };
        match outcome {
            Ok(Outcome::Compiled(_)) => report.compile_steps.push(s as u64),
            Ok(Outcome::Hit(_)) => {}
            Ok(Outcome::Uncompiled) => report.uncompiled_steps += 1,
            Err(e) => {
                report.error = Some(e);
                break;
            }
        }
    }
    if let Some(last) = cache.frames().last() {
        report.dynamic_dims = last.dynamic_dims.clone();
        report.dynamic_scalars = last.dynamic_scalars.clone();
        report.dynamic_strides = last.dynamic_strides.clone();
        for (source, d) in &last.decisions {
            let text = match d {
                compiler_collectives_core::decisions::shapes::SourceDecision::Tensor {
                    dynamic_sizes,
                    ..
                } => {
                    let dims: Vec<usize> = (0..dynamic_sizes.len())
                        .filter(|&i| dynamic_sizes[i])
                        .collect();
                    if dims.is_empty() {
                        continue;
                    }
                    format!("{dims:?}")
                }
                compiler_collectives_core::decisions::shapes::SourceDecision::Int {
                    dynamic: true,
                } => "scalar".to_string(),
                _ => continue,
            };
            report.decided.insert(source.clone(), text);
        }
    }
    if let Some(ch) = channel.as_mut() {
        if report.error.is_some() {
            ch.abort();
        } else if let Err(e) = ch.shutdown() {
            tracing::warn!(rank, error = %e, "scenario: shutdown failed");
        }
    }
    report
}

/// Runs `scenario` in `mode` with one thread per rank over the in-process
/// engine, each exchange bounded by `timeout`.
///
/// # Errors
/// [`Error::InvalidArgument`] for more than [`MAX_IN_PROCESS_RANKS`] ranks or
/// if threads cannot be started.
pub fn run_in_process(scenario: &Scenario, mode: Mode, timeout: Duration) -> Result<RunReport> {
    run_in_process_with(scenario, mode, timeout, &RunOptions::default())
}

/// Options of a scenario run beyond mode and deadline, built with
/// `RunOptions::default().with_…` (one `with_<field>` setter per field). New
/// knobs are added as fields.
#[derive(Clone, Debug, Default, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct RunOptions {
    /// Load and save decisions in this profile (every rank loads before its
    /// first step and saves after each compile); default `None`, no profile.
    /// `with_profile(ProfileStore)` sets `Some`.
    #[setters(strip_option)]
    pub profile: Option<compiler_collectives_core::persistence::profile::ProfileStore>,
    /// Write each rank's trace file (`rank-<r>.jsonl`) into this directory;
    /// default `None`, no trace. `with_trace_dir(impl Into<PathBuf>)` sets `Some`.
    #[setters(strip_option, into)]
    pub trace_dir: Option<std::path::PathBuf>,
}

/// [`run_in_process`] with a profile and trace files.
///
/// # Errors
/// As [`run_in_process`]; [`Error::InvalidArgument`] when a trace file
/// cannot be created.
pub fn run_in_process_with(
    scenario: &Scenario,
    mode: Mode,
    timeout: Duration,
    run: &RunOptions,
) -> Result<RunReport> {
    if scenario.world_size > MAX_IN_PROCESS_RANKS {
        return Err(Error::InvalidArgument(format!(
            "world_size {} is more ranks than the in-process runner starts threads for ({MAX_IN_PROCESS_RANKS}); \
             run larger worlds over processes",
            scenario.world_size
        )));
    }
    let (collectives, votes) = mode.flags();
    let transports = InProcessGroup::create(scenario.world_size)?;
    let scenario = Arc::new(scenario.clone());
    let mut handles = Vec::with_capacity(transports.len());
    for t in transports {
        let rank = compiler_collectives_core::Transport::rank(&t);
        let channel = if collectives || votes {
            let mut opts = ChannelOptions::default().with_timeout(timeout);
            opts.trace_dir.clone_from(&run.trace_dir);
            Some(Channel::with_options(Arc::new(t), opts)?)
        } else {
            None
        };
        let sc = Arc::clone(&scenario);
        let store = run.profile.clone();
        let h = std::thread::Builder::new()
            .name(format!("rank-{rank}"))
            .stack_size(512 << 10)
            .spawn(move || run_rank_with(&sc, mode, rank, channel, store.as_ref()))
            .map_err(|e| {
                Error::InvalidArgument(format!("cannot start the thread of rank {rank}: {e}"))
            })?;
        handles.push((rank, h));
    }
    let mut ranks = Vec::with_capacity(handles.len());
    for (rank, h) in handles {
        ranks.push(h.join().unwrap_or_else(|_| {
            RankReport::failed(
                rank,
                "panic",
                format!("rank {rank} panicked (a bug: please report it)"),
            )
        }));
    }
    Ok(RunReport {
        name: scenario.name.clone(),
        mode,
        ranks,
    })
}
