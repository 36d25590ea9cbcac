//! What one `ccol bench` run measured, as plain values: a [`Row`] per
//! (engine, world size, state size) read from the ranks' result files, the
//! joins, the wire sizes and the scale simulation ([`Results`]), and the
//! arithmetic every output shares (percentiles, ratios, the tree's bound).

use compiler_collectives_harness::benchmark::SimResult;
use serde_json::{json, Value};

/// Ranks of our join and PyTorch's (`ccol bench`'s join measurement).
pub(super) const JOIN_RANKS: u64 = 64;
/// Sources per rank's state in the join measurement.
pub(super) const JOIN_SOURCES: usize = 1000;

/// `p`-th percentile (0–100) of sorted `v`, nearest rank (rounded).
pub(super) fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let max_index = sorted.len() - 1;
    sorted[((p.min(100) * max_index + 50) / 100).min(max_index)]
}

/// `a / b`, NaN when `b` is not positive.
pub(super) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Median and 90th percentile of a series, ms.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stat {
    pub(super) p50: f64,
    pub(super) p90: f64,
}

impl Stat {
    pub(super) fn json(self) -> Value {
        json!({"p50": self.p50, "p90": self.p90})
    }
}

/// Per round, the slowest rank's time; then p50 and p90.
fn stat(per_rank: &[&Vec<f64>]) -> Stat {
    let rounds = per_rank.iter().map(|v| v.len()).min().unwrap_or(0);
    let mut slowest: Vec<f64> = (0..rounds)
        .map(|i| per_rank.iter().map(|v| v[i]).fold(f64::MIN, f64::max))
        .collect();
    slowest.sort_by(f64::total_cmp);
    Stat {
        p50: percentile(&slowest, 50),
        p90: percentile(&slowest, 90),
    }
}

fn f64_list(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The series `field` of state size index `i` on every rank.
fn series(ranks: &[Value], i: usize, field: &str) -> Vec<Vec<f64>> {
    ranks
        .iter()
        .map(|r| f64_list(&r["sizes"][i][field]))
        .collect()
}

fn stat_of(ranks: &[Value], i: usize, field: &str) -> Stat {
    let s = series(ranks, i, field);
    let refs: Vec<&Vec<f64>> = s.iter().collect();
    stat(&refs)
}

/// Per exchange of differing states, the median over rounds, the most of
/// any rank.
#[derive(Clone, Copy, Debug)]
pub(super) struct Heap {
    pub(super) allocated_bytes: u64,
    pub(super) allocations: u64,
    pub(super) peak_live_bytes: u64,
}

/// The heap figures of state size `i`: per rank the median over rounds of
/// each field, then the most of any rank; `None` when no rank counted.
fn heap_of(ranks: &[Value], i: usize) -> Option<Heap> {
    let median = |field: &str| -> Option<u64> {
        ranks
            .iter()
            .filter_map(|r| {
                let mut v: Vec<u64> = r["sizes"][i][field]
                    .as_array()?
                    .iter()
                    .filter_map(Value::as_u64)
                    .collect();
                v.sort_unstable();
                v.get(v.len() / 2).copied()
            })
            .max()
    };
    Some(Heap {
        allocated_bytes: median("alloc_bytes")?,
        allocations: median("allocations")?,
        peak_live_bytes: median("peak_live_bytes")?,
    })
}

/// One (world size, state size) row.
#[derive(Debug)]
pub(super) struct Row {
    /// The engine our side ran on: `gloo`, `c10d` or `in-process`.
    pub(super) engine: String,
    pub(super) world_size: usize,
    pub(super) sources: usize,
    pub(super) envelope_bytes: usize,
    /// `Channel::exchange_in_place`: the rank's state becomes the join.
    pub(super) ours: Stat,
    /// `Channel::exchange`: the join as a new value.
    pub(super) owned: Stat,
    pub(super) floor: Stat,
    pub(super) fast: Stat,
    pub(super) floor16: Stat,
    pub(super) pytorch: Option<Stat>,
    /// One 16-byte all_gather on torch's own gloo (the engine PyTorch uses).
    pub(super) torch_gloo16: Option<Stat>,
    pub(super) pickle_bytes: Option<u64>,
    pub(super) heap: Option<Heap>,
}

impl Row {
    /// State size index `i` (`sources` sources) of our ranks' results
    /// (`ours`, over `engine`) and of PyTorch's (`theirs`, when it ran).
    pub(super) fn read(
        engine: &str,
        world_size: usize,
        (i, sources): (usize, usize),
        ours: &[Value],
        theirs: Option<&[Value]>,
    ) -> Row {
        Row {
            engine: engine.to_owned(),
            world_size,
            sources,
            envelope_bytes: ours[0]["sizes"][i]["envelope_bytes"]
                .as_u64()
                .and_then(|b| usize::try_from(b).ok())
                .unwrap_or(0),
            ours: stat_of(ours, i, "ours_ms"),
            owned: stat_of(ours, i, "owned_ms"),
            floor: stat_of(ours, i, "floor_ms"),
            fast: stat_of(ours, i, "fast_ms"),
            floor16: stat_of(ours, i, "floor16_ms"),
            pytorch: theirs.map(|t| stat_of(t, i, "pytorch_ms")),
            torch_gloo16: theirs.map(|t| stat_of(t, i, "torch_gloo16_ms")),
            pickle_bytes: theirs.and_then(|t| t[0]["sizes"][i]["pickle_bytes"].as_u64()),
            heap: heap_of(ours, i),
        }
    }

    /// Ours over the raw floor (p50s).
    pub(super) fn ours_over_floor(&self) -> f64 {
        ratio(self.ours.p50, self.floor.p50)
    }

    /// PyTorch over ours (p50s), when PyTorch ran.
    pub(super) fn pytorch_over_ours(&self) -> Option<f64> {
        self.pytorch.map(|p| ratio(p.p50, self.ours.p50))
    }

    /// The fast path over one 16-byte all_gather (p50s).
    pub(super) fn fast_over_floor16(&self) -> f64 {
        ratio(self.fast.p50, self.floor16.p50)
    }
}

/// Our join of [`JOIN_RANKS`] × [`JOIN_SOURCES`] and PyTorch's, median ms.
#[derive(Debug)]
pub(super) struct Joins {
    /// `FrameState::join_all`.
    pub(super) ours_ms: f64,
    /// `Join::join` folded over the ranks.
    pub(super) folded_ms: f64,
    /// Dynamo's `FrameStateSizeEntry` joins, when PyTorch ran.
    pub(super) pytorch_ms: Option<f64>,
}

impl Joins {
    /// PyTorch over ours, when PyTorch ran.
    pub(super) fn pytorch_over_ours(&self) -> Option<f64> {
        self.pytorch_ms.map(|t| ratio(t, self.ours_ms))
    }
}

/// Bytes of one state of `sources` sources on the wire, ours and pickle's.
#[derive(Debug)]
pub(super) struct Wire {
    pub(super) sources: usize,
    /// Our envelope.
    pub(super) ours_bytes: usize,
    /// `all_gather_object`'s pickle, when PyTorch ran.
    pub(super) pickle_bytes: Option<u64>,
}

impl Wire {
    /// Ours over pickle, when PyTorch ran.
    pub(super) fn ours_over_pickle(&self) -> Option<f64> {
        self.pickle_bytes
            .map(|p| ratio(self.ours_bytes as f64, p as f64))
    }
}

/// `⌈log2 n⌉`.
pub(super) fn log2_ceil(n: u32) -> u32 {
    32 - n.saturating_sub(1).leading_zeros()
}

/// The most bytes a rank of the tree exchange should receive:
/// `2 · payload · ⌈log2 N⌉`.
pub(super) fn tree_bound(s: &SimResult) -> u64 {
    2 * s.payload_bytes as u64 * u64::from(log2_ceil(s.world_size))
}

/// Everything one run measured, in the order it is printed.
#[derive(Debug)]
pub(super) struct Results {
    pub(super) rows: Vec<Row>,
    pub(super) joins: Joins,
    pub(super) wire: Vec<Wire>,
    pub(super) scale: Vec<SimResult>,
    /// Said in the heap section when rows lack figures for want of the
    /// `heap-stats` feature.
    pub(super) heap_note: Option<String>,
}
