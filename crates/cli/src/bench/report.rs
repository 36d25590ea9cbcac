//! What `ccol bench` reports: its tables on stdout (each a [`Table`]
//! described once, below, drawn as text or Markdown) and the targets it
//! checks. `bench.json` is `json`'s.

use super::measured::{
    ratio, tree_bound, Heap, Joins, Results, Row, Stat, Wire, JOIN_RANKS, JOIN_SOURCES,
};
use super::table::{Column, Format, Table};
use compiler_collectives_harness::benchmark::SimResult;

/// A latency: `p50 / p90`, ms.
fn pair(s: Stat) -> String {
    format!("{:.3} / {:.3}", s.p50, s.p90)
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2}"))
}

/// `a / b` of the p50s, as a table shows a ratio.
fn over(a: Stat, b: Stat) -> String {
    fmt_ratio(Some(ratio(a.p50, b.p50)))
}

/// The columns that name a row (engine, ranks, sources), then `more`.
fn row_columns(more: impl IntoIterator<Item = Column<Row>>) -> Vec<Column<Row>> {
    let mut columns = vec![
        Column::right("engine", 6, |r: &Row| r.engine.clone()),
        Column::right("ranks", 5, |r: &Row| r.world_size.to_string()),
        Column::right("sources", 7, |r: &Row| r.sources.to_string()),
    ];
    columns.extend(more);
    columns
}

fn exchange(rows: &[Row]) -> Table<'_, Row> {
    Table::new(
        "exchange + merge latency, ms (p50 / p90 over rounds; a round = the slowest rank)",
        row_columns([
            Column::right("bytes", 8, |r: &Row| r.envelope_bytes.to_string()),
            Column::right("ours", 15, |r: &Row| pair(r.ours)).group(),
            Column::right("floor", 15, |r: &Row| pair(r.floor)),
            Column::right("pytorch", 15, |r: &Row| r.pytorch.map_or("-".into(), pair)),
            Column::right("ours/flr", 10, |r: &Row| {
                fmt_ratio(Some(r.ours_over_floor()))
            })
            .group(),
            Column::right("torch/ours", 10, |r: &Row| fmt_ratio(r.pytorch_over_ours())),
            Column::right("fast path", 15, |r: &Row| pair(r.fast)).group(),
            Column::right("16B gather", 15, |r: &Row| pair(r.floor16)),
            Column::right("fast/16B", 9, |r: &Row| {
                fmt_ratio(Some(r.fast_over_floor16()))
            }),
            Column::right("torch 16B", 15, |r: &Row| {
                r.torch_gloo16.map_or("-".into(), pair)
            })
            .group(),
        ]),
    )
    .flush_left()
    .rows(rows)
}

fn new_value(rows: &[Row]) -> Table<'_, Row> {
    Table::new(
        "the join as a new value (Channel::exchange; \"ours\" above joins into the rank's state, Channel::exchange_in_place)",
        row_columns([
            Column::right("new value", 15, |r: &Row| pair(r.owned)).group(),
            Column::right("new/flr", 10, |r: &Row| over(r.owned, r.floor)),
            Column::right("new/ours", 10, |r: &Row| over(r.owned, r.ours)),
        ]),
    )
    .rows(rows)
}

/// A heap figure of a row that has them.
fn heap_cell(r: &Row, figure: fn(Heap) -> u64) -> String {
    r.heap
        .map(figure)
        .map_or_else(String::new, |n| n.to_string())
}

/// The rows with heap figures, and the note on those without; `None` when
/// there is neither.
fn heap(results: &Results) -> Option<Table<'_, Row>> {
    let counted: Vec<&Row> = results.rows.iter().filter(|r| r.heap.is_some()).collect();
    if counted.is_empty() && results.heap_note.is_none() {
        return None;
    }
    let mut table = Table::new(
        "heap per exchange of differing states, in place (median over rounds, the most of any rank)",
        row_columns([
            Column::right("bytes alloc'd", 14, |r: &Row| heap_cell(r, |h| h.allocated_bytes)),
            Column::right("allocations", 12, |r: &Row| heap_cell(r, |h| h.allocations)),
            Column::right("peak live bytes", 16, |r: &Row| heap_cell(r, |h| h.peak_live_bytes)),
        ]),
    );
    if counted.is_empty() {
        table = table.without_header();
    }
    table = table.rows(counted);
    Some(match &results.heap_note {
        Some(note) => table.note(note.as_str()),
        None => table,
    })
}

fn joins(j: &Joins) -> String {
    format!(
        "join, {JOIN_RANKS} ranks × {JOIN_SOURCES} sources: ours {:.3} ms (join_all; Join::join folded {:.3} ms), PyTorch {} ms, PyTorch/ours {}\n",
        j.ours_ms,
        j.folded_ms,
        j.pytorch_ms.map_or("-".into(), |t| format!("{t:.1}")),
        fmt_ratio(j.pytorch_over_ours())
    )
}

fn wire(wire: &[Wire]) -> Table<'_, Wire> {
    Table::new(
        "wire bytes per state: sources, ours (envelope), pickle (all_gather_object), ours/pickle",
        vec![
            Column::right("sources", 6, |w: &Wire| w.sources.to_string()),
            Column::right("ours", 9, |w: &Wire| w.ours_bytes.to_string()),
            Column::right("pickle", 9, |w: &Wire| {
                w.pickle_bytes.map_or("-".into(), |p| p.to_string())
            }),
            Column::right("ours/pickle", 7, |w: &Wire| fmt_ratio(w.ours_over_pickle())),
        ],
    )
    .without_header()
    .rows(wire)
}

fn scale(scale: &[SimResult]) -> Table<'_, SimResult> {
    Table::new(
        "scale (in-process ranks, 20-source states): one exchange",
        vec![
            Column::right("ranks", 6, |s: &SimResult| s.world_size.to_string()),
            Column::right("exchange", 12, |s: &SimResult| {
                if s.hierarchical {
                    "hierarchical"
                } else {
                    "flat"
                }
                .to_owned()
            }),
            Column::right("ms", 12, |s: &SimResult| format!("{:.2}", s.exchange_ms)),
            Column::right("max bytes/rank", 18, |s: &SimResult| {
                s.max_received_bytes.to_string()
            }),
            Column::right("2·payload·log2 N", 22, |s: &SimResult| {
                tree_bound(s).to_string()
            }),
        ],
    )
    .rows(scale)
}

fn verdicts(targets: &[Target]) -> Table<'_, Target> {
    Table::new(
        "targets, measured in this run:",
        vec![
            Column::left("met", 4, |t: &Target| {
                match t.met {
                    Some(true) => "met",
                    Some(false) => "NOT",
                    None => "-",
                }
                .to_owned()
            }),
            Column::left("target", 58, |t: &Target| t.what.clone()),
            Column::left("measured", 0, |t: &Target| t.measured.clone()),
        ],
    )
    .without_header()
    .rows(targets)
}

/// Everything printed on stdout before the line saying where the files
/// are: the tables in `format`, a blank line between two.
pub(super) fn render(results: &Results, targets: &[Target], format: Format) -> String {
    let rows = &results.rows;
    let mut sections = vec![
        exchange(rows).render(format),
        new_value(rows).render(format),
    ];
    sections.extend(heap(results).map(|t| t.render(format)));
    sections.push(joins(&results.joins));
    sections.push(wire(&results.wire).render(format));
    if !results.scale.is_empty() {
        sections.push(scale(&results.scale).render(format));
    }
    sections.push(verdicts(targets).render(format));
    sections.join("\n")
}

/// One benchmark target and what this run measured for it.
pub(super) struct Target {
    pub(super) what: String,
    pub(super) measured: String,
    /// `None` when this run could not measure it (e.g. no PyTorch side).
    pub(super) met: Option<bool>,
}

fn target(what: impl Into<String>, values: &[f64], ok: impl Fn(f64) -> bool) -> Target {
    let shown: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
    Target {
        what: what.into(),
        measured: if shown.is_empty() {
            "-".into()
        } else {
            shown.join(", ")
        },
        met: (!values.is_empty()).then(|| values.iter().all(|&v| ok(v))),
    }
}

/// The benchmark's targets, each with what this run measured for it.
pub(super) fn targets(results: &Results) -> Vec<Target> {
    let rows = &results.rows;
    let mut out = Vec::new();
    let mut engines: Vec<&str> = Vec::new();
    for r in rows {
        if !engines.contains(&r.engine.as_str()) {
            engines.push(r.engine.as_str());
        }
    }
    for e in engines {
        let of = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.engine == e)
                .filter_map(f)
                .collect()
        };
        out.push(target(
            format!("{e}: ours / raw floor <= 1.2 (every row)"),
            &of(&|r| Some(r.ours_over_floor())),
            |v| v <= 1.2,
        ));
        for (world, want) in [(2, 10.0), (4, 3.0)] {
            out.push(target(
                format!("{e}: PyTorch / ours >= {want} ({world} ranks, 200 sources)"),
                &of(&|r| {
                    (r.world_size == world && r.sources == 200)
                        .then_some(r.pytorch_over_ours())
                        .flatten()
                }),
                |v| v >= want,
            ));
        }
        out.push(target(
            format!("{e}: fast path / 16-byte all_gather <= 1.1 (every row)"),
            &of(&|r| Some(r.fast_over_floor16())),
            |v| v <= 1.1,
        ));
    }
    out.push(target(
        "join: PyTorch / ours >= 100 (64 ranks x 1000 sources)",
        &results
            .joins
            .pytorch_over_ours()
            .into_iter()
            .collect::<Vec<_>>(),
        |v| v >= 100.0,
    ));
    out.push(target(
        "wire: ours / pickle <= 0.25 (every state size)",
        &results
            .wire
            .iter()
            .filter_map(Wire::ours_over_pickle)
            .collect::<Vec<_>>(),
        |v| v <= 0.25,
    ));
    let tree: Vec<&SimResult> = results.scale.iter().filter(|s| s.hierarchical).collect();
    out.push(target(
        "scale: hierarchical max bytes / (2 payload log2 N) <= 1",
        &tree
            .iter()
            .map(|s| ratio(s.max_received_bytes as f64, tree_bound(s) as f64))
            .collect::<Vec<_>>(),
        |v| v <= 1.0,
    ));
    out.push(Target {
        what: "scale: 4096 simulated ranks complete".into(),
        measured: tree
            .iter()
            .find(|s| s.world_size >= 4096)
            .map_or("-".into(), |s| format!("{:.0} ms", s.exchange_ms)),
        // A world that fails to complete fails the whole run; not run = not measured.
        met: tree.iter().any(|s| s.world_size >= 4096).then_some(true),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::super::measured::{Heap, Joins, Results, Row, Stat, Wire};
    use super::super::table::Format;
    use super::super::NO_HEAP_STATS;
    use super::{heap, render, targets};
    use compiler_collectives_harness::benchmark::SimResult;

    /// p50 and p90 of a latency, ms.
    type Ms = (f64, f64);

    /// A row: engine, ranks, sources, envelope bytes; ours, the join as a
    /// new value, floor, fast path, 16-byte gather; PyTorch and its 16-byte
    /// gather; heap figures (bytes, allocations, peak).
    type Case = (
        (&'static str, usize, usize, usize),
        [Ms; 5],
        [Option<Ms>; 2],
        Option<(u64, u64, u64)>,
    );

    /// Rows with and without PyTorch and heap figures, a floor of zero (no
    /// ratio), cells wider than their column.
    #[rustfmt::skip]
    const ROWS: [Case; 4] = [
        (("gloo", 2, 20, 345), [(0.678, 1.779), (1.39, 3.782), (2.103, 3.906), (2.178, 3.136), (0.424, 1.418)], [Some((3.535, 4.016)), Some((3.859, 3.915))], Some((22870, 33, 20708))),
        (("gloo", 2, 200, 3146), [(0.645, 0.651), (2.062, 2.072), (5.004, 5.156), (3.312, 5.014), (3.264, 3.575)], [Some((11.355, 12.866)), Some((0.66, 2.308))], Some((31350, 33, 21820))),
        (("c10d", 4, 200, 3146), [(0.811, 0.95), (2.156, 2.291), (0.0, 1.187), (0.479, 0.556), (2.363, 4.52)], [Some((12.0, 13.5)), None], None),
        (("c10d", 4, 2000, 31046), [(1234.5678, 2345.6789), (2.0, 3.0), (1.0, 2.0), (0.5, 0.6), (0.4, 0.5)], [None, None], Some((1, 2, 3))),
    ];

    fn row(&(id, ms, theirs, heap): &Case) -> Row {
        let (engine, world_size, sources, envelope_bytes) = id;
        let [ours, owned, floor, fast, floor16] = ms.map(|(p50, p90)| Stat { p50, p90 });
        let [pytorch, torch_gloo16] = theirs.map(|t| t.map(|(p50, p90)| Stat { p50, p90 }));
        Row {
            engine: engine.into(),
            world_size,
            sources,
            envelope_bytes,
            ours,
            owned,
            floor,
            fast,
            floor16,
            pytorch,
            torch_gloo16,
            pickle_bytes: None,
            heap: heap.map(|(allocated_bytes, allocations, peak_live_bytes)| Heap {
                allocated_bytes,
                allocations,
                peak_live_bytes,
            }),
        }
    }

    /// [`ROWS`], and every other section.
    #[rustfmt::skip]
    fn results() -> Results {
        let sim = |world_size, hierarchical, exchange_ms, max_received_bytes| SimResult {
            world_size, hierarchical, exchange_ms, max_received_bytes, payload_bytes: 300,
        };
        let wire = |sources, ours_bytes, pickle_bytes| Wire { sources, ours_bytes, pickle_bytes };
        Results {
            rows: ROWS.iter().map(row).collect(),
            joins: Joins { ours_ms: 76.878, folded_ms: 90.422, pytorch_ms: Some(584.7) },
            wire: vec![wire(20, 345, Some(1675)), wire(200, 3146, None)],
            scale: vec![sim(16, false, 3.1372, 4500), sim(16, true, 2.5, 2000), sim(4096, true, 1234.5, 9000)],
            heap_note: None,
        }
    }

    /// What `ccol bench` printed for these results before its tables were
    /// described as `Table`s.
    const PRINTED: &str = r#"exchange + merge latency, ms (p50 / p90 over rounds; a round = the slowest rank)
engine ranks sources    bytes |            ours           floor         pytorch |   ours/flr torch/ours |       fast path      16B gather  fast/16B |       torch 16B
  gloo     2      20      345 |   0.678 / 1.779   2.103 / 3.906   3.535 / 4.016 |       0.32       5.21 |   2.178 / 3.136   0.424 / 1.418      5.14 |   3.859 / 3.915
  gloo     2     200     3146 |   0.645 / 0.651   5.004 / 5.156 11.355 / 12.866 |       0.13      17.60 |   3.312 / 5.014   3.264 / 3.575      1.01 |   0.660 / 2.308
  c10d     4     200     3146 |   0.811 / 0.950   0.000 / 1.187 12.000 / 13.500 |        NaN      14.80 |   0.479 / 0.556   2.363 / 4.520      0.20 |               -
  c10d     4    2000    31046 | 1234.568 / 2345.679   1.000 / 2.000               - |    1234.57          - |   0.500 / 0.600   0.400 / 0.500      1.25 |               -

the join as a new value (Channel::exchange; "ours" above joins into the rank's state, Channel::exchange_in_place)
  engine ranks sources |       new value    new/flr   new/ours
    gloo     2      20 |   1.390 / 3.782       0.66       2.05
    gloo     2     200 |   2.062 / 2.072       0.41       3.20
    c10d     4     200 |   2.156 / 2.291        NaN       2.66
    c10d     4    2000 |   2.000 / 3.000       2.00       0.00

heap per exchange of differing states, in place (median over rounds, the most of any rank)
  engine ranks sources  bytes alloc'd  allocations  peak live bytes
    gloo     2      20          22870           33            20708
    gloo     2     200          31350           33            21820
    c10d     4    2000              1            2                3

join, 64 ranks × 1000 sources: ours 76.878 ms (join_all; Join::join folded 90.422 ms), PyTorch 584.7 ms, PyTorch/ours 7.61

wire bytes per state: sources, ours (envelope), pickle (all_gather_object), ours/pickle
      20       345      1675    0.21
     200      3146         -       -

scale (in-process ranks, 20-source states): one exchange
   ranks     exchange           ms     max bytes/rank       2·payload·log2 N
      16         flat         3.14               4500                   2400
      16 hierarchical         2.50               2000                   2400
    4096 hierarchical      1234.50               9000                   7200

targets, measured in this run:
  met  gloo: ours / raw floor <= 1.2 (every row)                  0.32, 0.13
  met  gloo: PyTorch / ours >= 10 (2 ranks, 200 sources)          17.60
  -    gloo: PyTorch / ours >= 3 (4 ranks, 200 sources)           -
  NOT  gloo: fast path / 16-byte all_gather <= 1.1 (every row)    5.14, 1.01
  NOT  c10d: ours / raw floor <= 1.2 (every row)                  NaN, 1234.57
  -    c10d: PyTorch / ours >= 10 (2 ranks, 200 sources)          -
  met  c10d: PyTorch / ours >= 3 (4 ranks, 200 sources)           14.80
  NOT  c10d: fast path / 16-byte all_gather <= 1.1 (every row)    0.20, 1.25
  NOT  join: PyTorch / ours >= 100 (64 ranks x 1000 sources)      7.61
  met  wire: ours / pickle <= 0.25 (every state size)             0.21
  NOT  scale: hierarchical max bytes / (2 payload log2 N) <= 1    0.83, 1.25
  met  scale: 4096 simulated ranks complete                       1234 ms
"#;

    #[test]
    fn the_tables_print_as_they_always_have() {
        let results = results();
        let got = render(&results, &targets(&results), Format::Text);
        for (i, (got, want)) in got.lines().zip(PRINTED.lines()).enumerate() {
            assert_eq!(got, want, "line {}", i + 1);
        }
        assert_eq!(got, PRINTED);
    }

    #[test]
    fn rows_without_heap_figures_for_want_of_the_feature_are_named() {
        let mut results = results();
        let counted = heap(&results).expect("a heap section").render(Format::Text);
        results.heap_note = Some(NO_HEAP_STATS.into());
        assert_eq!(
            heap(&results).expect("a heap section").render(Format::Text),
            format!("{counted}  {NO_HEAP_STATS}\n")
        );
        results.rows.iter_mut().for_each(|r| r.heap = None);
        assert_eq!(
            heap(&results).expect("a heap section").render(Format::Text),
            format!(
                "heap per exchange of differing states, in place (median over rounds, the most of any rank)\n  {NO_HEAP_STATS}\n"
            )
        );
        results.heap_note = None;
        assert!(heap(&results).is_none());
    }
}
