//! Behaviours every compiler-collectives transport must show, written once.
//!
//! A behaviour is a function that **every rank** runs with its own
//! [`Ctx`]; it returns `Err(text)` when that rank saw something wrong. A
//! backend runs each behaviour on all ranks of a fresh group — threads for
//! the in-process engine, real processes for Gloo — and requires every rank
//! to return `Ok`. Backend differences are plain arguments of [`Ctx`].
//!
//! [`in_process_trials`] makes one case per behaviour and world size for
//! the in-process engine; multi-process backends run theirs through
//! [`process`] and look a behaviour up by name with [`find`] inside their
//! rank processes. Every runner has a hard limit per case: a hung rank
//! fails its case, never the whole run. [`skip`] is the one skip rule.
//!
//! Behaviours whose assertions are about time ([`Behaviour::timed`]) must be
//! run one at a time (the in-process runner holds [`TIMING_LOCK`]).

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
mod decisions;
pub mod process;
mod ranks;
pub mod skip;

use compiler_collectives_core::RankGroup;
use compiler_collectives_core::{
    decisions::votes::AnyVote, protocol::envelope, Channel, ChannelOptions, Deadline, Error,
    InProcessGroup, PeerLoss, Transport,
};
use compiler_collectives_core::{Capabilities, FlatReason, Topology};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a rank gets to run a behaviour.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// This rank's transport (a fresh group per behaviour).
    pub transport: Arc<dyn Transport>,
    /// The deadline a behaviour should give operations that must succeed.
    pub timeout: Duration,
    /// The short deadline used by behaviours that wait for a timeout.
    pub short_timeout: Duration,
    /// The slack allowed past a deadline before an error must have come
    /// (docs/failures.md: within the deadline plus a small margin; 1 s).
    pub margin: Duration,
}

impl Ctx {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.transport.rank()
    }

    /// The number of ranks.
    pub fn world(&self) -> u32 {
        self.transport.world_size()
    }

    /// A channel over this rank's transport with `timeout`.
    pub fn channel(&self, timeout: Duration) -> Result<Channel, String> {
        Channel::with_options(
            Arc::clone(&self.transport),
            ChannelOptions::default().with_timeout(timeout),
        )
        .map_err(|e| e.to_string())
    }

    fn deadline(&self) -> Deadline {
        Deadline::after(self.timeout)
    }
}

/// A capability a behaviour needs (one of core's [`Capabilities`]);
/// behaviours that need one a backend lacks are skipped for it, with the
/// reason printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Timeouts name the ranks that did not arrive.
    NamesMissingRanks,
    /// A rank that shuts down or aborts tells waiting peers at once.
    TellsPeersItLeft,
    /// Point-to-point is cheap (the tree exchange runs over it).
    CheapPointToPoint,
}

impl Capability {
    /// Whether `caps` has it.
    pub fn in_set(self, caps: &Capabilities) -> bool {
        match self {
            Capability::NamesMissingRanks => caps.names_missing_ranks,
            Capability::TellsPeersItLeft => caps.tells_peers_it_left,
            Capability::CheapPointToPoint => caps.cheap_point_to_point,
        }
    }
}

/// A behaviour: a name, the smallest world it needs, whether it asserts on
/// time, and the per-rank body.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// Unique name (used by multi-process runners to pick it).
    pub name: &'static str,
    /// Smallest world size it makes sense for.
    pub min_world: u32,
    /// Whether it asserts on elapsed time (run one at a time).
    pub timed: bool,
    /// The body every rank runs.
    pub run: fn(&Ctx) -> Result<(), String>,
    /// What the backend must be able to do.
    pub needs: &'static [Capability],
}

impl Behaviour {
    /// The first capability in `needs` that `has` lacks.
    pub fn missing(&self, has: &Capabilities) -> Option<Capability> {
        self.needs.iter().copied().find(|c| !c.in_set(has))
    }
}

/// Every behaviour.
pub const BEHAVIOURS: &[Behaviour] = &[
    Behaviour {
        name: "all_gather_varlen",
        min_world: 1,
        timed: false,
        run: all_gather_varlen,
        needs: &[],
    },
    Behaviour {
        name: "all_gather_sizes_mixed",
        min_world: 1,
        timed: false,
        run: all_gather_sizes_mixed,
        needs: &[],
    },
    Behaviour {
        name: "all_gather_empty",
        min_world: 1,
        timed: false,
        run: all_gather_empty,
        needs: &[],
    },
    Behaviour {
        name: "all_gather_fixed",
        min_world: 1,
        timed: false,
        run: all_gather_fixed,
        needs: &[],
    },
    Behaviour {
        name: "all_gather_sized",
        min_world: 1,
        timed: false,
        run: all_gather_sized,
        needs: &[],
    },
    Behaviour {
        name: "broadcast_every_root",
        min_world: 1,
        timed: false,
        run: broadcast_every_root,
        needs: &[],
    },
    Behaviour {
        name: "barrier_repeated",
        min_world: 1,
        timed: false,
        run: barrier_repeated,
        needs: &[],
    },
    Behaviour {
        name: "send_recv_ring",
        min_world: 2,
        timed: false,
        run: send_recv_ring,
        needs: &[],
    },
    Behaviour {
        name: "oversized_message_named",
        min_world: 2,
        timed: false,
        run: oversized_message_named,
        needs: &[],
    },
    Behaviour {
        name: "exchange_identical_fast_path",
        min_world: 1,
        timed: false,
        run: exchange_identical_fast_path,
        needs: &[],
    },
    Behaviour {
        name: "exchange_merges_differences",
        min_world: 2,
        timed: false,
        run: exchange_merges_differences,
        needs: &[],
    },
    Behaviour {
        name: "exchange_sequence_advances",
        min_world: 1,
        timed: false,
        run: exchange_sequence_advances,
        needs: &[],
    },
    Behaviour {
        name: "desync_compile_keys",
        min_world: 2,
        timed: false,
        run: desync_compile_keys,
        needs: &[],
    },
    Behaviour {
        name: "desync_sequence_numbers",
        min_world: 2,
        timed: false,
        run: desync_sequence_numbers,
        needs: &[],
    },
    Behaviour {
        name: "desync_decision_kinds",
        min_world: 2,
        timed: false,
        run: desync_decision_kinds,
        needs: &[],
    },
    Behaviour {
        name: "config_disagreement",
        min_world: 2,
        timed: false,
        run: config_disagreement,
        needs: &[],
    },
    Behaviour {
        name: "version_mismatch_named",
        min_world: 2,
        timed: false,
        run: version_mismatch_named,
        needs: &[],
    },
    Behaviour {
        name: "corrupt_payload_named",
        min_world: 2,
        timed: false,
        run: corrupt_payload_named,
        needs: &[],
    },
    Behaviour {
        name: "version_mismatch_full_path",
        min_world: 2,
        timed: false,
        run: version_mismatch_full_path,
        needs: &[],
    },
    Behaviour {
        name: "corrupt_payload_every_rank",
        min_world: 2,
        timed: false,
        run: corrupt_payload_every_rank,
        needs: &[],
    },
    Behaviour {
        name: "slow_rank_within_deadline",
        min_world: 2,
        timed: true,
        run: slow_rank_within_deadline,
        needs: &[],
    },
    Behaviour {
        name: "unusable_after_error",
        min_world: 2,
        timed: false,
        run: unusable_after_error,
        needs: &[],
    },
    Behaviour {
        name: "missing_rank_times_out",
        min_world: 2,
        timed: true,
        run: missing_rank_times_out,
        needs: &[Capability::NamesMissingRanks],
    },
    Behaviour {
        name: "abort_is_not_a_shutdown",
        min_world: 2,
        timed: true,
        run: abort_is_not_a_shutdown,
        needs: &[Capability::TellsPeersItLeft],
    },
    Behaviour {
        name: "shutdown_fails_peers_fast",
        min_world: 2,
        timed: true,
        run: shutdown_fails_peers_fast,
        needs: &[Capability::TellsPeersItLeft],
    },
    Behaviour {
        name: "two_ranks_leave_at_different_times",
        min_world: 3,
        timed: true,
        run: two_ranks_leave_at_different_times,
        needs: &[],
    },
    Behaviour {
        name: "late_rank_after_the_others_closed",
        min_world: 2,
        timed: true,
        run: late_rank_after_the_others_closed,
        needs: &[],
    },
    Behaviour {
        name: "recv_after_the_sender_closed",
        min_world: 2,
        timed: true,
        run: recv_after_the_sender_closed,
        needs: &[Capability::CheapPointToPoint],
    },
    Behaviour {
        name: "use_after_shutdown_is_unusable",
        min_world: 1,
        timed: false,
        run: use_after_shutdown_is_unusable,
        needs: &[],
    },
    Behaviour {
        name: "must_agree_names_values",
        min_world: 2,
        timed: false,
        run: decisions::must_agree_names_values,
        needs: &[],
    },
    Behaviour {
        name: "autotune_sharded_same_winner",
        min_world: 1,
        timed: false,
        run: decisions::autotune_sharded_same_winner,
        needs: &[],
    },
    Behaviour {
        name: "autotune_lists_differ",
        min_world: 2,
        timed: false,
        run: decisions::autotune_lists_differ,
        needs: &[],
    },
    Behaviour {
        name: "cache_hit_agreement",
        min_world: 1,
        timed: false,
        run: decisions::cache_hit_agreement,
        needs: &[],
    },
    Behaviour {
        name: "tree_exchange_matches_flat",
        min_world: 2,
        timed: false,
        run: tree_exchange_matches_flat,
        needs: &[],
    },
];

/// The line the hung rank of [`HUNG_RANK`] prints before it hangs.
pub const HUNG_MARK: &str = "HUNG: this rank sleeps forever on purpose";

/// Not a behaviour of the suite (not in [`BEHAVIOURS`]): the harness's own
/// check. The last rank prints [`HUNG_MARK`] and sleeps forever inside the
/// behaviour, as a rank stuck in an engine would; the others wait for it in
/// an exchange. A runner must fail such a case at its limit and go on
/// ([`process::harness_trials`], [`run_in_process_within`]).
pub const HUNG_RANK: Behaviour = Behaviour {
    name: "hung_rank",
    min_world: 2,
    timed: false,
    run: hung_rank,
    needs: &[],
};

fn hung_rank(ctx: &Ctx) -> Result<(), String> {
    if ctx.rank() + 1 == ctx.world() {
        println!("{HUNG_MARK}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let mut ch = ctx.channel(ctx.timeout)?;
    ch.exchange("f", &AnyVote(false))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The behaviour called `name` ([`BEHAVIOURS`] and [`HUNG_RANK`]).
pub fn find(name: &str) -> Option<&'static Behaviour> {
    BEHAVIOURS
        .iter()
        .chain(std::iter::once(&HUNG_RANK))
        .find(|b| b.name == name)
}

/// Held while a timed behaviour runs, so timing assertions are not disturbed
/// by other tests on a 2-core machine.
pub static TIMING_LOCK: Mutex<()> = Mutex::new(());

/// How long an in-process case may run before its unfinished ranks are
/// reported as hung (their threads are left behind; the test fails and the
/// binary goes on).
pub const IN_PROCESS_LIMIT: Duration = Duration::from_secs(60);

/// Runs `behaviour` on `world` in-process ranks (threads) and returns every
/// rank's result, index = rank, within [`IN_PROCESS_LIMIT`].
pub fn run_in_process(behaviour: &Behaviour, world: u32) -> Vec<Result<(), String>> {
    run_in_process_within(behaviour, world, IN_PROCESS_LIMIT)
}

/// [`run_in_process`] with another limit: a rank that has not finished
/// when `limit` has passed gets an `Err` saying it hung.
pub fn run_in_process_within(
    behaviour: &Behaviour,
    world: u32,
    limit: Duration,
) -> Vec<Result<(), String>> {
    let _guard = behaviour
        .timed
        .then(|| TIMING_LOCK.lock().unwrap_or_else(|e| e.into_inner()));
    let transports = match InProcessGroup::create(world) {
        Ok(t) => t,
        Err(e) => return vec![Err(e.to_string())],
    };
    let (tx, rx) = std::sync::mpsc::channel();
    for (r, t) in transports.into_iter().enumerate() {
        let ctx = Ctx {
            transport: Arc::new(t),
            timeout: Duration::from_secs(20),
            short_timeout: Duration::from_millis(1500),
            margin: Duration::from_secs(1),
        };
        let (run, tx) = (behaviour.run, tx.clone());
        std::thread::spawn(move || {
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&ctx)))
                .unwrap_or_else(|_| Err("rank panicked".into()));
            let _ = tx.send((r, res));
        });
    }
    drop(tx);
    let start = Instant::now();
    let mut results: Vec<Option<Result<(), String>>> = (0..world).map(|_| None).collect();
    while results.iter().any(Option::is_none) {
        let left = limit.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok((r, res)) => results[r] = Some(res),
            Err(_) => break,
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(format!(
                    "hung: not finished at the case's limit of {} ms (its thread is left behind)",
                    limit.as_millis()
                ))
            })
        })
        .collect()
}

/// Asserts that every rank returned `Ok`, listing each failing rank.
///
/// # Panics
/// When a rank failed (this is a test helper).
pub fn assert_all_ok(name: &str, world: u32, results: &[Result<(), String>]) {
    let failures: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(r, res)| res.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{name} at world size {world}:\n{}",
        failures.join("\n")
    );
}

/// Every behaviour at each of `worlds` over the in-process engine (ranks
/// as threads), named `in_process::<behaviour>::world_<n>`, each within
/// [`IN_PROCESS_LIMIT`]; a world below a behaviour's smallest is listed as
/// ignored with the reason. Plus the runner's own hung-rank check.
pub fn in_process_trials(worlds: &[u32]) -> Vec<libtest_mimic::Trial> {
    use libtest_mimic::{Completion, Failed, Trial};
    let mut trials = Vec::new();
    for b in BEHAVIOURS {
        for &world in worlds {
            let name = format!("in_process::{}::world_{world}", b.name);
            if world < b.min_world {
                let why = format!("needs at least {} ranks", b.min_world);
                trials.push(Trial::ignorable_test(name, move || {
                    Ok(Completion::ignored_with(why))
                }));
                continue;
            }
            trials.push(Trial::test(name, move || {
                let failures: Vec<String> = run_in_process(b, world)
                    .iter()
                    .enumerate()
                    .filter_map(|(r, res)| res.as_ref().err().map(|e| format!("rank {r}: {e}")))
                    .collect();
                if failures.is_empty() {
                    Ok(())
                } else {
                    Err(Failed::from(failures.join("\n")))
                }
            }));
        }
    }
    trials.push(Trial::test(
        "in_process::harness::hung_rank_fails_at_the_limit",
        || hung_rank_check().map_err(Failed::from),
    ));
    trials
}

/// A rank that hangs on purpose makes its in-process case fail at the limit
/// (the hung thread is left behind) instead of blocking the test binary.
fn hung_rank_check() -> Result<(), String> {
    let limit = Duration::from_secs(2);
    let start = Instant::now();
    let results = run_in_process_within(&HUNG_RANK, 2, limit);
    let took = start.elapsed();
    ensure(
        took >= limit && took < limit + Duration::from_secs(2),
        || format!("the case ended after {took:?} (limit {limit:?})"),
    )?;
    let want = "hung: not finished at the case's limit of 2000 ms";
    // Rank 0 waits for rank 1 in an exchange with a 20 s deadline: it has
    // not finished either.
    for (r, res) in results.iter().enumerate() {
        ensure(res.as_ref().is_err_and(|e| e.starts_with(want)), || {
            format!("rank {r}: {res:?}")
        })?;
    }
    Ok(())
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

fn payload_of(rank: u32) -> Vec<u8> {
    // Rank 0 sends nothing; rank r sends 7r bytes of value r.
    vec![u8::try_from(rank % 251).unwrap_or(0); (rank as usize) * 7]
}

fn all_gather_varlen(ctx: &Ctx) -> Result<(), String> {
    let got = ctx
        .transport
        .all_gather(&payload_of(ctx.rank()), 1 << 20, ctx.deadline())
        .map_err(|e| e.to_string())?;
    ensure(got.len() == ctx.world() as usize, || {
        format!("{} buffers for world {}", got.len(), ctx.world())
    })?;
    for (r, buf) in (0u32..).zip(&got) {
        ensure(*buf == payload_of(r), || {
            format!("buffer of rank {r}: {buf:?}")
        })?;
    }
    // This rank's own buffer over its limit: refused before anything is
    // sent, and the transport goes on.
    let own = ctx.transport.all_gather(&[0u8; 9], 8, ctx.deadline());
    ensure(matches!(own, Err(Error::InvalidArgument(_))), || {
        format!("9 bytes with max_bytes 8: {own:?}")
    })?;
    ctx.transport
        .barrier(ctx.deadline())
        .map_err(|e| format!("barrier after a refused all_gather: {e}"))
}

/// Buffer sizes on both sides of the limits engines treat specially (Gloo
/// sends up to 4160 bytes inside its header message; the exchange's slot is
/// 4096), ranks of one collective mixing them: each size in turn, every rank
/// a different one of them in each round.
fn all_gather_sizes_mixed(ctx: &Ctx) -> Result<(), String> {
    const SIZES: [usize; 7] = [0, 1, 4095, 4096, 4160, 4161, 70_000];
    let fill = |rank: u32, round: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| {
                i.to_le_bytes()[0] ^ rank.to_le_bytes()[0].wrapping_mul(31) ^ round.to_le_bytes()[0]
            })
            .collect()
    };
    let size_of = |rank: u32, round: usize| SIZES[(round + rank as usize) % SIZES.len()];
    for (round, &n) in SIZES.iter().enumerate() {
        let mine = fill(ctx.rank(), round, size_of(ctx.rank(), round));
        let got = ctx
            .transport
            .all_gather(&mine, 1 << 20, ctx.deadline())
            .map_err(|e| format!("round {round}: {e}"))?;
        for (r, buf) in (0u32..).zip(&got) {
            let want = fill(r, round, size_of(r, round));
            ensure(*buf == want, || {
                format!(
                    "round {round}: rank {r}'s {} bytes, want {}",
                    buf.len(),
                    want.len()
                )
            })?;
        }
        let fixed = fill(ctx.rank(), round, n);
        let all = ctx
            .transport
            .all_gather_fixed(&fixed, ctx.deadline())
            .map_err(|e| format!("round {round} (fixed): {e}"))?;
        ensure(all.len() == n * ctx.world() as usize, || {
            format!("round {round} (fixed): {} bytes", all.len())
        })?;
        for r in 0..ctx.world() {
            let at = r as usize * n;
            ensure(all[at..at + n] == fill(r, round, n)[..], || {
                format!("round {round} (fixed): rank {r}'s bytes differ")
            })?;
        }
    }
    Ok(())
}

/// Contributions whose lengths every rank knows (the exchange's second
/// round): the sizes of [`all_gather_sizes_mixed`], ranks mixing them, some
/// rounds with every rank empty but one; then lengths that do not fit the
/// call are refused before anything is sent, and the transport goes on.
fn all_gather_sized(ctx: &Ctx) -> Result<(), String> {
    const SIZES: [usize; 7] = [0, 1, 4095, 4096, 4160, 4161, 70_000];
    let world = ctx.world() as usize;
    let fill = |rank: usize, round: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| {
                i.to_le_bytes()[0] ^ rank.to_le_bytes()[0].wrapping_mul(29) ^ round.to_le_bytes()[0]
            })
            .collect()
    };
    for round in 0..2 * SIZES.len() {
        // Odd rounds: only the last rank contributes.
        let lens: Vec<usize> = (0..world)
            .map(|r| {
                let n = SIZES[(round + r) % SIZES.len()];
                if round % 2 == 1 && r + 1 != world {
                    0
                } else {
                    n
                }
            })
            .collect();
        let me = ctx.rank() as usize;
        let got = ctx
            .transport
            .all_gather_sized(&fill(me, round, lens[me]), &lens, ctx.deadline())
            .map_err(|e| format!("round {round} ({lens:?}): {e}"))?;
        ensure(got.len() == world, || {
            format!("round {round}: {} buffers", got.len())
        })?;
        for (r, buf) in got.iter().enumerate() {
            ensure(*buf == fill(r, round, lens[r]), || {
                format!(
                    "round {round}: rank {r}'s {} bytes, want {}",
                    buf.len(),
                    lens[r]
                )
            })?;
        }
    }
    let wrong_count = ctx
        .transport
        .all_gather_sized(&[], &vec![0; world + 1], ctx.deadline());
    let mut lens = vec![3; world];
    let wrong_len = ctx
        .transport
        .all_gather_sized(&[1, 2], &lens, ctx.deadline());
    for (what, r) in [
        ("lengths of another world", wrong_count),
        ("data of another length", wrong_len),
    ] {
        ensure(matches!(r, Err(Error::InvalidArgument(_))), || {
            format!("{what}: {r:?}")
        })?;
    }
    lens[0] = 0;
    let me = ctx.rank() as usize;
    let got = ctx
        .transport
        .all_gather_sized(&fill(me, 99, lens[me]), &lens, ctx.deadline())
        .map_err(|e| format!("after refused calls: {e}"))?;
    ensure(
        got.iter()
            .enumerate()
            .all(|(r, b)| *b == fill(r, 99, lens[r])),
        || format!("after refused calls: {got:?}"),
    )
}

fn all_gather_empty(ctx: &Ctx) -> Result<(), String> {
    let got = ctx
        .transport
        .all_gather(&[], 16, ctx.deadline())
        .map_err(|e| e.to_string())?;
    ensure(
        got.len() == ctx.world() as usize && got.iter().all(Vec::is_empty),
        || format!("{got:?}"),
    )
}

fn all_gather_fixed(ctx: &Ctx) -> Result<(), String> {
    let mine = u64::from(ctx.rank())
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .to_le_bytes();
    let got = ctx
        .transport
        .all_gather_fixed(&mine, ctx.deadline())
        .map_err(|e| e.to_string())?;
    ensure(got.len() == 8 * ctx.world() as usize, || {
        format!("{} bytes", got.len())
    })?;
    for (r, chunk) in (0u32..).zip(got.chunks(8)) {
        let want = u64::from(r)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .to_le_bytes();
        ensure(chunk == want, || format!("chunk of rank {r}: {chunk:?}"))?;
    }
    Ok(())
}

fn broadcast_every_root(ctx: &Ctx) -> Result<(), String> {
    for root in 0..ctx.world() {
        let data = format!("from root {root}").into_bytes();
        let got = ctx
            .transport
            .broadcast(&data, root, 1 << 10, ctx.deadline())
            .map_err(|e| e.to_string())?;
        ensure(got == data, || {
            format!("root {root}: got {:?}", String::from_utf8_lossy(&got))
        })?;
    }
    Ok(())
}

fn barrier_repeated(ctx: &Ctx) -> Result<(), String> {
    for _ in 0..5 {
        ctx.transport
            .barrier(ctx.deadline())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Point-to-point around the ring, with tags kept apart: each rank first
/// sends its next peer one message on tag 9, then three on tag 7; the
/// receiver takes the three tag-7 messages first, in order (a transport
/// that ignored tags would hand it the tag-9 message), then the tag-9 one.
/// Sending to oneself is an invalid argument.
fn send_recv_ring(ctx: &Ctx) -> Result<(), String> {
    let (me, n) = (ctx.rank(), ctx.world());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let other = format!("{me}->{next} on tag 9");
    ctx.transport
        .send(next, 9, other.as_bytes(), ctx.deadline())
        .map_err(|e| format!("send on tag 9: {e}"))?;
    for i in 0u32..3 {
        let msg = format!("{me}->{next}#{i}");
        ctx.transport
            .send(next, 7, msg.as_bytes(), ctx.deadline())
            .map_err(|e| e.to_string())?;
    }
    let expect = |tag: u32, want: String| -> Result<(), String> {
        let got = ctx
            .transport
            .recv(prev, tag, 1 << 10, ctx.deadline())
            .map_err(|e| format!("receive on tag {tag}: {e}"))?;
        ensure(got == want.as_bytes(), || {
            format!(
                "receive on tag {tag} got {:?}, want {want}",
                String::from_utf8_lossy(&got)
            )
        })
    };
    for i in 0u32..3 {
        expect(7, format!("{prev}->{me}#{i}"))?;
    }
    expect(9, format!("{prev}->{me} on tag 9"))?;
    ctx.transport
        .barrier(ctx.deadline())
        .map_err(|e| e.to_string())?;
    let invalid = ctx.transport.send(me, 7, b"self", ctx.deadline());
    ensure(matches!(invalid, Err(Error::InvalidArgument(_))), || {
        format!("sending to oneself: {invalid:?}")
    })
}

/// The last rank sends 64 bytes where its peers' limit is 32 (its own is
/// 64): every peer gets a decode error naming it. The sender itself either
/// completes with every buffer right (an engine that delivered its bytes,
/// such as threads of one process) or fails with a typed error (a peer
/// refused the bytes) — never a wrong buffer or a hang; then all ranks
/// still share one barrier on the same transport's fixed-size path.
fn oversized_message_named(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let big = ctx.rank() == odd;
    let data = if big { vec![1u8; 64] } else { vec![0u8; 8] };
    let limit = if big { 64 } else { 32 };
    let res = ctx.transport.all_gather(&data, limit, ctx.deadline());
    if big {
        return match res {
            Ok(bufs) => {
                let want = |r: u32| {
                    if r == odd {
                        vec![1u8; 64]
                    } else {
                        vec![0u8; 8]
                    }
                };
                ensure(
                    bufs.len() == ctx.world() as usize
                        && (0u32..).zip(&bufs).all(|(r, b)| *b == want(r)),
                    || format!("the sender got wrong buffers: {bufs:?}"),
                )
            }
            Err(Error::Decode { .. } | Error::PeerLost { .. } | Error::Timeout { .. }) => Ok(()),
            Err(e) => Err(format!("the sender got an error of kind {}: {e}", e.kind())),
        };
    }
    match res {
        Err(Error::Decode { rank: Some(r), .. }) if r == odd => Ok(()),
        other => Err(format!(
            "expected a decode error naming rank {odd}, got {other:?}"
        )),
    }
}

fn state(batch: u64) -> FrameState {
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor([batch, 10]));
    s.record("n", &Observation::Int(3));
    s
}

fn exchange_identical_fast_path(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    let local = state(16);
    let g = exchange_with_cfg(&mut ch, &local)?;
    ensure(g.fast_path(), || {
        "identical states did not take the fast path".into()
    })?;
    ensure(*g.merged() == local, || format!("merged {:?}", g.merged()))?;
    ensure(g.seq() == 0, || format!("seq {}", g.seq()))
}

/// One exchange of `local` under key `step` with configuration `cfg`.
fn exchange_with_cfg<'a>(
    ch: &mut Channel,
    local: &'a FrameState,
) -> Result<compiler_collectives_core::Gathered<'a, FrameState>, String> {
    ch.exchange_with(
        "step",
        local,
        &compiler_collectives_core::ExchangeOptions::default().with_config("cfg"),
    )
    .map_err(|e| e.to_string())
}

fn exchange_merges_differences(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    let local = state(5 + u64::from(ctx.rank()));
    let g = exchange_with_cfg(&mut ch, &local)?;
    ensure(!g.fast_path(), || {
        "different states took the fast path".into()
    })?;
    let merged = g.merged();
    ensure(merged.get("x").size.to_string() == "(Dyn,10)", || {
        format!("x = {}", merged.get("x"))
    })?;
    ensure(merged.get("n").scalar.to_string() == "3", || {
        format!("n = {}", merged.get("n"))
    })?;
    let per_rank = g.per_rank().ok_or("no per-rank values")?;
    for (r, v) in (0u32..).zip(per_rank) {
        ensure(*v == state(5 + u64::from(r)), || {
            format!("value of rank {r}: {v:?}")
        })?;
    }
    Ok(())
}

fn exchange_sequence_advances(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    for i in 0..4u64 {
        let vote = AnyVote(ctx.rank() == 0 && i == 2);
        let g = ch.exchange("vote", &vote).map_err(|e| e.to_string())?;
        ensure(g.seq() == i, || format!("seq {} at exchange {i}", g.seq()))?;
        ensure(g.any() == (i == 2), || {
            format!("vote {i}: {:?}", g.merged())
        })?;
        ensure(ch.last_completed() == Some(i), || {
            format!("last completed {:?}", ch.last_completed())
        })?;
    }
    Ok(())
}

fn expect_groups(err: &Error, want: &[(&[u32], &str)]) -> Result<(), String> {
    let groups: &[RankGroup] = match err {
        Error::Desync { groups }
        | Error::VersionMismatch { groups }
        | Error::Disagreement { groups, .. } => groups,
        other => return Err(format!("expected grouped error, got {other}")),
    };
    ensure(groups.len() == want.len(), || {
        format!("groups {groups:?}, want {want:?}")
    })?;
    for (g, (ranks, what)) in groups.iter().zip(want) {
        ensure(g.ranks == *ranks && g.what.contains(what), || {
            format!("group {g:?}, want ranks {ranks:?} with '{what}' in {err}")
        })?;
    }
    Ok(())
}

/// Ranks below `split` in one group, the rest in the other.
fn split_groups(world: u32) -> (Vec<u32>, Vec<u32>) {
    let split = world.div_ceil(2);
    ((0..split).collect(), (split..world).collect())
}

fn desync_compile_keys(ctx: &Ctx) -> Result<(), String> {
    let (a, b) = split_groups(ctx.world());
    let key = if a.contains(&ctx.rank()) {
        "train_step@model.rs:88"
    } else {
        "eval_step@model.rs:120"
    };
    let mut ch = ctx.channel(ctx.timeout)?;
    let err = match ch.exchange(key, &state(8)) {
        Ok(_) => return Err("exchange under different compile keys succeeded".into()),
        Err(e) => e,
    };
    ensure(matches!(err, Error::Desync { .. }), || {
        format!("expected desync, got {err}")
    })?;
    expect_groups(
        &err,
        &[
            (&a, "#0 'train_step@model.rs:88'"),
            (&b, "#0 'eval_step@model.rs:120'"),
        ],
    )?;
    let text = err.to_string();
    ensure(text.contains("unusable"), || {
        format!("message does not say the channel is unusable: {text}")
    })
}

fn desync_sequence_numbers(ctx: &Ctx) -> Result<(), String> {
    // Rank 0 exchanges twice on one channel; the others use a second channel
    // over the same communicator for their second exchange (a misuse that
    // puts the ranks at different sequence numbers).
    let mut ch = ctx.channel(ctx.timeout)?;
    ch.exchange("f", &AnyVote(false))
        .map_err(|e| e.to_string())?;
    let res = if ctx.rank() == 0 {
        ch.exchange("f", &AnyVote(false))
    } else {
        let mut fresh = ctx.channel(ctx.timeout)?;
        fresh.exchange("f", &AnyVote(false))
    };
    let err = res
        .err()
        .ok_or("exchange at different sequence numbers succeeded")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(&err, &[(&[0], "#1 'f'"), (&others, "#0 'f'")])
}

fn desync_decision_kinds(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    let res = if ctx.rank() == 0 {
        ch.exchange("f", &AnyVote(true)).map(|_| ())
    } else {
        ch.exchange("f", &state(4)).map(|_| ())
    };
    let err = res.err().ok_or("exchange of different kinds succeeded")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(&err, &[(&[0], "vote.any"), (&others, "shape.frame_state")])
}

fn config_disagreement(ctx: &Ctx) -> Result<(), String> {
    let cfg = if ctx.rank() == 0 {
        "overrides={x=force_static}"
    } else {
        "overrides={}"
    };
    let mut ch = ctx.channel(ctx.timeout)?;
    let err = ch
        .exchange_with(
            "f",
            &state(4),
            &compiler_collectives_core::ExchangeOptions::default().with_config(cfg),
        )
        .err()
        .ok_or("differing configuration accepted")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(&err, &[(&[0], "force_static"), (&others, "overrides={}")])
}

/// The last rank plays a peer of a later wire version: it sends a first
/// round of the slot's size by hand, magic and version 99 in front (the
/// layout every version keeps). Every other rank gets the
/// version-mismatch error naming it; then every rank all_gathers what it
/// concluded, and the v99 rank checks what its peers reported: each a
/// `version_mismatch` with this build's ranks and itself as v99.
fn version_mismatch_named(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let others: Vec<u32> = (0..odd).collect();
    let ours = format!("v{}", envelope::WIRE_VERSION);
    let want = [(&others[..], ours.as_str()), (&[odd][..], "v99")];
    let report = if ctx.rank() == odd {
        let mut msg = vec![0u8; envelope::DEFAULT_SLOT_BYTES];
        msg[..4].copy_from_slice(&envelope::MAGIC);
        msg[4..6].copy_from_slice(&99u16.to_le_bytes());
        ctx.transport
            .all_gather_fixed(&msg, ctx.deadline())
            .map_err(|e| e.to_string())?;
        String::new()
    } else {
        let mut ch = ctx.channel(ctx.timeout)?;
        let err = ch
            .exchange("f", &state(4))
            .err()
            .ok_or("a v99 peer was accepted")?;
        ensure(matches!(err, Error::VersionMismatch { .. }), || {
            format!("{err}")
        })?;
        expect_groups(&err, &want)?;
        report_of(&err)
    };
    let reports = ctx
        .transport
        .all_gather(report.as_bytes(), 1 << 16, ctx.deadline())
        .map_err(|e| format!("gathering the reports: {e}"))?;
    if ctx.rank() != odd {
        return Ok(());
    }
    let expected = format!("version_mismatch {others:?}={ours}; [{odd}]=v99");
    for (r, text) in (0u32..).zip(&reports[..odd as usize]) {
        let text = String::from_utf8_lossy(text);
        ensure(text == expected, || {
            format!("rank {r} reported {text:?}, want {expected:?}")
        })?;
    }
    Ok(())
}

/// An error's kind and rank groups, as one line a peer can compare:
/// `version_mismatch [0, 1]=v2; [2]=v99`.
fn report_of(err: &Error) -> String {
    let groups = match err {
        Error::Desync { groups }
        | Error::VersionMismatch { groups }
        | Error::Disagreement { groups, .. } => groups.as_slice(),
        _ => &[],
    };
    let groups: Vec<String> = groups
        .iter()
        .map(|g| format!("{:?}={}", g.ranks, g.what))
        .collect();
    format!("{} {}", err.kind(), groups.join("; "))
}

/// The last rank sends a valid header with a garbage payload.
fn corrupt_payload_named(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    if ctx.rank() == odd {
        let env = envelope::Envelope {
            version: envelope::WIRE_VERSION,
            seq: 0,
            kind: "shape.frame_state".into(),
            key: "f".into(),
            config: String::new(),
            payload: vec![0xff; 9],
        };
        let bytes = env
            .encode(&envelope::Limits::default())
            .map_err(|e| e.to_string())?;
        // The flat exchange's one round: this envelope inline in its slot.
        let mut slot = vec![0u8; envelope::DEFAULT_SLOT_BYTES];
        let len = u32::try_from(bytes.len()).map_err(|e| e.to_string())?;
        let limit = envelope::Limits::default().max_message_bytes as u64;
        envelope::write_slot_header(&mut slot, 0, &envelope::digest(&bytes), len, true, limit);
        slot[envelope::SLOT_HEADER_LEN..][..bytes.len()].copy_from_slice(&bytes);
        ctx.transport
            .all_gather_fixed(&slot, ctx.deadline())
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut ch = ctx.channel(ctx.timeout)?;
    match ch.exchange("f", &state(4)) {
        Err(Error::Decode { rank: Some(r), .. }) if r == odd => Ok(()),
        other => Err(format!(
            "expected a decode error naming rank {odd}, got {other:?}"
        )),
    }
}

/// As [`version_mismatch_named`] with the fast path off: the last rank sends
/// a whole envelope of version 99 (the header layout every version keeps,
/// then whatever that version carries); the others read its version from
/// the header and report the mismatch naming it.
fn version_mismatch_full_path(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    if ctx.rank() == odd {
        let mut bytes = envelope::Envelope {
            version: envelope::WIRE_VERSION,
            seq: 0,
            kind: "shape.frame_state".into(),
            key: "f".into(),
            config: String::new(),
            payload: vec![0xab; 40],
        }
        .encode(&envelope::Limits::default())
        .map_err(|e| e.to_string())?;
        bytes[4..6].copy_from_slice(&99u16.to_le_bytes());
        ctx.transport
            .all_gather(&bytes, 1 << 20, ctx.deadline())
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut ch = Channel::with_options(
        Arc::clone(&ctx.transport),
        ChannelOptions::default()
            .with_timeout(ctx.timeout)
            .with_fast_path(false),
    )
    .map_err(|e| e.to_string())?;
    let err = ch
        .exchange("f", &state(4))
        .err()
        .ok_or("a v99 envelope was accepted")?;
    let others: Vec<u32> = (0..odd).collect();
    ensure(matches!(err, Error::VersionMismatch { .. }), || {
        format!("{err}")
    })?;
    let ours = format!("v{}", envelope::WIRE_VERSION);
    expect_groups(&err, &[(&others, ours.as_str()), (&[odd], "v99")])
}

/// A frame state whose encoder is broken: it sends bytes that no
/// [`FrameState`] decodes (what a rank with a corrupting encoder, or memory
/// corruption before sending, would put on the wire), under the same kind.
/// It decodes what others send as a plain frame state.
#[derive(Clone, Debug)]
struct GarbledFrameState(FrameState);

impl serde::Serialize for GarbledFrameState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&[0xff; 9])
    }
}

impl<'de> serde::Deserialize<'de> for GarbledFrameState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        FrameState::deserialize(d).map(GarbledFrameState)
    }
}

impl compiler_collectives_core::Join for GarbledFrameState {
    const KIND: &'static str = <FrameState as compiler_collectives_core::Join>::KIND;
    fn join(&mut self, other: &Self) {
        compiler_collectives_core::Join::join(&mut self.0, &other.0);
    }
}

/// The last rank exchanges through a real channel with a broken encoder:
/// **every** rank, the sender included, gets a decode error naming it (each
/// rank decodes every rank's payload from the gathered bytes, so all take
/// the same branch). Ranks 1, 3, … join in place
/// (`Channel::exchange_in_place`), the others with `exchange`: the same
/// error either way, and a state joined in place is left as it was.
fn corrupt_payload_every_rank(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.timeout)?;
    let in_place = ctx.rank() % 2 == 1;
    let none = compiler_collectives_core::ExchangeOptions::default();
    let res = if ctx.rank() == odd {
        if in_place {
            let mut garbled = GarbledFrameState(state(4));
            ch.exchange_in_place("f", &mut garbled, &none).map(|_| ())
        } else {
            ch.exchange("f", &GarbledFrameState(state(4))).map(|_| ())
        }
    } else if in_place {
        let mut mine = state(4);
        let res = ch.exchange_in_place("f", &mut mine, &none).map(|_| ());
        ensure(mine == state(4), || {
            "the state joined in place changed on an error".into()
        })?;
        res
    } else {
        ch.exchange("f", &state(4)).map(|_| ())
    };
    match res {
        Err(e @ Error::Decode { rank: Some(r), .. }) if r == odd => {
            let text = e.to_string();
            ensure(text.contains(&format!("rank {odd}")), || text.clone())?;
            let four = state(4);
            let next = ch.exchange("f", &four);
            ensure(matches!(next, Err(Error::ChannelUnusable { .. })), || {
                format!("after a decode error: {next:?}")
            })
        }
        other => Err(format!(
            "expected a decode error naming rank {odd}, got {other:?}"
        )),
    }
}

/// The last rank arrives at exchange #1 two thirds of the way into the
/// short deadline: a slow rank inside the deadline is no error, and the
/// others really waited for it.
fn slow_rank_within_deadline(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.short_timeout)?;
    ch.exchange("f", &state(4)).map_err(|e| e.to_string())?;
    let delay = ctx.short_timeout * 2 / 3;
    if ctx.rank() == odd {
        std::thread::sleep(delay);
    }
    let start = Instant::now();
    let mine = state(4 + u64::from(ctx.rank()));
    let g = ch.exchange("f", &mine).map_err(|e| {
        format!(
            "a rank {delay:?} late inside a {:?} deadline: {e}",
            ctx.short_timeout
        )
    })?;
    let took = start.elapsed();
    ensure(g.merged().get("x").size.to_string() == "(Dyn,10)", || {
        format!("x = {}", g.merged().get("x"))
    })?;
    ensure(
        ctx.rank() == odd || took + Duration::from_millis(100) >= delay,
        || {
            format!(
                "rank {} returned after {took:?}, before the slow rank arrived",
                ctx.rank()
            )
        },
    )
}

fn unusable_after_error(ctx: &Ctx) -> Result<(), String> {
    let key = if ctx.rank() == 0 { "a" } else { "b" };
    let mut ch = ctx.channel(ctx.timeout)?;
    let first = ch.exchange(key, &AnyVote(false));
    ensure(matches!(first, Err(Error::Desync { .. })), || {
        format!("{first:?}")
    })?;
    let second = ch.exchange("a", &AnyVote(false));
    ensure(matches!(second, Err(Error::ChannelUnusable { .. })), || {
        format!("{second:?}")
    })
}

/// The last rank never arrives at exchange #1 (it stays alive, silent, past
/// the deadline): the others get a timeout naming it, within deadline + margin.
fn missing_rank_times_out(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.short_timeout)?;
    ch.exchange("f", &AnyVote(false))
        .map_err(|e| e.to_string())?;
    if ctx.rank() == odd {
        std::thread::sleep(ctx.short_timeout + ctx.margin + Duration::from_millis(500));
        ch.abort();
        return Ok(());
    }
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    match res {
        Err(Error::Timeout {
            missing_ranks,
            during: Some(info),
            ..
        }) => {
            ensure(missing_ranks == vec![odd], || {
                format!("missing {missing_ranks:?}, want [{odd}]")
            })?;
            ensure(info.seq == 1 && info.last_completed == Some(0), || {
                format!("{info}")
            })?;
            ensure(
                took >= ctx.short_timeout && took <= ctx.short_timeout + ctx.margin,
                || format!("failed after {took:?}, deadline {:?}", ctx.short_timeout),
            )
        }
        other => Err(format!(
            "expected a timeout naming rank {odd}, got {other:?}"
        )),
    }
}

/// The last rank shuts its channel down instead of exchanging: the others
/// fail at once (long before their 20 s deadline), naming it.
fn shutdown_fails_peers_fast(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.timeout)?;
    if ctx.rank() == odd {
        ch.shutdown().map_err(|e| e.to_string())?;
        return Ok(());
    }
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    match res {
        Err(Error::PeerLost { ranks, reason, .. }) => {
            ensure(ranks == vec![odd], || {
                format!("lost {ranks:?}, want [{odd}]")
            })?;
            ensure(reason == PeerLoss::Shutdown, || {
                format!("reason {reason:?}")
            })?;
            ensure(took < ctx.margin * 2, || format!("took {took:?}"))
        }
        other => Err(format!(
            "expected a lost peer naming rank {odd}, got {other:?}"
        )),
    }
}

/// The last rank shuts down at once, the one before it 400 ms later; the
/// others wait in an exchange. Their error names both, as shut down — the
/// exact set not in the exchange, not the first to go (docs/failures.md) — by the
/// deadline + margin, and soon after the second leaves on a backend that
/// tells peers it left.
fn two_ranks_leave_at_different_times(ctx: &Ctx) -> Result<(), String> {
    let (first, second) = (ctx.world() - 1, ctx.world() - 2);
    let later = Duration::from_millis(400);
    let mut ch = ctx.channel(ctx.short_timeout)?;
    if ctx.rank() == first {
        return ch.shutdown().map_err(|e| e.to_string());
    }
    if ctx.rank() == second {
        std::thread::sleep(later);
        return ch.shutdown().map_err(|e| e.to_string());
    }
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    let want = vec![second, first];
    match res {
        Err(e @ Error::PeerLost { .. }) => {
            ensure(e.missing_ranks() == want.as_slice(), || {
                format!("named {:?}, want {want:?}: {e}", e.missing_ranks())
            })?;
            let how = [(second, PeerLoss::Shutdown), (first, PeerLoss::Shutdown)];
            ensure(e.departures() == how, || {
                format!("{:?}: {e}", e.departures())
            })?;
            let bound = if ctx.transport.capabilities().tells_peers_it_left {
                later + ctx.margin
            } else {
                ctx.short_timeout + ctx.margin
            };
            ensure(took <= bound, || format!("took {took:?}, bound {bound:?}"))
        }
        other => Err(format!(
            "expected a lost peer naming ranks {want:?}, got {other:?}"
        )),
    }
}

/// Every rank but the last shuts its channel down and closes its transport
/// (its connections go); the last enters an exchange only a second later,
/// long after any notice a leaving rank waits to deliver. Its error still
/// names every other rank as shut down — not as disconnected, and not only
/// the first whose connection it found closed: the departures outlive the
/// connections (docs/failures.md, Exact missing-rank reports) — within the
/// deadline + margin.
fn late_rank_after_the_others_closed(ctx: &Ctx) -> Result<(), String> {
    let late = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.short_timeout)?;
    // One exchange with everyone first, so that the connections are in use.
    ch.exchange("warm", &AnyVote(false))
        .map_err(|e| format!("first exchange: {e}"))?;
    if ctx.rank() != late {
        return ch.shutdown().map_err(|e| e.to_string());
    }
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    let want: Vec<u32> = (0..late).collect();
    match res {
        Err(e @ Error::PeerLost { .. }) => {
            ensure(e.missing_ranks() == want.as_slice(), || {
                format!("named {:?}, want {want:?}: {e}", e.missing_ranks())
            })?;
            let how: Vec<(u32, PeerLoss)> = want.iter().map(|&r| (r, PeerLoss::Shutdown)).collect();
            ensure(e.departures() == how.as_slice(), || {
                format!("{:?}: {e}", e.departures())
            })?;
            let bound = ctx.short_timeout + ctx.margin;
            ensure(took <= bound, || format!("took {took:?}, bound {bound:?}"))
        }
        other => Err(format!(
            "expected a lost peer naming ranks {want:?}, got {other:?}"
        )),
    }
}

/// Rank 0 shuts its transport down (its connections go); a second later the
/// last rank receives from it, point to point, as the tree exchange does:
/// the error names rank 0 as shut down, within the deadline + margin.
fn recv_after_the_sender_closed(ctx: &Ctx) -> Result<(), String> {
    let late = ctx.world() - 1;
    let t = &ctx.transport;
    t.barrier(ctx.deadline())
        .map_err(|e| format!("barrier: {e}"))?;
    if ctx.rank() == 0 {
        return t.shutdown().map_err(|e| e.to_string());
    }
    if ctx.rank() != late {
        return Ok(());
    }
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let res = t.recv(0, 7, 64, Deadline::after(ctx.short_timeout));
    let took = start.elapsed();
    match res {
        Err(e @ Error::PeerLost { .. }) => {
            ensure(e.departures() == [(0, PeerLoss::Shutdown)], || {
                format!("{:?}: {e}", e.departures())
            })?;
            let bound = ctx.short_timeout + ctx.margin;
            ensure(took <= bound, || format!("took {took:?}, bound {bound:?}"))
        }
        other => Err(format!("expected rank 0 lost (shut down), got {other:?}")),
    }
}

/// Every operation on a transport this rank shut down fails at once with
/// `ChannelUnusable`, on every backend: nothing is sent, nothing waits.
fn use_after_shutdown_is_unusable(ctx: &Ctx) -> Result<(), String> {
    let t = &ctx.transport;
    t.shutdown().map_err(|e| e.to_string())?;
    let d = ctx.deadline();
    let start = Instant::now();
    let peer = (ctx.rank() + 1) % ctx.world();
    let mut results: Vec<(&str, Result<(), Error>)> = vec![
        ("all_gather", t.all_gather(b"x", 8, d).map(drop)),
        ("all_gather_fixed", t.all_gather_fixed(b"x", d).map(drop)),
        (
            "all_gather_sized",
            t.all_gather_sized(b"x", &vec![1; ctx.world() as usize], d)
                .map(drop),
        ),
        ("broadcast", t.broadcast(b"x", 0, 8, d).map(drop)),
        ("barrier", t.barrier(d)),
    ];
    if peer != ctx.rank() {
        results.push(("send", t.send(peer, 7, b"x", d)));
        results.push(("recv", t.recv(peer, 7, 8, d).map(drop)));
    }
    for (op, r) in results {
        ensure(matches!(r, Err(Error::ChannelUnusable { .. })), || {
            format!("{op} after shutdown: {r:?}")
        })?;
    }
    ensure(start.elapsed() < ctx.margin, || {
        format!("took {:?}", start.elapsed())
    })
}

/// The last rank aborts its channel (as after an error of its own): the
/// others fail at once naming it, with the reason `Aborted`, not `Shutdown`.
fn abort_is_not_a_shutdown(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.timeout)?;
    if ctx.rank() == odd {
        ch.abort();
        return Ok(());
    }
    let start = Instant::now();
    match ch.exchange("f", &AnyVote(false)) {
        Err(Error::PeerLost { ranks, reason, .. }) => {
            ensure(ranks == vec![odd], || {
                format!("lost {ranks:?}, want [{odd}]")
            })?;
            ensure(reason == PeerLoss::Aborted, || format!("reason {reason:?}"))?;
            ensure(start.elapsed() < ctx.margin * 2, || {
                format!("took {:?}", start.elapsed())
            })
        }
        other => Err(format!(
            "expected a lost peer naming rank {odd}, got {other:?}"
        )),
    }
}

/// The hierarchical (tree) exchange over this transport's send/recv gives the
/// flat exchange's result: merged values, fast path, desync text.
fn tree_exchange_matches_flat(ctx: &Ctx) -> Result<(), String> {
    let channel = |from: u32| {
        Channel::with_options(
            Arc::clone(&ctx.transport),
            ChannelOptions::default()
                .with_timeout(ctx.timeout)
                .with_hierarchical_from(from),
        )
        .map_err(|e| e.to_string())
    };
    let (mut tree, mut flat) = (channel(2)?, channel(u32::MAX)?);
    // The tree runs only over cheap point-to-point; elsewhere the channel
    // says why it stays flat.
    let want = if ctx.transport.capabilities().cheap_point_to_point {
        Topology::Tree
    } else {
        Topology::Flat(FlatReason::NoCheapPointToPoint {
            backend: ctx.transport.backend(),
        })
    };
    ensure(*tree.topology() == want, || {
        format!("tree channel: {:?}, want {want:?}", tree.topology())
    })?;
    let below = Topology::Flat(FlatReason::BelowHierarchicalFrom {
        world: ctx.world(),
        from: u32::MAX,
    });
    ensure(*flat.topology() == below, || {
        format!("flat channel: {:?}", flat.topology())
    })?;
    let local = state(5 + u64::from(ctx.rank()));
    for (ch, what) in [(&mut tree, "tree"), (&mut flat, "flat")] {
        let g = ch
            .exchange_with(
                "step",
                &local,
                &compiler_collectives_core::ExchangeOptions::default().with_config("cfg"),
            )
            .map_err(|e| format!("{what}: {e}"))?;
        ensure(!g.fast_path(), || {
            format!("{what}: fast path on differing states")
        })?;
        ensure(g.merged().get("x").size.to_string() == "(Dyn,10)", || {
            format!("{what}: merged {:?}", g.merged())
        })?;
        let eight = state(8);
        let same = ch
            .exchange_with(
                "step",
                &eight,
                &compiler_collectives_core::ExchangeOptions::default().with_config("cfg"),
            )
            .map_err(|e| format!("{what}: {e}"))?;
        ensure(same.fast_path() && *same.merged() == state(8), || {
            format!("{what}: identical states gave {:?}", same.merged())
        })?;
    }
    let key = if ctx.rank() + 1 == ctx.world() {
        "eval"
    } else {
        "train"
    };
    let text = |ch: &mut Channel| match ch.exchange(key, &local) {
        Ok(_) => Err("exchange under different compile keys succeeded".to_string()),
        Err(e) => Ok(e.to_string()),
    };
    let (t, f) = (text(&mut tree)?, text(&mut flat)?);
    ensure(t == f && t.contains("desync"), || {
        format!("tree: {t}\nflat: {f}")
    })
}
