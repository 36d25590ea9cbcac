//! `ccol run`: start N local ranks of a command, like
//! `torchrun --standalone --nproc-per-node N --no-python CMD ARGS...`.
//!
//! Each rank is one process of `CMD ARGS...` with torchrun's environment
//! (docs/environment.md, torchrun): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `GROUP_RANK=0`, `GROUP_WORLD_SIZE=1`, `ROLE_RANK`, `ROLE_WORLD_SIZE`,
//! `ROLE_NAME=default`, `MASTER_ADDR` (`--master-addr`, default
//! `127.0.0.1`), `MASTER_PORT` (the port of the launcher's store),
//! `TORCHELASTIC_RUN_ID` (`--run-id` or a fresh id),
//! `TORCHELASTIC_RESTART_COUNT=0`, `TORCHELASTIC_MAX_RESTARTS=0`,
//! `TORCHELASTIC_ERROR_FILE` (one per rank in a fresh temporary directory,
//! removed at the end), `TORCH_NCCL_ASYNC_ERROR_HANDLING` (inherited, else
//! `1`) and `TORCHELASTIC_USE_AGENT_STORE=True`: as torchrun's agent, the
//! launcher serves a TCPStore (compiler-collectives-tcpstore's server, which
//! torch's clients speak to) on `MASTER_ADDR:MASTER_PORT` for as long as it
//! runs, so ranks of every backend (and `init_process_group`) rendezvous
//! through it. `--master-port 0` or none lets the system pick the port (no
//! port is probed and given up first). The store has no authentication:
//! keep `--master-addr` on an interface only the job's hosts reach.
//!
//! Behaviour:
//! - Every line a rank writes is forwarded with a `[rank R] ` prefix, stdout
//!   to stdout and stderr to stderr, whole lines at a time. Lines longer than
//!   [`MAX_LINE_BYTES`] are split, so memory stays bounded whatever a rank
//!   prints. Ranks get `/dev/null` as stdin.
//! - Each rank runs in its own process group, so that stopping a rank also
//!   stops what it started (a `sh -c` wrapper's children). When every rank
//!   has exited but something a rank started still holds its output, the
//!   launcher waits 2 s, then sends that process group SIGTERM and exits.
//! - When a rank exits non-zero or is killed by a signal, the others get
//!   SIGTERM, then SIGKILL after the grace period (`--grace-period`, 5 s).
//!   The launcher then says which rank failed first and how, prints the
//!   message from its error file when it wrote one, and exits with the rank's
//!   exit code (1 when that is not in 1..=255, e.g. a signal).
//! - Ctrl-C, SIGTERM or SIGHUP to the launcher stop the ranks the same way
//!   (a second one skips the grace period) and the launcher exits 130.
//! - A command that cannot be started exits 2, as do bad arguments.
//!
//! Known gap: a launcher killed by SIGKILL cannot stop its ranks; they run on
//! until they fail to reach their peers (no parent-death signal is set, as
//! that would need `unsafe` in a `pre_exec` hook).

use clap::Args;
use compiler_collectives::launch::torchelastic::{read_error_file, ERROR_FILE_ENV};
use compiler_collectives::protocol::parse_timeout_secs;
use compiler_collectives::tcpstore::{ServerOptions, TcpStoreServer};
use std::ffi::OsString;
use std::io::{self, BufRead as _, BufReader, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The most ranks `--nproc-per-node` accepts.
const MAX_NPROC: u32 = 1024;
/// The longest line forwarded whole (bytes, without its newline); longer
/// ones are split.
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;
/// How often the launcher looks at its ranks.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for ranks' output to close once every rank has exited.
const DRAIN: Duration = Duration::from_secs(2);
/// Exit code of bad arguments or a command that cannot be started.
const EXIT_USAGE: u8 = 2;
/// Exit code after Ctrl-C / SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

/// Ctrl-C / SIGTERM / SIGHUP received by the launcher, counted.
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Arguments of `ccol run`.
#[derive(Args, Debug)]
pub(crate) struct LaunchArgs {
    /// Number of ranks to start on this machine.
    #[arg(
        long = "nproc-per-node",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_NPROC))
    )]
    nproc_per_node: u32,
    /// TORCHELASTIC_RUN_ID of the job (default: a fresh unique id).
    #[arg(long, value_name = "ID")]
    run_id: Option<String>,
    /// MASTER_ADDR of the job: the address the launcher's TCPStore listens
    /// on and ranks reach it at (default 127.0.0.1).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    master_addr: String,
    /// MASTER_PORT of the job: the port of the launcher's TCPStore (default:
    /// one the system picks).
    #[arg(long, value_name = "P")]
    master_port: Option<u16>,
    /// Seconds between SIGTERM and SIGKILL when stopping ranks.
    #[arg(long, value_name = "S", default_value = "5", value_parser = parse_grace)]
    grace_period: Duration,
    /// Seconds to let the other ranks run on after the first failure before
    /// stopping them, so that they can report what they saw (default 0).
    #[arg(long, value_name = "S", value_parser = parse_grace)]
    stop_delay: Option<Duration>,
    /// The command each rank runs, and its arguments (put `--` before them
    /// when they start with `-`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD",
        value_parser = clap::value_parser!(OsString)
    )]
    command: Vec<OsString>,
}

fn parse_grace(text: &str) -> Result<Duration, String> {
    parse_timeout_secs(text).map_err(|e| e.to_string())
}

/// How a rank ended.
#[derive(Debug, Clone)]
enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// The launcher lost track of it (waiting failed).
    Unknown(String),
}

impl Exit {
    fn from_status(status: ExitStatus) -> Exit {
        if let Some(code) = status.code() {
            return Exit::Code(code);
        }
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt as _;
            if let Some(sig) = status.signal() {
                return Exit::Signal(sig);
            }
        }
        Exit::Unknown(status.to_string())
    }

    fn success(&self) -> bool {
        matches!(self, Exit::Code(0))
    }

    /// The launcher's exit code for this failure: the rank's own code when it
    /// is in 1..=255, else 1.
    fn launcher_code(&self) -> u8 {
        match self {
            Exit::Code(c) => u8::try_from(*c).ok().filter(|&c| c != 0).unwrap_or(1),
            _ => 1,
        }
    }

    fn describe(&self) -> String {
        match self {
            Exit::Code(c) => format!("exited with code {c}"),
            Exit::Signal(s) => format!("was killed by signal {s}{}", signal_name(*s)),
            Exit::Unknown(why) => format!("ended in an unknown way ({why})"),
        }
    }
}

#[cfg(unix)]
fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| format!(" ({})", s.as_str()))
        .unwrap_or_default()
}

#[cfg(not(unix))]
fn signal_name(_sig: i32) -> String {
    String::new()
}

/// One started rank.
#[derive(Debug)]
struct RankProc {
    rank: u32,
    child: Child,
    exit: Option<Exit>,
    /// Output streams (stdout, stderr) not yet at end of file.
    open_streams: u8,
    error_file: PathBuf,
}

/// Which signal to send when stopping ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Term,
    Kill,
}

/// Sends `how` to the rank's whole process group; falls back to
/// `Child::kill` where that is not possible.
fn signal_rank(p: &mut RankProc, how: Stop) {
    #[cfg(unix)]
    {
        use nix::sys::signal::{killpg, Signal};
        use nix::unistd::Pid;
        if let Ok(pid) = i32::try_from(p.child.id()) {
            let sig = match how {
                Stop::Term => Signal::SIGTERM,
                Stop::Kill => Signal::SIGKILL,
            };
            if killpg(Pid::from_raw(pid), sig).is_ok() {
                return;
            }
        }
    }
    if how == Stop::Kill && p.exit.is_none() {
        let _ = p.child.kill();
    }
}

/// Counts SIGINT, SIGTERM and SIGHUP in [`INTERRUPTS`], whatever handler the
/// launcher inherited (a background job starts with SIGINT ignored). The
/// handlers are installed once per process; later calls return the first
/// call's outcome.
fn count_interrupts() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| install_interrupt_counter().map_err(|e| e.to_string()))
        .clone()
        .map_err(io::Error::other)
}

fn install_interrupt_counter() -> io::Result<()> {
    #[cfg(unix)]
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        // SAFETY: the action only increments an atomic counter, which is
        // async-signal-safe; it allocates, locks and panics nothing.
        unsafe {
            signal_hook::low_level::register(sig, || {
                INTERRUPTS.fetch_add(1, Ordering::SeqCst);
            })
        }?;
    }
    Ok(())
}

/// Runs `cmd` (a `ccol run` launcher started by `ccol demo` or `ccol bench`)
/// to its end in its own process group, and passes each Ctrl-C, SIGTERM or
/// SIGHUP this process gets on to it as one SIGTERM: it then stops its ranks
/// (a second one makes it kill them at once) and exits, so that the caller
/// can remove its temporary files. (In its own process group, the launcher
/// does not also get the terminal's Ctrl-C, which would count twice.)
/// Returns the launcher's status and whether this process was interrupted.
///
/// # Errors
/// The launcher cannot be started or waited for (it is killed then).
pub(crate) fn run_launcher(cmd: &mut Command) -> io::Result<(ExitStatus, bool)> {
    if let Err(e) = count_interrupts() {
        eprintln!("ccol: warning: cannot handle Ctrl-C/SIGTERM ({e}); ranks may outlive ccol");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        cmd.process_group(0);
    }
    let mut child = cmd.spawn()?;
    let mut forwarded = 0;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok((status, forwarded > 0)),
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        }
        let received = INTERRUPTS.load(Ordering::SeqCst);
        while forwarded < received {
            terminate(&mut child);
            forwarded += 1;
        }
        std::thread::sleep(POLL);
    }
}

/// Whether Ctrl-C, SIGTERM or SIGHUP arrived since [`run_launcher`] first
/// installed its handlers (which replace the default of ending the process).
pub(crate) fn interrupted() -> bool {
    INTERRUPTS.load(Ordering::SeqCst) > 0
}

/// Sends SIGTERM to `child` (the process, not its group: a launcher stops
/// its ranks itself); `Child::kill` where signals are not available.
fn terminate(child: &mut Child) {
    #[cfg(unix)]
    {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            return;
        }
    }
    let _ = child.kill();
}

/// Runs `ccol run`; returns the launcher's exit code.
pub(crate) fn run(args: &LaunchArgs) -> ExitCode {
    let Some(program) = args.command.first() else {
        eprintln!("ccol run: no command given");
        return ExitCode::from(EXIT_USAGE);
    };
    let store = match TcpStoreServer::bind(
        (args.master_addr.as_str(), args.master_port.unwrap_or(0)),
        ServerOptions::default(),
    ) {
        Ok(s) => s,
        Err(e) => {
            let port = args
                .master_port
                .map_or("any port".to_owned(), |p| p.to_string());
            eprintln!(
                "ccol run: cannot serve the job's TCPStore on {}:{port}: {e}",
                args.master_addr
            );
            return ExitCode::FAILURE;
        }
    };
    let port = store.port();
    if args.run_id.as_deref().is_some_and(str::is_empty) {
        eprintln!("ccol run: --run-id must not be empty");
        return ExitCode::from(EXIT_USAGE);
    }
    let run_id = args.run_id.clone().unwrap_or_else(fresh_run_id);
    let dir = match tempfile::Builder::new().prefix("ccol-run-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ccol run: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = count_interrupts() {
        eprintln!(
            "ccol run: warning: cannot handle Ctrl-C/SIGTERM ({e}); ranks may outlive the launcher"
        );
    }

    let world = args.nproc_per_node;
    let nccl_async =
        std::env::var_os("TORCH_NCCL_ASYNC_ERROR_HANDLING").unwrap_or_else(|| "1".into());
    let (done_tx, done_rx) = mpsc::channel::<usize>();
    let mut ranks: Vec<RankProc> = Vec::new();
    let mut launch_failure: Option<u8> = None;
    for rank in 0..world {
        let rank_dir = dir.path().join(rank.to_string());
        let error_file = rank_dir.join("error.json");
        if let Err(e) = std::fs::create_dir(&rank_dir) {
            eprintln!("ccol run: cannot create {}: {e}", rank_dir.display());
            launch_failure = Some(1);
            break;
        }
        let mut cmd = Command::new(program);
        cmd.args(&args.command[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("GROUP_RANK", "0")
            .env("GROUP_WORLD_SIZE", "1")
            .env("ROLE_RANK", rank.to_string())
            .env("ROLE_WORLD_SIZE", world.to_string())
            .env("ROLE_NAME", "default")
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", &run_id)
            .env("TORCHELASTIC_RESTART_COUNT", "0")
            .env("TORCHELASTIC_MAX_RESTARTS", "0")
            .env(ERROR_FILE_ENV, &error_file)
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", &nccl_async)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt as _;
            cmd.process_group(0);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "ccol run: cannot start '{}' for rank {rank}: {e}",
                    program.to_string_lossy()
                );
                launch_failure = Some(EXIT_USAGE);
                break;
            }
        };
        let index = ranks.len();
        let mut open_streams = 0;
        if let Some(out) = child.stdout.take() {
            open_streams += u8::from(spawn_forwarder(rank, index, out, Sink::Stdout, &done_tx));
        }
        if let Some(err) = child.stderr.take() {
            open_streams += u8::from(spawn_forwarder(rank, index, err, Sink::Stderr, &done_tx));
        }
        ranks.push(RankProc {
            rank,
            child,
            exit: None,
            open_streams,
            error_file,
        });
        if open_streams < 2 {
            eprintln!("ccol run: cannot start the output thread of rank {rank}");
            launch_failure = Some(1);
            break;
        }
    }
    drop(done_tx);

    let outcome = supervise(
        &mut ranks,
        &done_rx,
        args.grace_period,
        args.stop_delay.unwrap_or(Duration::ZERO),
        launch_failure.is_some(),
    );
    let code = report(&ranks, &outcome, launch_failure);
    drop(dir);
    // The store goes last: every rank has exited, their departure keys
    // written.
    drop(store);
    code
}

/// What happened while supervising.
#[derive(Debug, Default)]
struct Outcome {
    /// Ranks (indices) that failed before the launcher stopped anything, in
    /// the order it saw them.
    failures: Vec<usize>,
    /// Ranks (indices) still running when the launcher began stopping.
    stopped: Vec<usize>,
    /// The launcher was interrupted (Ctrl-C, SIGTERM, SIGHUP).
    interrupted: bool,
}

/// Waits for every rank; stops them all at the first failure, interrupt or
/// launch failure; waits for their output to close (bounded).
fn supervise(
    ranks: &mut [RankProc],
    done_rx: &mpsc::Receiver<usize>,
    grace: Duration,
    stop_delay: Duration,
    mut stop_now: bool,
) -> Outcome {
    let mut outcome = Outcome::default();
    // When SIGTERM went out, and whether SIGKILL followed (and when).
    let mut termed_at: Option<Instant> = None;
    let mut killed_at: Option<Instant> = None;
    let mut all_exited_at: Option<Instant> = None;
    let mut failed_at: Option<Instant> = None;
    loop {
        while let Ok(i) = done_rx.try_recv() {
            if let Some(p) = ranks.get_mut(i) {
                p.open_streams = p.open_streams.saturating_sub(1);
            }
        }
        for (i, p) in ranks.iter_mut().enumerate() {
            if p.exit.is_some() {
                continue;
            }
            let exit = match p.child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => Exit::from_status(status),
                Err(e) => {
                    let _ = p.child.kill();
                    Exit::Unknown(e.to_string())
                }
            };
            if !exit.success() && termed_at.is_none() {
                outcome.failures.push(i);
            }
            p.exit = Some(exit);
        }
        if INTERRUPTS.load(Ordering::SeqCst) > 0 && termed_at.is_none() {
            outcome.interrupted = true;
            stop_now = true;
        }
        if !outcome.failures.is_empty() {
            let at = *failed_at.get_or_insert_with(Instant::now);
            if Instant::now() >= at + stop_delay {
                stop_now = true;
            }
        }
        let now = Instant::now();
        if stop_now && termed_at.is_none() {
            outcome.stopped = (0..ranks.len())
                .filter(|&i| ranks[i].exit.is_none())
                .collect();
            signal_all(ranks, Stop::Term);
            termed_at = Some(now);
        }
        if let (Some(t), None) = (termed_at, killed_at) {
            if now >= t + grace || INTERRUPTS.load(Ordering::SeqCst) > 1 {
                signal_all(ranks, Stop::Kill);
                killed_at = Some(now);
            }
        }
        if ranks.iter().all(|p| p.exit.is_some()) {
            let exited_at = *all_exited_at.get_or_insert(now);
            if ranks.iter().all(|p| p.open_streams == 0) {
                break;
            }
            // Output still open after every rank exited: something a rank
            // started still holds it. Wait a little, then leave it.
            let give_up = match (termed_at, killed_at) {
                (None, _) => now >= exited_at + DRAIN,
                (Some(_), Some(k)) => now >= k + DRAIN,
                (Some(_), None) => false,
            };
            if give_up {
                for p in ranks.iter().filter(|p| p.open_streams > 0) {
                    eprintln!(
                        "ccol run: rank {}'s output is still open after it exited \
                         (a process it started?); not waiting for it",
                        p.rank
                    );
                }
                if killed_at.is_none() {
                    // Its output has nowhere to go once the launcher exits.
                    signal_all(ranks, Stop::Term);
                }
                break;
            }
        }
        std::thread::sleep(POLL);
    }
    outcome
}

/// Signals every rank still running, and the process groups of exited ranks
/// whose output is still open (something they started is still alive).
fn signal_all(ranks: &mut [RankProc], how: Stop) {
    for p in ranks.iter_mut() {
        if p.exit.is_none() || p.open_streams > 0 {
            signal_rank(p, how);
        }
    }
}

/// Prints the summary and picks the exit code.
fn report(ranks: &[RankProc], outcome: &Outcome, launch_failure: Option<u8>) -> ExitCode {
    let mut failed = outcome.failures.iter().filter_map(|&i| ranks.get(i));
    if let Some(first) = failed.next() {
        let exit = first
            .exit
            .clone()
            .unwrap_or(Exit::Unknown("still running".into()));
        eprintln!(
            "ccol run: rank {} failed first: it {} (pid {})",
            first.rank,
            exit.describe(),
            first.child.id()
        );
        print_error_file(first.rank, &first.error_file);
        for p in failed {
            if let Some(e) = &p.exit {
                eprintln!("ccol run: rank {} also failed: it {}", p.rank, e.describe());
                print_error_file(p.rank, &p.error_file);
            }
        }
        print_stopped(ranks, outcome);
        return ExitCode::from(launch_failure.unwrap_or_else(|| exit.launcher_code()));
    }
    if let Some(code) = launch_failure {
        print_stopped(ranks, outcome);
        return ExitCode::from(code);
    }
    if outcome.interrupted {
        eprintln!("ccol run: interrupted");
        print_stopped(ranks, outcome);
        return ExitCode::from(EXIT_INTERRUPTED);
    }
    ExitCode::SUCCESS
}

fn print_stopped(ranks: &[RankProc], outcome: &Outcome) {
    let stopped: Vec<u32> = outcome
        .stopped
        .iter()
        .filter_map(|&i| ranks.get(i))
        .map(|p| p.rank)
        .collect();
    if !stopped.is_empty() {
        eprintln!(
            "ccol run: stopped {} {stopped:?}",
            crate::ranks_word(&stopped)
        );
    }
}

/// Prints what a rank wrote to its TORCHELASTIC_ERROR_FILE, if anything.
fn print_error_file(rank: u32, path: &Path) {
    match read_error_file(path) {
        Ok(None) => {}
        Ok(Some(reported)) => {
            eprintln!("ccol run: rank {rank} error: {}", reported.message);
            if let Some(stack) = reported.callstack.filter(|s| *s != reported.message) {
                let rest = stack
                    .strip_prefix(reported.message.as_str())
                    .unwrap_or(&stack);
                for line in rest.lines().filter(|l| !l.is_empty()) {
                    eprintln!("    {line}");
                }
            }
        }
        Err(e) => eprintln!("ccol run: rank {rank}'s error file is unreadable: {e}"),
    }
}

/// Where a forwarder writes.
#[derive(Debug, Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

/// Starts a thread that forwards `src` line by line with the rank prefix and
/// sends `index` on `done` at end of file. Returns whether it started.
fn spawn_forwarder(
    rank: u32,
    index: usize,
    src: impl Read + Send + 'static,
    sink: Sink,
    done: &mpsc::Sender<usize>,
) -> bool {
    let done = done.clone();
    let prefix = format!("[rank {rank}] ");
    std::thread::Builder::new()
        .name(format!("rank{rank}-{sink:?}").to_lowercase())
        .spawn(move || {
            forward_lines(src, MAX_LINE_BYTES, |line| emit(&prefix, line, sink));
            let _ = done.send(index);
        })
        .is_ok()
}

/// Calls `emit` with each line of `src`, without its newline; a line longer
/// than `max_line` bytes comes in pieces of `max_line` bytes (the last piece
/// shorter). A last line without a newline is emitted too. Memory use is
/// bounded by `max_line` plus the reader's buffer. A read error ends the
/// stream.
pub(crate) fn forward_lines(src: impl Read, max_line: usize, mut emit: impl FnMut(&[u8])) {
    let max_line = max_line.max(1);
    let mut reader = BufReader::with_capacity(16 * 1024, src);
    let mut line: Vec<u8> = Vec::new();
    loop {
        let chunk = match reader.fill_buf() {
            Ok([]) => break,
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // Bytes the line can still take; its newline may come right after.
        let room = max_line - line.len();
        let window = &chunk[..chunk.len().min(room + 1)];
        if let Some(i) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&window[..i]);
            reader.consume(i + 1);
            emit(&line);
            line.clear();
        } else {
            let take = window.len().min(room);
            line.extend_from_slice(&window[..take]);
            reader.consume(take);
            if line.len() == max_line {
                emit(&line);
                line.clear();
            }
        }
    }
    if !line.is_empty() {
        emit(&line);
    }
}

/// Writes `prefix`, `line` and a newline to the sink in one locked write, so
/// lines of different ranks never interleave. Write errors (a closed pipe) are
/// ignored: the rank's output is still drained.
fn emit(prefix: &str, line: &[u8], sink: Sink) {
    let mut out = Vec::with_capacity(prefix.len() + line.len() + 1);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(line);
    out.push(b'\n');
    let _ = match sink {
        Sink::Stdout => {
            let mut s = io::stdout().lock();
            s.write_all(&out).and_then(|()| s.flush())
        }
        Sink::Stderr => {
            let mut s = io::stderr().lock();
            s.write_all(&out).and_then(|()| s.flush())
        }
    };
}

/// A run id unique on this machine: the launcher's pid and the time.
fn fresh_run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("ccol-{}-{nanos:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<String> {
        let mut out = Vec::new();
        forward_lines(input, max, |l| {
            out.push(String::from_utf8_lossy(l).into_owned());
        });
        out
    }

    #[test]
    fn splits_lines_and_caps_their_length() {
        let check = |input: &str, max: usize, expect: &[&str]| {
            assert_eq!(lines(input.as_bytes(), max), expect, "{input:?} max {max}");
        };
        check("", 8, &[]);
        check("a\nb\n", 8, &["a", "b"]);
        check("a\n\nb", 8, &["a", "", "b"]);
        check("no newline", 64, &["no newline"]);
        check("abcdefgh\n", 4, &["abcd", "efgh"]);
        check("abcdefghi", 4, &["abcd", "efgh", "i"]);
        check(
            "abc\nabcdefghij\nz\n",
            4,
            &["abc", "abcd", "efgh", "ij", "z"],
        );
        check("x\r\n", 8, &["x\r"]);
    }

    #[test]
    fn long_input_keeps_every_byte() {
        let input: Vec<u8> = (0..200_000u32)
            .map(|i| if i % 1000 == 999 { b'\n' } else { b'x' })
            .collect();
        let got = lines(&input, 100);
        let total: usize = got.iter().map(String::len).sum();
        assert_eq!(total + 200, input.len()); // 200 newlines dropped
        assert!(got.iter().all(|l| l.len() <= 100));
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Exit::Code(7).launcher_code(), 7);
        assert_eq!(Exit::Code(255).launcher_code(), 255);
        assert_eq!(Exit::Code(256).launcher_code(), 1);
        assert_eq!(Exit::Code(-1).launcher_code(), 1);
        assert_eq!(Exit::Signal(9).launcher_code(), 1);
        assert!(Exit::Signal(9).describe().contains("SIGKILL"));
    }
}
