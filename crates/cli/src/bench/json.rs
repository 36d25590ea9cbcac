//! `bench.json`, both ways: [`to_json`] writes a run's settings, where and
//! how it ran ([`Run`]), every measurement and the targets; [`from_json`]
//! reads the measurements and the run back, so that `ccol bench --from`
//! draws the same tables without measuring again. Fields are only added,
//! never renamed (the CLI's tests and scripts read them).
//!
//! A ratio or latency that is NaN (a floor of zero, a series without
//! rounds) is written as `null`, as serde_json writes NaN, and read back as
//! NaN; a field that is missing is an error naming it.

use super::measured::{
    tree_bound, Heap, Joins, Results, Row, Stat, Wire, JOIN_RANKS, JOIN_SOURCES,
};
use super::report::Target;
use super::BenchArgs;
use anyhow::Context as _;
use compiler_collectives_harness::benchmark::SimResult;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};

/// Where and how a run measured: `bench.json`'s `run`, said first when its
/// tables are drawn from the file.
#[derive(Debug)]
pub(super) struct Run {
    /// The command line, `ccol bench …`.
    command: String,
    /// `CARGO_PKG_VERSION` of the ccol that measured.
    ccol_version: String,
    /// When the run started: `YYYY-MM-DD HH:MM UTC`.
    started_utc: String,
    /// Wall time of the whole run, s.
    seconds: f64,
    /// `std::env::consts::OS` and `ARCH`, e.g. `linux x86_64`.
    platform: String,
    /// The parallelism the OS offered this process.
    cpus: usize,
    /// The one-minute load average before the run and after it (Linux's
    /// `/proc/loadavg`; `None` elsewhere).
    load_before: Option<f64>,
    load_after: Option<f64>,
}

/// The one-minute load average, where the OS says it in `/proc/loadavg`.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `secs` after the Unix epoch as `YYYY-MM-DD HH:MM UTC` (the proleptic
/// Gregorian calendar, counted from 1 March so that a leap day ends a year).
fn utc(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 0000-03-01 and that day's 400-year era.
    let z = days + 719_468;
    let (era, day_of_era) = (z / 146_097, z % 146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

/// An argument as a shell would need it: quoted when it is empty or holds
/// anything but plain characters.
fn shell_word(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,=:+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

impl Run {
    /// This process's run, starting now: its command line, the machine,
    /// the load before it.
    pub(super) fn start() -> Run {
        let words: Vec<String> = std::env::args().skip(1).map(|a| shell_word(&a)).collect();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Run {
            command: format!("ccol {}", words.join(" ")),
            ccol_version: env!("CARGO_PKG_VERSION").to_owned(),
            started_utc: utc(now),
            seconds: 0.0,
            platform: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            load_before: load_average(),
            load_after: None,
        }
    }

    /// The run done: its wall time since `started`, the load after it.
    pub(super) fn finish(self, started: Instant) -> Run {
        Run {
            seconds: started.elapsed().as_secs_f64(),
            load_after: load_average(),
            ..self
        }
    }

    /// One line: the command, when, how long, and on what.
    pub(super) fn describe(&self) -> String {
        let load = |l: Option<f64>| l.map_or("-".into(), |l| format!("{l:.2}"));
        format!(
            "measured by `{}` (ccol {}), started {}, {:.0} s: {}, {}, one-minute load average {} before and {} after\n",
            self.command,
            self.ccol_version,
            self.started_utc,
            self.seconds,
            self.platform,
            crate::count(self.cpus, "CPU", "CPUs"),
            load(self.load_before),
            load(self.load_after),
        )
    }

    fn json(&self) -> Value {
        json!({
            "command": self.command,
            "ccol_version": self.ccol_version,
            "started_utc": self.started_utc,
            "seconds": self.seconds,
            "platform": self.platform,
            "cpus": self.cpus,
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
        })
    }

    fn read(v: &Value) -> anyhow::Result<Run> {
        let at = "run";
        let text = |key| -> anyhow::Result<String> {
            field(v, at, key)?
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("{at}.{key}: not a string"))
        };
        Ok(Run {
            command: text("command")?,
            ccol_version: text("ccol_version")?,
            started_utc: text("started_utc")?,
            seconds: ms(v, at, "seconds")?,
            platform: text("platform")?,
            cpus: size(v, at, "cpus")?,
            load_before: v["load_average_before"].as_f64(),
            load_after: v["load_average_after"].as_f64(),
        })
    }
}

/// `bench.json`: the run's settings, where and how it ran, every
/// measurement and the targets.
pub(super) fn to_json(
    args: &BenchArgs,
    engine: &str,
    run: &Run,
    results: &Results,
    targets: &[Target],
) -> Value {
    let j = &results.joins;
    json!({
        "engine": engine,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "run": run.json(),
        "exchange": results.rows.iter().map(|r| json!({
            "engine": r.engine,
            "world_size": r.world_size,
            "sources": r.sources,
            "envelope_bytes": r.envelope_bytes,
            "pickle_bytes": r.pickle_bytes,
            "ours_ms": r.ours.json(),
            "owned_ms": r.owned.json(),
            "floor_ms": r.floor.json(),
            "fast_ms": r.fast.json(),
            "floor16_ms": r.floor16.json(),
            "pytorch_ms": r.pytorch.map(Stat::json),
            "torch_gloo16_ms": r.torch_gloo16.map(Stat::json),
            "ours_over_floor": r.ours_over_floor(),
            "pytorch_over_ours": r.pytorch_over_ours(),
            "fast_over_floor16": r.fast_over_floor16(),
            "heap_per_exchange": r.heap.map(|h| json!({
                "allocated_bytes": h.allocated_bytes,
                "allocations": h.allocations,
                "peak_live_bytes": h.peak_live_bytes,
            })),
        })).collect::<Vec<_>>(),
        "heap_note": results.heap_note,
        "join": {
            "ranks": JOIN_RANKS,
            "sources": JOIN_SOURCES,
            "ours_ms": j.ours_ms,
            "ours_folded_ms": j.folded_ms,
            "pytorch_ms": j.pytorch_ms,
            "pytorch_over_ours": j.pytorch_over_ours(),
        },
        "wire": results.wire.iter().map(|w| json!({
            "sources": w.sources,
            "ours_bytes": w.ours_bytes,
            "pickle_bytes": w.pickle_bytes,
            "ours_over_pickle": w.ours_over_pickle(),
        })).collect::<Vec<_>>(),
        "scale": results.scale.iter().map(|s| json!({
            "world_size": s.world_size,
            "hierarchical": s.hierarchical,
            "exchange_ms": s.exchange_ms,
            "max_received_bytes": s.max_received_bytes,
            "payload_bytes": s.payload_bytes,
            "bound_bytes": tree_bound(s),
        })).collect::<Vec<_>>(),
        "targets": targets
            .iter()
            .map(|t| json!({"target": t.what, "measured": t.measured, "met": t.met}))
            .collect::<Vec<_>>(),
    })
}

/// `v[key]`, which must be there (`null` or not).
fn field<'v>(v: &'v Value, at: &str, key: &str) -> anyhow::Result<&'v Value> {
    v.get(key).with_context(|| format!("{at}: no `{key}`"))
}

/// A time or ratio: a number, or `null` for NaN.
fn ms(v: &Value, at: &str, key: &str) -> anyhow::Result<f64> {
    let x = field(v, at, key)?;
    if x.is_null() {
        return Ok(f64::NAN);
    }
    x.as_f64()
        .with_context(|| format!("{at}.{key}: not a number"))
}

/// A count or size: a non-negative integer.
fn count(v: &Value, at: &str, key: &str) -> anyhow::Result<u64> {
    field(v, at, key)?
        .as_u64()
        .with_context(|| format!("{at}.{key}: not a non-negative integer"))
}

fn size(v: &Value, at: &str, key: &str) -> anyhow::Result<usize> {
    usize::try_from(count(v, at, key)?).with_context(|| format!("{at}.{key}: too large"))
}

/// An optional count: `null` for none.
fn maybe_count(v: &Value, at: &str, key: &str) -> anyhow::Result<Option<u64>> {
    match field(v, at, key)? {
        Value::Null => Ok(None),
        _ => count(v, at, key).map(Some),
    }
}

/// A latency `{"p50", "p90"}`, or `null` for none.
fn stat(v: &Value, at: &str, key: &str) -> anyhow::Result<Option<Stat>> {
    let s = field(v, at, key)?;
    if s.is_null() {
        return Ok(None);
    }
    let at = format!("{at}.{key}");
    Ok(Some(Stat {
        p50: ms(s, &at, "p50")?,
        p90: ms(s, &at, "p90")?,
    }))
}

/// A latency every row has.
fn required_stat(v: &Value, at: &str, key: &str) -> anyhow::Result<Stat> {
    stat(v, at, key)?.with_context(|| format!("{at}.{key}: null"))
}

/// The array `key` of the top level, each element with its path.
fn each<'v>(v: &'v Value, key: &str) -> anyhow::Result<Vec<(String, &'v Value)>> {
    let list = field(v, "bench.json", key)?
        .as_array()
        .with_context(|| format!("{key}: not an array"))?;
    Ok(list
        .iter()
        .enumerate()
        .map(|(i, x)| (format!("{key}[{i}]"), x))
        .collect())
}

fn row(at: &str, r: &Value) -> anyhow::Result<Row> {
    let heap = match field(r, at, "heap_per_exchange")? {
        Value::Null => None,
        h => {
            let at = format!("{at}.heap_per_exchange");
            Some(Heap {
                allocated_bytes: count(h, &at, "allocated_bytes")?,
                allocations: count(h, &at, "allocations")?,
                peak_live_bytes: count(h, &at, "peak_live_bytes")?,
            })
        }
    };
    Ok(Row {
        engine: field(r, at, "engine")?
            .as_str()
            .with_context(|| format!("{at}.engine: not a string"))?
            .to_owned(),
        world_size: size(r, at, "world_size")?,
        sources: size(r, at, "sources")?,
        envelope_bytes: size(r, at, "envelope_bytes")?,
        ours: required_stat(r, at, "ours_ms")?,
        owned: required_stat(r, at, "owned_ms")?,
        floor: required_stat(r, at, "floor_ms")?,
        fast: required_stat(r, at, "fast_ms")?,
        floor16: required_stat(r, at, "floor16_ms")?,
        pytorch: stat(r, at, "pytorch_ms")?,
        torch_gloo16: stat(r, at, "torch_gloo16_ms")?,
        pickle_bytes: maybe_count(r, at, "pickle_bytes")?,
        heap,
    })
}

fn sim(at: &str, s: &Value) -> anyhow::Result<SimResult> {
    Ok(SimResult {
        world_size: u32::try_from(count(s, at, "world_size")?)
            .with_context(|| format!("{at}.world_size: too large"))?,
        hierarchical: field(s, at, "hierarchical")?
            .as_bool()
            .with_context(|| format!("{at}.hierarchical: not a boolean"))?,
        exchange_ms: ms(s, at, "exchange_ms")?,
        max_received_bytes: count(s, at, "max_received_bytes")?,
        payload_bytes: size(s, at, "payload_bytes")?,
    })
}

/// What a `bench.json` measured, and the run that measured it (`None` in
/// a file written before `run` was).
///
/// # Errors
/// A field a table needs is missing or of another type; the message names
/// it (`exchange[2].floor_ms.p50: not a number`).
pub(super) fn from_json(v: &Value) -> anyhow::Result<(Results, Option<Run>)> {
    let j = field(v, "bench.json", "join")?;
    let joins = Joins {
        ours_ms: ms(j, "join", "ours_ms")?,
        folded_ms: ms(j, "join", "ours_folded_ms")?,
        pytorch_ms: field(j, "join", "pytorch_ms")?.as_f64(),
    };
    let wire = each(v, "wire")?
        .into_iter()
        .map(|(at, w)| {
            Ok(Wire {
                sources: size(w, &at, "sources")?,
                ours_bytes: size(w, &at, "ours_bytes")?,
                pickle_bytes: maybe_count(w, &at, "pickle_bytes")?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let results = Results {
        rows: each(v, "exchange")?
            .into_iter()
            .map(|(at, r)| row(&at, r))
            .collect::<anyhow::Result<_>>()?,
        joins,
        wire,
        scale: each(v, "scale")?
            .into_iter()
            .map(|(at, s)| sim(&at, s))
            .collect::<anyhow::Result<_>>()?,
        heap_note: v["heap_note"].as_str().map(str::to_owned),
    };
    let run = match v.get("run") {
        None | Some(Value::Null) => None,
        Some(r) => Some(Run::read(r)?),
    };
    Ok((results, run))
}

#[cfg(test)]
mod tests {
    use super::{shell_word, utc};

    #[test]
    fn dates_are_utc_calendar_dates() {
        for (secs, want) in [
            (0, "1970-01-01 00:00 UTC"),
            (951_782_400, "2000-02-29 00:00 UTC"),
            (951_868_799, "2000-02-29 23:59 UTC"),
            (1_709_251_199, "2024-02-29 23:59 UTC"),
            (1_709_251_200, "2024-03-01 00:00 UTC"),
            (4_102_444_800, "2100-01-01 00:00 UTC"),
            (4_107_542_400, "2100-03-01 00:00 UTC"),
        ] {
            assert_eq!(utc(secs), want, "{secs}");
        }
    }

    #[test]
    fn arguments_are_quoted_only_when_a_shell_needs_it() {
        for (arg, want) in [
            ("--ranks", "--ranks"),
            ("2,4", "2,4"),
            ("bench-out", "bench-out"),
            ("a b", "'a b'"),
            ("", "''"),
            ("it's", r"'it'\''s'"),
        ] {
            assert_eq!(shell_word(arg), want);
        }
    }
}
