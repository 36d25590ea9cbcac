//! Rank processes under a hard limit: started, read on threads, killed at
//! the limit.
//!
//! A hung rank is exactly what the conformance suite exists to catch, so
//! nothing here blocks on a rank: each rank's stdout and stderr are read by
//! threads of their own into a shared line list, [`Ranks::wait_line`] waits
//! on that list with a bound, and [`Ranks::finish`] polls the processes
//! until they exit or the case's limit passes, then kills whatever still
//! runs and reports it with everything every rank printed. Dropping
//! [`Ranks`] kills every rank still running, so an early return leaves no
//! process behind.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How many of a rank's last lines a failure message shows.
const SHOWN_LINES: usize = 60;
/// How long [`Ranks::finish`] waits for a dead rank's pipes to close (a
/// grandchild may hold them open).
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// The lines one rank printed so far, and how many of its streams are open.
#[derive(Debug, Default)]
struct Output {
    state: Mutex<OutputState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct OutputState {
    lines: Vec<String>,
    open: usize,
}

impl Output {
    fn lock(&self) -> std::sync::MutexGuard<'_, OutputState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self) -> Vec<String> {
        self.lock().lines.clone()
    }
}

/// Reads `stream` line by line into `out` (stderr lines marked), on a
/// thread of its own, until EOF.
fn read_into(stream: impl Read + Send + 'static, out: Arc<Output>, stderr: bool) {
    out.lock().open += 1;
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let line = if stderr {
                format!("[stderr] {line}")
            } else {
                line
            };
            out.lock().lines.push(line);
            out.changed.notify_all();
        }
        out.lock().open -= 1;
        out.changed.notify_all();
    });
}

#[derive(Debug)]
struct RankProcess {
    child: Child,
    output: Arc<Output>,
    exited: Option<Option<i32>>,
}

/// Rank processes of one case, with their output read on threads.
#[derive(Debug)]
pub struct Ranks {
    procs: Vec<RankProcess>,
    started: Instant,
    /// Ask with SIGTERM first (a launcher such as torchrun then stops its
    /// own children), SIGKILL after [`TERM_GRACE`].
    terminate_first: bool,
}

/// How long a process asked to stop with SIGTERM gets before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// What one rank process printed and how it ended.
#[derive(Debug, Clone)]
pub struct RankResult {
    /// Exit code (`None`: killed by a signal, by the driver at the limit
    /// among others).
    pub code: Option<i32>,
    /// Its stdout lines, and its stderr lines prefixed `[stderr] `, in the
    /// order they were read.
    pub lines: Vec<String>,
    /// Whether it was still running at the case's limit (and was killed).
    pub killed_at_limit: bool,
}

impl RankResult {
    /// Whether it exited 0 having printed `line`.
    pub fn ok_with(&self, line: &str) -> bool {
        self.code == Some(0) && self.lines.iter().any(|l| l == line)
    }
}

/// How a case's ranks ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Each rank's result, index = rank.
    pub ranks: Vec<RankResult>,
    /// The limit the case ran under.
    pub limit: Duration,
    /// From the start of the ranks to the end of the wait.
    pub elapsed: Duration,
}

impl Finished {
    /// The ranks killed at the limit.
    pub fn killed(&self) -> Vec<usize> {
        (0..self.ranks.len())
            .filter(|&r| self.ranks[r].killed_at_limit)
            .collect()
    }

    /// What every rank printed, for a failure message: its exit and its
    /// last lines.
    pub fn describe(&self) -> String {
        self.ranks
            .iter()
            .enumerate()
            .map(|(r, res)| {
                let how = if res.killed_at_limit {
                    "killed at the limit".to_owned()
                } else {
                    match res.code {
                        Some(c) => format!("exit {c}"),
                        None => "killed by a signal".to_owned(),
                    }
                };
                let skip = res.lines.len().saturating_sub(SHOWN_LINES);
                let n = res.lines.len();
                let mut text = format!(
                    "rank {r} ({how}), {n} line{}",
                    if n == 1 { "" } else { "s" }
                );
                if skip > 0 {
                    text.push_str(&format!(" (first {skip} not shown)"));
                }
                for l in &res.lines[skip..] {
                    text.push_str("\n  | ");
                    text.push_str(l);
                }
                text
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `Err` naming the ranks killed at the limit, with every rank's output.
    ///
    /// # Errors
    /// When a rank was still running at the limit.
    pub fn within_limit(&self) -> Result<(), String> {
        let killed = self.killed();
        if killed.is_empty() {
            return Ok(());
        }
        Err(format!(
            "hung: rank(s) {killed:?} still running at the case's limit of {} ms were killed \
             ({} ms after the start); what every rank printed:\n{}",
            self.limit.as_millis(),
            self.elapsed.as_millis(),
            self.describe()
        ))
    }
}

impl Ranks {
    /// Starts one process per command, index = rank, with stdout and
    /// stderr piped and read on threads.
    ///
    /// # Errors
    /// When a process cannot be started (the ones started are killed).
    pub fn start(commands: Vec<Command>) -> Result<Self, String> {
        let mut ranks = Ranks {
            procs: Vec::new(),
            started: Instant::now(),
            terminate_first: false,
        };
        for (r, mut c) in commands.into_iter().enumerate() {
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = c
                .spawn()
                .map_err(|e| format!("cannot start rank {r} ({:?}): {e}", c.get_program()))?;
            let output = Arc::new(Output::default());
            if let Some(out) = child.stdout.take() {
                read_into(out, Arc::clone(&output), false);
            }
            if let Some(err) = child.stderr.take() {
                read_into(err, Arc::clone(&output), true);
            }
            ranks.procs.push(RankProcess {
                child,
                output,
                exited: None,
            });
        }
        Ok(ranks)
    }

    /// The number of ranks.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Rank `rank`'s process (to strike it in a fault trial).
    ///
    /// # Panics
    /// When `rank` is out of range (a harness bug).
    pub fn child_mut(&mut self, rank: usize) -> &mut Child {
        &mut self.procs[rank].child
    }

    /// What rank `rank` printed so far.
    pub fn lines(&self, rank: usize) -> Vec<String> {
        self.procs
            .get(rank)
            .map(|p| p.output.snapshot())
            .unwrap_or_default()
    }

    /// Waits until rank `rank` prints a line for which `want` holds and
    /// returns it; `None` when its output closes first or `limit` passes.
    pub fn wait_line(
        &self,
        rank: usize,
        limit: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Option<String> {
        let out = &self.procs.get(rank)?.output;
        let until = Instant::now() + limit;
        let mut state = out.lock();
        loop {
            if let Some(l) = state.lines.iter().find(|l| want(l)) {
                return Some(l.clone());
            }
            let now = Instant::now();
            if state.open == 0 || now >= until {
                return None;
            }
            state = out
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits for every rank to exit, for at most `limit` from the start of
    /// the ranks; kills those still running then. See [`Ranks::finish_some`].
    pub fn finish(self, limit: Duration) -> Finished {
        self.finish_some(limit, |_| true)
    }

    /// Waits for the ranks for which `wait_for` holds to exit, for at most
    /// `limit` from the start of the ranks; then kills every rank still
    /// running (those waited for are marked killed at the limit), and
    /// collects what each printed.
    pub fn finish_some(mut self, limit: Duration, wait_for: impl Fn(usize) -> bool) -> Finished {
        let until = self.started + limit;
        loop {
            let mut pending = false;
            for (r, p) in self.procs.iter_mut().enumerate() {
                if p.exited.is_none() {
                    if let Ok(Some(status)) = p.child.try_wait() {
                        p.exited = Some(status.code());
                    } else if wait_for(r) {
                        pending = true;
                    }
                }
            }
            if !pending || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let elapsed = self.started.elapsed();
        if self.terminate_first {
            self.terminate();
        }
        let mut ranks = Vec::with_capacity(self.procs.len());
        for (r, p) in self.procs.iter_mut().enumerate() {
            let killed_at_limit = p.exited.is_none() && wait_for(r);
            if p.exited.is_none() {
                let _ = p.child.kill();
                p.exited = Some(p.child.wait().ok().and_then(|s| s.code()));
            }
            ranks.push((p.exited.flatten(), killed_at_limit));
        }
        // The pipes close when the processes are gone (unless a grandchild
        // holds them): take what was read by then.
        let grace = Instant::now() + PIPE_GRACE;
        let results = self
            .procs
            .iter()
            .zip(ranks)
            .map(|(p, (code, killed_at_limit))| {
                let mut state = p.output.lock();
                while state.open > 0 && Instant::now() < grace {
                    state = p
                        .output
                        .changed
                        .wait_timeout(state, grace.saturating_duration_since(Instant::now()))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                RankResult {
                    code,
                    lines: state.lines.clone(),
                    killed_at_limit,
                }
            })
            .collect();
        Finished {
            ranks: results,
            limit,
            elapsed,
        }
    }
}

impl Ranks {
    /// Sends SIGTERM to every process still running and waits up to
    /// [`TERM_GRACE`] for them to exit.
    fn terminate(&mut self) {
        let mut any = false;
        for p in &mut self.procs {
            if p.exited.is_none() && matches!(p.child.try_wait(), Ok(None)) {
                any = true;
                let _ = Command::new("kill")
                    .args(["-TERM", &p.child.id().to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let until = Instant::now() + TERM_GRACE;
        while any && Instant::now() < until {
            any = self
                .procs
                .iter_mut()
                .any(|p| p.exited.is_none() && matches!(p.child.try_wait(), Ok(None)));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if p.exited.is_none() {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

/// Runs one command under `limit` (its output read on threads; at the
/// limit asked to stop with SIGTERM, then killed), for tests that start a
/// single process such as `torchrun` or `ccol run`.
///
/// # Errors
/// When it cannot be started.
pub fn run_within(command: Command, limit: Duration) -> Result<RankResult, String> {
    let mut ranks = Ranks::start(vec![command])?;
    ranks.terminate_first = true;
    let mut finished = ranks.finish(limit);
    Ok(finished.ranks.remove(0))
}

/// `Command::output` with a hard limit, for tests that run one program to
/// its end (`ccol …`, a Python helper): stdout and stderr are read on
/// threads; a program still running at the limit is asked to stop with
/// SIGTERM (so a launcher stops its ranks), killed after 5 s, and the call
/// fails with what it printed — a test then fails instead of hanging.
pub trait OutputWithin {
    /// Runs the command to its end within `limit`.
    ///
    /// # Errors
    /// When it cannot be started, or (kind `TimedOut`) when it was still
    /// running at `limit`.
    fn output_within(&mut self, limit: Duration) -> std::io::Result<std::process::Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<std::process::Output> {
        self.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = self.spawn()?;
        let read = |s: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut s) = s {
                    let _ = s.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = read(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let err = read(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let start = Instant::now();
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if start.elapsed() >= limit {
                timed_out = true;
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                let until = Instant::now() + TERM_GRACE;
                while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // A grandchild may hold the pipes open: take what was read by then.
        let join = |h: std::thread::JoinHandle<Vec<u8>>| {
            let until = Instant::now() + PIPE_GRACE;
            while !h.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            if h.is_finished() {
                h.join().unwrap_or_default()
            } else {
                b"(output still open: a child of it holds the pipe)".to_vec()
            }
        };
        let (stdout, stderr) = (join(out), join(err));
        if timed_out {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "hung: {:?} still running after its limit of {} ms was stopped; stdout:\n{}\nstderr:\n{}",
                    self.get_program(),
                    limit.as_millis(),
                    String::from_utf8_lossy(&stdout),
                    String::from_utf8_lossy(&stderr)
                ),
            ));
        }
        Ok(std::process::Output {
            status,
            stdout,
            stderr,
        })
    }
}
