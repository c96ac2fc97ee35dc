//! Numbers and names for people: durations, grouped digits, cut names,
//! aligned columns.

use std::fmt::Write as _;

/// Nanoseconds for people: `950 ns`, `12.3 µs`, `4.56 ms`, `1.23 s`.
pub fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

/// `1234567` as `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Renders `table` with the first `left` columns left-aligned, the others
/// (numbers) right-aligned.
pub(super) fn render(table: &[Vec<String>], left: usize, out: &mut String) {
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let align: Vec<bool> = (0..columns).map(|c| c >= left).collect();
    render_aligned(table, &align, out);
}

/// Renders `table`, column `c` right-aligned when `right[c]`.
pub(super) fn render_aligned(table: &[Vec<String>], right: &[bool], out: &mut String) {
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in table {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if right.get(c).copied().unwrap_or(true) {
                let _ = write!(line, "{cell:>w$}  ", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// `s` in at most `width` characters: cut in the middle with `…` (the
/// start and the end of a long C++ or Rust name say the most).
pub fn ellipsize(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width <= 1 {
        return "…".chars().take(width).collect();
    }
    let keep = width - 1;
    let tail = keep / 3;
    let head = keep - tail;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
}
