//! The one way `ccol bench` draws a table. A [`Table`] is described once —
//! a title, its [`Column`]s (heading, width, alignment, whether it starts a
//! group, and how a row fills it) and its rows — and [`Table::render`] draws
//! the title line, the header and the rows from that description, so a
//! column's heading and its cells cannot drift apart. It draws in either
//! [`Format`]: aligned text for a terminal, or Markdown (`ccol bench
//! --markdown`, which docs/performance.md is generated with) from the same
//! description.

/// How [`Table::render`] draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    /// Columns padded to their widths, groups set off by ` | `.
    Text,
    /// A paragraph for the title, a GitHub-flavoured Markdown table (always
    /// with its header; alignment from the columns'; widths and groups
    /// dropped) and a paragraph per note.
    Markdown,
}

/// How a column lines up its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// One column of a [`Table`] whose rows are `R`s.
pub(super) struct Column<R> {
    heading: &'static str,
    /// The least width of a cell; longer cells are not cut.
    width: usize,
    align: Align,
    /// ` | ` before the column instead of one space: the first of a group.
    starts_group: bool,
    cell: fn(&R) -> String,
}

impl<R> Column<R> {
    /// A column whose cells are right-aligned in `width` characters.
    pub(super) fn right(heading: &'static str, width: usize, cell: fn(&R) -> String) -> Self {
        Column {
            heading,
            width,
            align: Align::Right,
            starts_group: false,
            cell,
        }
    }

    /// A column whose cells are left-aligned in `width` characters.
    pub(super) fn left(heading: &'static str, width: usize, cell: fn(&R) -> String) -> Self {
        Column {
            align: Align::Left,
            ..Column::right(heading, width, cell)
        }
    }

    /// The same column, set off from the one before by ` | `.
    pub(super) fn group(self) -> Self {
        Column {
            starts_group: true,
            ..self
        }
    }
}

/// A title line, then (unless [`Table::without_header`]) a header line of
/// the columns' headings, a line per row, and note lines.
pub(super) struct Table<'a, R> {
    title: String,
    /// Before the header, every row and every note.
    indent: &'static str,
    header: bool,
    columns: Vec<Column<R>>,
    rows: Vec<&'a R>,
    notes: Vec<String>,
}

impl<'a, R> Table<'a, R> {
    /// A table with a header, indented by two spaces, with no rows yet.
    pub(super) fn new(title: impl Into<String>, columns: Vec<Column<R>>) -> Self {
        Table {
            title: title.into(),
            indent: "  ",
            header: true,
            columns,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Header and rows start at the left margin, as the title does.
    pub(super) fn flush_left(self) -> Self {
        Table { indent: "", ..self }
    }

    /// No header line (the title names the columns).
    pub(super) fn without_header(self) -> Self {
        Table {
            header: false,
            ..self
        }
    }

    /// With these rows, after any it has.
    pub(super) fn rows(mut self, rows: impl IntoIterator<Item = &'a R>) -> Self {
        self.rows.extend(rows);
        self
    }

    /// With a line after the rows, indented as they are.
    pub(super) fn note(mut self, line: impl Into<String>) -> Self {
        self.notes.push(line.into());
        self
    }

    /// The table's lines in `format`, each ending in a newline.
    pub(super) fn render(&self, format: Format) -> String {
        match format {
            Format::Text => self.text(),
            Format::Markdown => self.markdown(),
        }
    }

    fn text(&self) -> String {
        let mut out = format!("{}\n", self.title);
        if self.header {
            self.line(&mut out, |c| c.heading.to_owned());
        }
        for &row in &self.rows {
            self.line(&mut out, |c| (c.cell)(row));
        }
        for note in &self.notes {
            out.push_str(self.indent);
            out.push_str(note);
            out.push('\n');
        }
        out
    }

    fn line(&self, out: &mut String, text: impl Fn(&Column<R>) -> String) {
        out.push_str(self.indent);
        for (i, c) in self.columns.iter().enumerate() {
            if i > 0 {
                out.push_str(if c.starts_group { " | " } else { " " });
            }
            let (text, width) = (text(c), c.width);
            out.push_str(&match c.align {
                Align::Left => format!("{text:<width$}"),
                Align::Right => format!("{text:>width$}"),
            });
        }
        out.push('\n');
    }

    /// The title, a blank line, the table (none without rows), and each
    /// note as its own paragraph: a line right after a table's rows would
    /// be read as one more row.
    fn markdown(&self) -> String {
        let mut out = format!("{}\n", self.title);
        if !self.rows.is_empty() {
            out.push('\n');
            let line = |out: &mut String, cells: Vec<String>| {
                out.push('|');
                for cell in cells {
                    out.push(' ');
                    out.push_str(&cell.replace('|', "\\|"));
                    out.push_str(" |");
                }
                out.push('\n');
            };
            line(
                &mut out,
                self.columns.iter().map(|c| c.heading.to_owned()).collect(),
            );
            line(
                &mut out,
                self.columns
                    .iter()
                    .map(|c| match c.align {
                        Align::Left => ":---".to_owned(),
                        Align::Right => "---:".to_owned(),
                    })
                    .collect(),
            );
            for &row in &self.rows {
                line(
                    &mut out,
                    self.columns.iter().map(|c| (c.cell)(row)).collect(),
                );
            }
        }
        for note in &self.notes {
            out.push('\n');
            out.push_str(note);
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Column, Format, Table};

    type Row = (u32, &'static str);

    fn check(table: &Table<'_, Row>, want: &str) {
        assert_eq!(table.render(Format::Text), want);
    }

    fn check_markdown(table: &Table<'_, Row>, want: &str) {
        assert_eq!(table.render(Format::Markdown), want);
    }

    fn columns() -> Vec<Column<Row>> {
        vec![
            Column::right("n", 3, |r: &Row| r.0.to_string()),
            Column::left("name", 6, |r: &Row| r.1.to_owned()),
            Column::right("twice", 5, |r: &Row| (2 * r.0).to_string()).group(),
        ]
    }

    #[test]
    fn one_description_draws_header_and_rows() {
        let rows = [(1, "one"), (12, "twelve!"), (123456, "")];
        check(
            &Table::new("title", columns()).rows(&rows),
            "title\n    n name   | twice\n    1 one    |     2\n   12 twelve! |    24\n  123456        | 246912\n",
        );
        check(
            &Table::new("title", columns()).flush_left().rows(&rows[..1]),
            "title\n  n name   | twice\n  1 one    |     2\n",
        );
        check(
            &Table::new("no header", columns())
                .without_header()
                .rows(&rows[..1])
                .note("a note"),
            "no header\n    1 one    |     2\n  a note\n",
        );
        check(
            &Table::new("just a note", columns())
                .without_header()
                .note("why"),
            "just a note\n  why\n",
        );
    }

    #[test]
    fn the_same_description_draws_markdown() {
        let rows = [(1, "one"), (12, "a|b")];
        check_markdown(
            &Table::new("title", columns()).rows(&rows),
            "title\n\n| n | name | twice |\n| ---: | :--- | ---: |\n| 1 | one | 2 |\n| 12 | a\\|b | 24 |\n",
        );
        check_markdown(
            &Table::new("no header in text", columns())
                .without_header()
                .rows(&rows[..1])
                .note("a note"),
            "no header in text\n\n| n | name | twice |\n| ---: | :--- | ---: |\n| 1 | one | 2 |\n\na note\n",
        );
        check_markdown(
            &Table::new("just a note", columns())
                .without_header()
                .note("why"),
            "just a note\n\nwhy\n",
        );
    }
}
