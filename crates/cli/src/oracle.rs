//! The PyTorch oracle, from the command line.
//!
//! - `ccol scenario compare PATH... [--mode M]...` runs each scenario file
//!   through ccol's runner (in-process ranks, as `ccol scenario run --json`)
//!   and through real PyTorch Dynamo (`tests/pytorch-oracle/harness.py`:
//!   CPU ranks joined by Gloo), in every mode the file has an expectation for
//!   (or the given modes), and prints a per-rank diff of ccol, PyTorch and
//!   the file's expectation. `--exchange package` runs the collective modes
//!   on the `compiler_collectives` Python package instead of PyTorch's own
//!   exchange. Outputs compare by parsed equality, ignoring
//!   error `message` texts. Exit codes: 0 every job equal (ccol = PyTorch, and
//!   PyTorch = the expectation where the file has one); 1 a difference; 2 a
//!   malformed file, bad arguments, or an oracle that cannot run.
//! - `ccol lattice-eval` (hidden) reads lattice cases as JSON lines on stdin
//!   and prints our joins, canonical strides and per-dimension decisions, one
//!   line per case: what `tests/pytorch-oracle/differential.py` compares with
//!   PyTorch's `FrameStateSizeEntry`.
//!
//! The harness is found by `--harness`, else `CCOL_PYTORCH_ORACLE` (the file
//! or its folder), else `tests/pytorch-oracle/harness.py` in the current
//! directory or one above it, else in the source tree ccol was built from.
//! Its Python is `--python`, else `CCOL_TORCH_PYTHON`, else the torch the
//! scripts installed in the cache (`<cache>/torch-2.13.0`), else `python3`.

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use compiler_collectives::decisions::lattice::{Atom, Dims, Scalar, SizeEntry, Stride};
use compiler_collectives::decisions::shapes::{decide, FrameState, Observation, SourceDecision};
use compiler_collectives::protocol::{parse_timeout_secs, timeout_from_env};
use compiler_collectives::Join;
use compiler_collectives_harness::scenario::{
    run_in_process, strip_messages, Mode, Scenario, ScenarioLimits, RUNNER_TIMEOUT,
};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

/// Exit code: a difference.
const EXIT_DIFFER: u8 = 1;
/// Exit code: malformed input or an oracle that cannot run.
const EXIT_MALFORMED: u8 = 2;

/// Arguments of `ccol scenario compare`.
#[derive(Args, Debug)]
pub(crate) struct CompareArgs {
    /// Scenario files or directories of them.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Compare in this mode (repeatable: collectives, no_collectives,
    /// guard_collectives, collectives_and_guard_collectives); default: every
    /// mode the file has an expectation for, else the file's own mode.
    #[arg(long = "mode", value_name = "MODE", value_parser = parse_mode)]
    modes: Vec<Mode>,
    /// Deadline of each exchange (ccol) and the hang deadline of the harness,
    /// in seconds (default: CCOL_TIMEOUT_S, else 10).
    #[arg(long, value_name = "S")]
    timeout: Option<String>,
    /// Python with torch 2.13 (default: CCOL_TORCH_PYTHON, else the cache's
    /// torch-2.13.0 from the scripts, else python3).
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// The harness (default: CCOL_PYTORCH_ORACLE, else tests/pytorch-oracle/harness.py).
    #[arg(long, value_name = "PATH")]
    harness: Option<PathBuf>,
    /// One JSON line per job, then a summary line, instead of text.
    #[arg(long)]
    json: bool,
    /// Whose exchange the harness runs in the collective modes: `pytorch`
    /// (Dynamo's own, with the harness's CPU device patch) or `package` (the
    /// `compiler_collectives` Python package, no patch; it must be installed
    /// in the harness's Python).
    #[arg(long, value_name = "WHOSE", default_value = "pytorch", value_parser = ["pytorch", "package"])]
    exchange: String,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::from_name(s).ok_or_else(|| {
        format!(
            "unknown mode '{s}' (one of {})",
            Mode::ALL.map(Mode::name).join(", ")
        )
    })
}

/// Arguments of `ccol lattice-eval`.
#[derive(Args, Debug)]
pub(crate) struct LatticeEvalArgs {}

/// One (file, mode) comparison.
struct Job {
    file: String,
    scenario: Scenario,
    mode: Mode,
    ours: Value,
}

fn timeout(flag: Option<&str>) -> anyhow::Result<Duration> {
    if let Some(t) = flag {
        return parse_timeout_secs(t).context("--timeout");
    }
    Ok(timeout_from_env()?.unwrap_or(RUNNER_TIMEOUT))
}

fn python(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or_else(crate::cache::torch_python)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Checks that `py` can `import torch`, so that a missing torch is one clear
/// error rather than a Python traceback per rank.
///
/// # Errors
/// Naming `py` and how to get torch (`scripts/setup-torch.sh`, which the
/// README's test command runs).
pub(crate) fn require_torch(py: &Path) -> anyhow::Result<()> {
    let has_torch = Command::new(py)
        .args(["-c", "import torch"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        bail!(
            "{} cannot import torch: set CCOL_TORCH_PYTHON or --python to a Python with torch \
             2.13 (`. scripts/env.sh; eval \"$(scripts/setup-torch.sh)\"` installs one, as \
             ./scripts/test.sh does, and sets it)",
            py.display()
        );
    }
    Ok(())
}

fn harness(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    const REL: &str = "tests/pytorch-oracle/harness.py";
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("CCOL_PYTORCH_ORACLE") {
        let p = PathBuf::from(p);
        return Ok(if p.is_dir() { p.join("harness.py") } else { p });
    }
    if let Ok(cwd) = std::env::current_dir() {
        if let Some(found) = cwd.ancestors().map(|d| d.join(REL)).find(|p| p.is_file()) {
            return Ok(found);
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(REL);
    if built.is_file() {
        return Ok(built);
    }
    bail!("cannot find {REL}: run from the repository, or set CCOL_PYTORCH_ORACLE or --harness")
}

/// `ccol scenario compare`.
pub(crate) fn compare(args: &CompareArgs) -> ExitCode {
    match compare_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ccol: {e:#}");
            ExitCode::from(EXIT_MALFORMED)
        }
    }
}

fn compare_inner(args: &CompareArgs) -> anyhow::Result<ExitCode> {
    let timeout = timeout(args.timeout.as_deref())?;
    let files = crate::scenario_files(&args.paths)?;
    if files.is_empty() {
        bail!("no scenario files in {:?}", args.paths);
    }
    let limits = ScenarioLimits::default();
    let mut jobs = Vec::new();
    for f in &files {
        let scenario = Scenario::from_file(f, &limits).map_err(|e| anyhow!("{e}"))?;
        let modes: Vec<Mode> = if !args.modes.is_empty() {
            args.modes.clone()
        } else if !scenario.expect.is_empty() {
            scenario.expect.keys().copied().collect()
        } else {
            vec![scenario.default_mode()]
        };
        for mode in modes {
            let report = run_in_process(&scenario, mode, timeout)
                .with_context(|| format!("{}: ccol's runner", f.display()))?;
            jobs.push(Job {
                file: f.to_string_lossy().into_owned(),
                scenario: scenario.clone(),
                mode,
                ours: report.to_json(),
            });
        }
    }
    let py = python(args.python.as_deref());
    let harness = harness(args.harness.as_deref())?;
    require_torch(&py)?;
    let mut cmd = Command::new(&py);
    cmd.arg(&harness)
        .arg("--batch")
        .arg("--timeout")
        .arg(format!("{}", timeout.as_secs_f64()))
        .arg("--exchange")
        .arg(&args.exchange);
    for m in &args.modes {
        cmd.arg("--mode").arg(m.name());
    }
    cmd.args(&files)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().with_context(|| {
        format!(
            "cannot run the PyTorch oracle: {} {}",
            py.display(),
            harness.display()
        )
    })?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no harness output"))?;
    let mut done = vec![false; jobs.len()];
    let mut tally = Tally::default();
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading the harness's output")?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let (Some(file), Some(mode)) = (
            v["file"].as_str(),
            v["mode"].as_str().and_then(Mode::from_name),
        ) else {
            continue;
        };
        let Some(i) =
            (0..jobs.len()).find(|&i| !done[i] && jobs[i].file == file && jobs[i].mode == mode)
        else {
            continue;
        };
        done[i] = true;
        report_job(&mut out, &jobs[i], &v, args.json, &mut tally)?;
    }
    let status = child.wait().context("waiting for the harness")?;
    let mut oracle_failed = false;
    for (i, job) in jobs.iter().enumerate() {
        if !done[i] {
            oracle_failed = true;
            let v = json!({"status": "missing", "reason": format!("the harness gave no result (it exited with {status})")});
            report_job(&mut out, job, &v, args.json, &mut tally)?;
        }
    }
    tally.print(&mut out, args.json)?;
    Ok(if oracle_failed {
        ExitCode::from(EXIT_MALFORMED)
    } else if tally.differ > 0 {
        ExitCode::from(EXIT_DIFFER)
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Default)]
struct Tally {
    compared: u32,
    equal: u32,
    differ: u32,
    unsupported: Vec<String>,
}

impl Tally {
    fn print(&self, out: &mut impl Write, json: bool) -> std::io::Result<()> {
        if json {
            writeln!(
                out,
                "{}",
                json!({"summary": {
                    "compared": self.compared,
                    "equal": self.equal,
                    "differ": self.differ,
                    "unsupported": self.unsupported,
                }})
            )
        } else {
            writeln!(
                out,
                "compared {} with PyTorch: {} equal, {} differ; {} not expressible in PyTorch{}",
                crate::count(self.compared, "scenario-mode", "scenario-modes"),
                self.equal,
                self.differ,
                self.unsupported.len(),
                if self.unsupported.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", self.unsupported.join(", "))
                }
            )
        }
    }
}

/// One row per rank field: (rank index or None for top level, field) → value.
fn flatten(v: &Value) -> BTreeMap<(Option<usize>, String), Value> {
    let mut rows = BTreeMap::new();
    let Value::Object(top) = v else {
        rows.insert((None, "output".to_string()), v.clone());
        return rows;
    };
    for (k, val) in top {
        if k == "ranks" {
            if let Value::Array(ranks) = val {
                for (i, r) in ranks.iter().enumerate() {
                    match r {
                        Value::Object(fields) => {
                            for (f, fv) in fields {
                                match fv {
                                    Value::Object(e) if f == "error" => {
                                        for (ek, ev) in e {
                                            rows.insert(
                                                (Some(i), format!("error.{ek}")),
                                                ev.clone(),
                                            );
                                        }
                                    }
                                    _ => {
                                        rows.insert((Some(i), f.clone()), fv.clone());
                                    }
                                }
                            }
                        }
                        other => {
                            rows.insert((Some(i), String::new()), other.clone());
                        }
                    }
                }
                continue;
            }
        }
        rows.insert((None, k.clone()), val.clone());
    }
    rows
}

fn cell(v: Option<&Value>) -> String {
    v.map_or_else(|| "(none)".to_string(), Value::to_string)
}

/// The readable diff of ccol, PyTorch and (when given) the expectation.
fn diff_lines(ours: &Value, torch: &Value, expect: Option<&Value>) -> Vec<String> {
    let (a, b) = (flatten(ours), flatten(torch));
    let c = expect.map(flatten);
    let mut keys: BTreeSet<&(Option<usize>, String)> = a.keys().chain(b.keys()).collect();
    if let Some(c) = &c {
        keys.extend(c.keys());
    }
    let mut lines = Vec::new();
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        let z = c.as_ref().map(|c| c.get(k));
        if x == y && z.is_none_or(|z| z == y) {
            continue;
        }
        let what = match &k.0 {
            Some(r) => format!("rank {r} {}", k.1),
            None => k.1.clone(),
        };
        let mut line = format!("{what}: ccol {}  pytorch {}", cell(x), cell(y));
        if let Some(z) = z {
            line.push_str(&format!("  expect {}", cell(z)));
        }
        lines.push(line);
    }
    lines
}

fn report_job(
    out: &mut impl Write,
    job: &Job,
    v: &Value,
    json: bool,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let name = &job.scenario.name;
    let mode = job.mode;
    let status = v["status"].as_str().unwrap_or("missing");
    let expect = job.scenario.expect.get(&mode).map(strip_messages);
    if status == "unsupported" {
        let reason = v["reason"].as_str().unwrap_or("");
        tally.unsupported.push(format!("{}:{mode}", job.file));
        if json {
            writeln!(
                out,
                "{}",
                json!({"file": job.file, "name": name, "mode": mode.name(), "status": "unsupported", "reason": reason})
            )?;
        } else {
            writeln!(
                out,
                "UNSUPPORTED {name:<28} {:<34} PyTorch cannot express it: {reason}",
                mode.name()
            )?;
        }
        return Ok(());
    }
    tally.compared += 1;
    let ours = strip_messages(&job.ours);
    let torch = match status {
        "ok" | "failed" => Some(strip_messages(&v["output"])),
        _ => None,
    };
    let equal = torch
        .as_ref()
        .is_some_and(|t| *t == ours && expect.as_ref().is_none_or(|e| e == t));
    if equal {
        tally.equal += 1;
    } else {
        tally.differ += 1;
    }
    if json {
        writeln!(
            out,
            "{}",
            json!({
                "file": job.file, "name": name, "mode": mode.name(),
                "status": if equal { "equal" } else { "differ" },
                "ccol": job.ours, "pytorch": v.get("output").cloned().unwrap_or(Value::Null),
                "expect": job.scenario.expect.get(&mode).cloned().unwrap_or(Value::Null),
                "reason": v.get("reason").cloned().unwrap_or(Value::Null),
            })
        )?;
        return Ok(());
    }
    let against = if expect.is_some() {
        "ccol = pytorch = expect"
    } else {
        "ccol = pytorch (no expectation)"
    };
    match torch {
        Some(_) if equal => writeln!(out, "ok   {name:<28} {:<34} {against}", mode.name())?,
        Some(t) => {
            writeln!(out, "DIFF {name:<28} {:<34} ({})", mode.name(), job.file)?;
            for l in diff_lines(&ours, &t, expect.as_ref()) {
                writeln!(out, "       {l}")?;
            }
        }
        None => writeln!(
            out,
            "DIFF {name:<28} {:<34} no PyTorch result: {}",
            mode.name(),
            v["reason"].as_str().unwrap_or(status)
        )?,
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// lattice-eval
// ---------------------------------------------------------------------------
//
// Input, one JSON object per line:
//   {"prior": {SRC: [ITEM...]}, "ranks": [{SRC: [ITEM...]}, ...]}
// ITEM: {"size": [u64...], "stride": [u64...] | null}  a tensor observation
//     | {"int": i64}                                    an int observation
//     | {"mark_dynamic": [ndim, dim]}                   a mark-dynamic hint
//     | {"entry": ENTRY}                                a raw lattice element
// ENTRY: {"scalar": A, "size": T, "stride": T}; A: "unset" | "dyn" | number
// (stride atoms also {"S": j} for InferStride(j)); T: "unset" | "dyn" | [A...].
//
// Output, one line per input line:
//   {"items": {"prior": {SRC: [OUT...]}, "ranks": [{SRC: [OUT...]}]},
//    "local": [{SRC: ENTRY}...], "merged": {SRC: ENTRY}}
// OUT: {"entry": the item's own entry (tensor strides canonical),
//       "decision": {"sizes": [bool], "strides": [bool]} | {"scalar": bool} | null}
// where decisions are `shapes::decide` from the merged entry of SRC, and
// merged = prior ⊔ local[0] ⊔ local[1] ⊔ ... (the FrameState join).
// A malformed line prints {"error": "..."} and the command exits 2.

enum Item {
    Obs(Observation),
    Entry(SizeEntry),
}

impl Item {
    fn entry(&self) -> SizeEntry {
        match self {
            Item::Obs(o) => o.entry(),
            Item::Entry(e) => e.clone(),
        }
    }
}

fn u64_of(v: &Value, what: &str) -> anyhow::Result<u64> {
    v.as_u64()
        .ok_or_else(|| anyhow!("{what}: expected a non-negative integer, got {v}"))
}

fn u64_list(v: &Value, what: &str) -> anyhow::Result<Vec<u64>> {
    v.as_array()
        .ok_or_else(|| anyhow!("{what}: expected a list"))?
        .iter()
        .map(|x| u64_of(x, what))
        .collect()
}

fn atom_of<V>(v: &Value, value: &impl Fn(&Value) -> anyhow::Result<V>) -> anyhow::Result<Atom<V>> {
    match v.as_str() {
        Some("unset") => Ok(Atom::Unset),
        Some("dyn") => Ok(Atom::Dynamic),
        _ => Ok(Atom::Static(value(v)?)),
    }
}

fn dims_of<V>(v: &Value, value: &impl Fn(&Value) -> anyhow::Result<V>) -> anyhow::Result<Dims<V>> {
    match v {
        Value::String(s) if s == "unset" => Ok(Dims::Unset),
        Value::String(s) if s == "dyn" => Ok(Dims::Dynamic),
        Value::Array(a) => Ok(Dims::Known(
            a.iter()
                .map(|x| atom_of(x, value))
                .collect::<anyhow::Result<_>>()?,
        )),
        other => bail!("expected \"unset\", \"dyn\" or a list, got {other}"),
    }
}

fn stride_of(v: &Value) -> anyhow::Result<Stride> {
    if let Some(j) = v.get("S") {
        let j = u64_of(j, "InferStride")?;
        return Ok(Stride::Infer(u32::try_from(j).context("InferStride")?));
    }
    Ok(Stride::Int(u64_of(v, "stride")?))
}

fn entry_of(v: &Value) -> anyhow::Result<SizeEntry> {
    let scalar = atom_of(&v["scalar"], &|x: &Value| {
        serde_json::from_value::<Scalar>(x.clone()).map_err(|e| anyhow!("scalar: {e}, got {x}"))
    })?;
    let size = dims_of(&v["size"], &|x: &Value| u64_of(x, "size"))?;
    let stride = dims_of(&v["stride"], &stride_of)?;
    Ok(SizeEntry {
        scalar,
        size,
        stride,
    })
}

fn item_of(v: &Value) -> anyhow::Result<Item> {
    if let Some(size) = v.get("size") {
        let sizes = u64_list(size, "size")?;
        let strides = match v.get("stride") {
            None | Some(Value::Null) => None,
            Some(s) => Some(u64_list(s, "stride")?),
        };
        if strides.as_ref().is_some_and(|s| s.len() != sizes.len()) {
            bail!("stride and size of different lengths");
        }
        return Ok(Item::Obs(Observation::Tensor { sizes, strides }));
    }
    if let Some(i) = v.get("int") {
        let i = i
            .as_i64()
            .ok_or_else(|| anyhow!("int: expected an integer"))?;
        return Ok(Item::Obs(Observation::Int(i)));
    }
    if let Some(m) = v.get("mark_dynamic") {
        let ndim = usize::try_from(u64_of(&m[0], "mark_dynamic ndim")?)?;
        let dim = usize::try_from(u64_of(&m[1], "mark_dynamic dim")?)?;
        if ndim > 64 {
            bail!("mark_dynamic: ndim {ndim} over 64");
        }
        return Ok(Item::Entry(SizeEntry::mark_dynamic(ndim, dim)));
    }
    if let Some(e) = v.get("entry") {
        return Ok(Item::Entry(entry_of(e)?));
    }
    bail!("an item is {{\"size\"...}}, {{\"int\"...}}, {{\"mark_dynamic\"...}} or {{\"entry\"...}}: {v}")
}

type Sources = BTreeMap<String, Vec<Item>>;

fn sources_of(v: &Value) -> anyhow::Result<Sources> {
    let Value::Object(m) = v else {
        bail!("expected an object of sources, got {v}");
    };
    m.iter()
        .map(|(k, items)| {
            let items = items
                .as_array()
                .ok_or_else(|| anyhow!("source {k}: expected a list of items"))?
                .iter()
                .map(item_of)
                .collect::<anyhow::Result<_>>()?;
            Ok((k.clone(), items))
        })
        .collect()
}

fn atom_json<V>(a: &Atom<V>, value: &impl Fn(&V) -> Value) -> Value {
    match a {
        Atom::Unset => json!("unset"),
        Atom::Dynamic => json!("dyn"),
        Atom::Static(v) => value(v),
    }
}

fn dims_json<V>(d: &Dims<V>, value: &impl Fn(&V) -> Value) -> Value {
    match d {
        Dims::Unset => json!("unset"),
        Dims::Dynamic => json!("dyn"),
        Dims::Known(a) => Value::Array(a.iter().map(|x| atom_json(x, value)).collect()),
    }
}

fn entry_json(e: &SizeEntry) -> Value {
    json!({
        "scalar": atom_json(&e.scalar, &|v: &Scalar| json!(v)),
        "size": dims_json(&e.size, &|v: &u64| json!(v)),
        "stride": dims_json(&e.stride, &|s: &Stride| match s {
            Stride::Int(v) => json!(v),
            Stride::Infer(j) => json!({"S": j}),
        }),
    })
}

fn state_of(sources: &Sources) -> FrameState {
    let mut s = FrameState::new();
    for (name, items) in sources {
        for item in items {
            s.record_entry(name, &item.entry());
        }
    }
    s
}

fn items_json(sources: &Sources, merged: &FrameState) -> Value {
    let mut m = Map::new();
    for (name, items) in sources {
        let entry = merged.get(name);
        let outs = items
            .iter()
            .map(|item| {
                let decision = match item {
                    Item::Obs(obs) => match decide(&entry, obs, None) {
                        SourceDecision::Tensor {
                            dynamic_sizes,
                            dynamic_strides,
                        } => json!({"sizes": dynamic_sizes, "strides": dynamic_strides}),
                        SourceDecision::Int { dynamic } | SourceDecision::Float { dynamic } => {
                            json!({ "scalar": dynamic })
                        }
                        SourceDecision::Bool | SourceDecision::None => Value::Null,
                    },
                    Item::Entry(_) => Value::Null,
                };
                json!({"entry": entry_json(&item.entry()), "decision": decision})
            })
            .collect();
        m.insert(name.clone(), Value::Array(outs));
    }
    Value::Object(m)
}

fn state_json(s: &FrameState) -> Value {
    Value::Object(
        s.iter()
            .map(|(k, e)| (k.to_owned(), entry_json(&e)))
            .collect(),
    )
}

fn eval_case(line: &str) -> anyhow::Result<Value> {
    let v: Value = serde_json::from_str(line).context("not JSON")?;
    let prior = match v.get("prior") {
        None | Some(Value::Null) => Sources::new(),
        Some(p) => sources_of(p)?,
    };
    let ranks: Vec<Sources> = v["ranks"]
        .as_array()
        .ok_or_else(|| anyhow!("ranks: expected a list"))?
        .iter()
        .map(sources_of)
        .collect::<anyhow::Result<_>>()?;
    let locals: Vec<FrameState> = ranks.iter().map(state_of).collect();
    let mut merged = state_of(&prior);
    for l in &locals {
        merged.join(l);
    }
    Ok(json!({
        "items": {
            "prior": items_json(&prior, &merged),
            "ranks": ranks.iter().map(|r| items_json(r, &merged)).collect::<Vec<_>>(),
        },
        "local": locals.iter().map(state_json).collect::<Vec<_>>(),
        "merged": state_json(&merged),
    }))
}

/// `ccol lattice-eval`.
pub(crate) fn lattice_eval(_args: &LatticeEvalArgs) -> ExitCode {
    let stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut bad = false;
    for (n, line) in stdin.lines().enumerate() {
        let result = line.context("reading stdin").and_then(|l| {
            if l.trim().is_empty() {
                Ok(None)
            } else {
                eval_case(&l).map(Some)
            }
        });
        let v = match result {
            Ok(None) => continue,
            Ok(Some(v)) => v,
            Err(e) => {
                bad = true;
                json!({"error": format!("line {}: {e:#}", n + 1)})
            }
        };
        if writeln!(out, "{v}").is_err() {
            return ExitCode::from(EXIT_MALFORMED);
        }
    }
    if out.flush().is_err() || bad {
        ExitCode::from(EXIT_MALFORMED)
    } else {
        ExitCode::SUCCESS
    }
}
