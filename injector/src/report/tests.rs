use super::build::timer_word;
use super::table::histogram_text;
use super::*;

fn row(index: u32, tid: u32, state: u32, words: Vec<u64>) -> RowSnapshot {
    RowSnapshot {
        index,
        state,
        tid,
        generation: 0,
        name: format!("t{index}"),
        words,
        cpu_source: (0, 0),
    }
}

#[test]
fn timed_probes_report_times_and_exit_counts() {
    let probes = vec![
        ProbeInfo {
            name: "timed".into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: 0x1000,
            calls_word: 0,
            metrics: crate::exits::Metrics {
                wall: true,
                cpu: false,
                histogram: false,
            },
        },
        ProbeInfo {
            name: "counted".into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: 0x2000,
            calls_word: 10,
            metrics: crate::exits::Metrics::CALLS,
        },
    ];
    // entries, exits, unwound, unhooked, nesting, seq, wall, -, cpu, -
    let mut words = vec![7, 5, 1, 1, 0, 2, 3_500_000, 0, 900, 0, 4];
    let rows = vec![row(0, 10, layout::ROW_LIVE, words.clone())];
    let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
    assert_eq!(r.metrics, ["calls", "wall"]);
    let c = &r.threads[0].functions["timed"];
    assert_eq!(
        (c.calls, c.exits, c.unwound, c.unhooked, c.wall_ns, c.cpu_ns),
        (7, Some(5), Some(1), Some(1), Some(3_500_000), None)
    );
    assert_eq!(r.functions[0].wall_ns, Some(3_500_000));
    assert_eq!(r.functions[1].wall_ns, None);
    let plain = &r.threads[0].functions["counted"];
    assert_eq!((plain.calls, plain.exits), (4, None));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(
        json["threads"][0]["functions"]["timed"]["wall_ns"],
        3_500_000
    );
    assert!(json["threads"][0]["functions"]["counted"]
        .get("wall_ns")
        .is_none());
    let table = r.to_table();
    assert!(table.contains("3.50 ms"), "{table}");
    words[6] = 999;
    assert_eq!(human_ns(words[6]), "999 ns");
    assert_eq!(human_ns(12_345), "12.3 µs");
    assert_eq!(human_ns(2_500_000_000), "2.50 s");
}

#[test]
fn a_function_probed_twice_is_one_entry() {
    // Inserted, removed, inserted again (new words): one function, one
    // name, the calls of both.
    let probe = |calls_word| ProbeInfo {
        name: "f".into(),
        aliases: Vec::new(),
        module: "exe".into(),
        address: 0x1000,
        calls_word,
        metrics: crate::exits::Metrics::CALLS,
    };
    let probes = vec![probe(0), probe(1)];
    let rows = vec![
        row(0, 10, layout::ROW_LIVE, vec![3, 4]),
        row(1, 11, layout::ROW_LIVE, vec![0, 5]),
    ];
    let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
    assert_eq!(r.functions.len(), 1);
    assert_eq!(
        (r.functions[0].name.as_str(), r.functions[0].calls),
        ("f", 12)
    );
    assert_eq!(r.threads[0].functions["f"].calls, 7);
    assert_eq!(r.threads[1].functions["f"].calls, 5);
}

#[test]
fn clones_are_one_entry_under_the_source_name() {
    // `scale` and its clone `scale.constprop.0` (another address) are
    // one entry named `scale`, their calls summed; a C++ name is
    // demangled, its linkage name kept beside it; a static function of
    // the same name in another module stays apart.
    let probe = |name: &str, module: &str, address, calls_word| ProbeInfo {
        name: name.into(),
        aliases: Vec::new(),
        module: module.into(),
        address,
        calls_word,
        metrics: crate::exits::Metrics::CALLS,
    };
    let probes = vec![
        probe("scale", "exe", 0x1000, 0),
        probe("scale.constprop.0", "exe", 0x2000, 1),
        probe("_ZNK3app5Cache3getEi", "exe", 0x3000, 2),
        probe("scale.isra.0", "lib.so", 0x9000, 3),
    ];
    let rows = vec![
        row(0, 10, layout::ROW_LIVE, vec![3, 4, 1, 2]),
        row(1, 11, layout::ROW_LIVE, vec![0, 5, 0, 0]),
    ];
    let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
    assert_eq!(r.functions.len(), 3, "{:?}", r.functions);
    let scale = r.functions.iter().find(|f| f.name == "exe:scale").unwrap();
    assert_eq!(scale.calls, 12);
    assert_eq!(scale.clones, ["scale", "scale.constprop.0"]);
    assert_eq!(scale.mangled.as_deref(), Some("scale"));
    assert_eq!(scale.label(), "exe:scale [scale, scale.constprop.0]");
    assert_eq!(r.threads[0].functions["exe:scale"].calls, 7);
    assert_eq!(r.threads[1].functions["exe:scale"].calls, 5);
    let lib = r
        .functions
        .iter()
        .find(|f| f.name == "lib.so:scale")
        .unwrap();
    assert_eq!((lib.calls, lib.clones.len()), (2, 0));
    assert_eq!(lib.mangled.as_deref(), Some("scale.isra.0"));
    let get = r
        .functions
        .iter()
        .find(|f| f.name == "app::Cache::get(int) const")
        .unwrap();
    assert_eq!(get.mangled.as_deref(), Some("_ZNK3app5Cache3getEi"));
    let json = r.to_json();
    assert!(
        json.contains(r#""name":"app::Cache::get(int) const","mangled":"_ZNK3app5Cache3getEi""#),
        "{json}"
    );
}

#[test]
fn aliases_of_one_address_are_one_entry() {
    // Probed as `malloc` (also matched as `__libc_malloc`), removed,
    // probed again as `__libc_malloc`: one entry with both names.
    let probe = |name: &str, alias: &str, calls_word| ProbeInfo {
        name: name.into(),
        aliases: vec![alias.into()],
        module: "libc.so.6".into(),
        address: 0x1000,
        calls_word,
        metrics: crate::exits::Metrics::CALLS,
    };
    let probes = vec![
        probe("malloc", "__libc_malloc", 0),
        probe("__libc_malloc", "malloc", 1),
    ];
    let rows = vec![row(0, 10, layout::ROW_LIVE, vec![3, 4])];
    let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
    assert_eq!(r.functions.len(), 1);
    assert_eq!(r.functions[0].name, "malloc");
    assert_eq!(r.functions[0].aliases, ["__libc_malloc"]);
    assert_eq!(r.functions[0].calls, 7);
    assert_eq!(r.threads[0].functions["malloc"].calls, 7);
    assert!(r.to_json().contains(r#""aliases":["__libc_malloc"]"#));
    assert!(r.to_table().contains("malloc (= __libc_malloc)"));
}

#[test]
fn threads_without_calls_are_left_out_and_totals_add_up() {
    let probes = vec![
        ProbeInfo {
            name: "a".into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: 0x1000,
            calls_word: 0,
            metrics: crate::exits::Metrics::CALLS,
        },
        ProbeInfo {
            name: "b".into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: 0x2000,
            calls_word: 1,
            metrics: crate::exits::Metrics::CALLS,
        },
    ];
    let rows = vec![
        row(0, 10, layout::ROW_LIVE, vec![3, 0]),
        row(1, 11, layout::ROW_EXITED, vec![0, 0]),
        row(2, 12, layout::ROW_EXITED, vec![4, 5]),
    ];
    let r = Report::build(1, 5, &probes, &rows, 0, |_| Some("live".into()));
    assert_eq!(r.threads.len(), 2);
    assert_eq!(r.functions[0].calls, 7);
    assert_eq!(r.functions[1].calls, 5);
    assert_eq!(r.threads[0].name, "live");
    assert!(!r.threads[0].exited);
    assert!(r.threads[1].exited);
    assert_eq!(r.threads[1].name, "t2");
    assert!(!r.threads[0].functions.contains_key("b"));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["threads"][1]["functions"]["b"]["calls"], 5);
    assert_eq!(json["functions"][0]["address"], "0x1000");
    let table = r.to_table();
    assert!(table.contains("t2 (exited)"), "{table}");
}

#[test]
fn clashing_names_are_qualified() {
    let probes = vec![
        ProbeInfo {
            name: "f".into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: 1,
            calls_word: 0,
            metrics: crate::exits::Metrics::CALLS,
        },
        ProbeInfo {
            name: "f".into(),
            aliases: Vec::new(),
            module: "lib.so".into(),
            address: 2,
            calls_word: 1,
            metrics: crate::exits::Metrics::CALLS,
        },
    ];
    let r = Report::build(1, 0, &probes, &[], 0, |_| None);
    assert_eq!(r.functions[0].name, "exe:f");
    assert_eq!(r.functions[1].name, "lib.so:f");
}

/// A report of `n` timed functions (wall, CPU, histograms) with long
/// names on `threads` threads, figures up to hours and billions of
/// calls.
fn big_report(n: usize, threads: u32) -> Report {
    let words = (weft_codegen::TIMER_HIST_METRIC_LEN / 8) as usize;
    let probes: Vec<ProbeInfo> = (0..n)
        .map(|i| ProbeInfo {
            name: match i % 3 {
                0 => format!("f{i}"),
                1 => format!(
                    "std::__detail::_Hashtable<std::basic_string<char>, std::pair<const \
                     std::basic_string<char>, int>>::_M_insert_unique_node{i}"
                ),
                _ => format!("very_long_c_function_name_that_goes_on_and_on_{i}"),
            },
            aliases: if i == 7 {
                vec!["an_alias_of_f7".into()]
            } else {
                Vec::new()
            },
            module: if i % 2 == 0 {
                "libc.so.6".into()
            } else {
                "libsomething-really-long-name.so.1.2.3".into()
            },
            address: 0x1000 + i as u64 * 16,
            calls_word: (i * words) as u32,
            metrics: crate::exits::Metrics::ALL.with_histogram(true),
        })
        .collect();
    let rows: Vec<RowSnapshot> = (0..threads)
        .map(|t| {
            let mut w = vec![0u64; n * words];
            for i in 0..n {
                let at = |off: i32| i * words + timer_word(off);
                let scale = (i as u64 + 1) * (u64::from(t) + 1);
                w[at(weft_codegen::METRIC_ENTRIES)] = 1_234_567_890 * scale % 9_999_999_999;
                w[at(weft_codegen::METRIC_WALL_TOTAL)] = 3_600_000_000_000 / scale;
                w[at(weft_codegen::METRIC_SELF_TOTAL)] = 1_800_000_000_000 / scale;
                w[at(weft_codegen::METRIC_CPU_TOTAL)] = 1_000_000_000_000 / scale;
                w[at(weft_codegen::METRIC_HIST) + i % 30] = 17;
            }
            row(t, 100 + t, layout::ROW_LIVE, w)
        })
        .collect();
    Report::build(1, 5, &probes, &rows, 0, |tid| {
        Some(format!("worker-thread-with-a-long-name-{tid}"))
    })
}

fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

#[test]
fn two_thousand_functions_fit_120_columns() {
    let r = big_report(2_000, 3);
    for options in [
        TableOptions::default(),
        TableOptions {
            top: Some(0),
            ..TableOptions::default()
        },
        TableOptions {
            by_thread: true,
            sort: Some(SortKey::SelfTime),
            top: Some(0),
            histograms: vec!["f3".into(), "nope".into()],
            ..TableOptions::default()
        },
    ] {
        let table = r.to_table_with(&options);
        let wide: Vec<&str> = table
            .lines()
            .filter(|l| l.chars().count() > TABLE_WIDTH)
            .collect();
        assert!(wide.is_empty(), "{options:?}: {wide:#?}");
        assert!(widest(&table) <= TABLE_WIDTH);
        // The long form: a header and one row per function shown.
        assert!(
            table.contains("FUNCTION") && table.contains("SELF/CALL"),
            "{table}"
        );
    }
    // Default: the first 50, and a line saying what was left out.
    let table = r.to_table();
    let rows = table
        .lines()
        .filter(|l| l.contains("libc.so.6") || l.contains('…') && l.contains("lib"))
        .count();
    assert!(rows >= 50, "{rows}\n{table}");
    assert!(
        table.contains("… 1950 more function(s) not shown"),
        "{table}"
    );
    assert!(table.contains("top 50 of 2000"), "{table}");
    // --top 0: every function, each once.
    let all = r.to_table_with(&TableOptions {
        top: Some(0),
        ..TableOptions::default()
    });
    assert!(!all.contains("more function(s) not shown"));
    let f_rows = all
        .lines()
        .filter(|l| l.starts_with('f') && (l.contains("libc.so.6") || l.contains("libsomethi")))
        .count();
    assert_eq!(f_rows, 667, "{all}");
    // Long names are cut in the middle, keeping both ends.
    assert!(all.contains("std::__detail:…e_node1 "), "{all}");
    assert!(all.contains(" libsomethi…1.2.3 "), "{all}");
    // The histograms asked for, and a word for the one without.
    let with = r.to_table_with(&TableOptions {
        histograms: vec!["f3".into()],
        top: Some(5),
        ..TableOptions::default()
    });
    assert!(
        with.contains("latency of f3: 51 call(s) (outermost, wall time, all threads)"),
        "{with}"
    );
    assert!(
        with.contains("[     8 ns,     16 ns)             51  ####"),
        "{with}"
    );
}

/// The long table's function rows as (name, header → cell), the
/// cells cut at the headers' right edges (numbers are right-aligned).
fn long_rows(table: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("FUNCTION"));
    let header = lines.next().expect("a header");
    let mut edges = Vec::new();
    let mut at = 0;
    for name in header.split_whitespace() {
        let start = at + header[at..].find(name).unwrap();
        at = start + name.len();
        edges.push((name.to_string(), start, at));
    }
    lines
        .take_while(|l| !l.is_empty() && !l.starts_with('…') && !l.starts_with("threads"))
        .map(|l| {
            let chars: Vec<char> = l.chars().collect();
            let cut = |a: usize, b: usize| -> String {
                chars[a.min(chars.len())..b.min(chars.len())]
                    .iter()
                    .collect::<String>()
                    .trim()
                    .to_string()
            };
            let mut cells = BTreeMap::new();
            for (i, (name, start, end)) in edges.iter().enumerate() {
                let cell = match i {
                    // Left-aligned: to the next header's start.
                    0 | 1 => cut(*start, edges[i + 1].1),
                    // After the module: one word (digits and commas).
                    2 => cut(0, *end)
                        .rsplit(' ')
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                    _ => cut(edges[i - 1].2, *end),
                };
                cells.insert(name.clone(), cell);
            }
            (cells["FUNCTION"].clone(), cells)
        })
        .collect()
}

#[test]
fn mixed_user_and_kernel_rows_keep_their_columns_and_hide_uncalled_probes() {
    let user = FunctionReport {
        calls: 4,
        wall_ns: Some(8_000_000),
        self_ns: Some(2_000_000),
        cpu_ns: Some(6_000_000),
        threads: 1,
        ..FunctionReport::empty("handler".into(), "exe".into(), "0x1".into())
    };
    let kernel = |name: &str, calls, wall, cpu| FunctionReport {
        calls,
        wall_ns: Some(wall),
        cpu_ns: Some(cpu),
        threads: u32::from(calls > 0),
        mechanism: Some("raw_syscalls tracepoints"),
        ..FunctionReport::empty(format!("syscall:{name}"), "syscall".into(), "-".into())
    };
    let r = Report {
        pid: 1,
        duration_ns: 1,
        metrics: vec!["calls", "wall", "cpu"],
        clocks: None,
        functions: vec![
            user,
            kernel("read", 2, 3_000_000, 1_000_000),
            kernel("openat", 0, 0, 0),
            kernel("close", 0, 0, 0),
        ],
        threads: Vec::new(),
        overflow_threads: 0,
        runtime: None,
        kernel: None,
        trace: None,
        trace_log: None,
    };
    let table = r.to_table_with(&TableOptions {
        top: Some(0),
        ..TableOptions::default()
    });
    let rows = long_rows(&table);
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ["handler", "syscall:read"], "{table}");
    let cell = |row: usize, column: &str| rows[row].1[column].as_str();
    assert_eq!(
        [
            "CALLS",
            "WALL",
            "SELF",
            "CPU",
            "WALL/CALL",
            "SELF/CALL",
            "THREADS"
        ]
        .map(|c| cell(1, c)),
        ["2", "3.00 ms", "-", "1.00 ms", "1.50 ms", "-", "1"],
        "{table}"
    );
    assert_eq!(
        ["CALLS", "WALL", "SELF", "CPU", "WALL/CALL", "SELF/CALL"].map(|c| cell(0, c)),
        ["4", "8.00 ms", "2.00 ms", "6.00 ms", "2.00 ms", "500.0 µs"],
        "{table}"
    );
    assert!(
        table.contains("… 2 kernel probe(s) with no calls not shown"),
        "{table}"
    );
    // The JSON report keeps them.
    assert!(r.to_json().contains("syscall:openat"));
}

#[test]
fn long_table_sorts_and_reports_self_time_and_averages() {
    // entries, exits, unwound, unhooked, nesting, seq, wall, -, cpu, -, self
    let timed = |calls, wall, cpu, own| {
        let mut w = vec![0u64; (weft_codegen::TIMER_METRIC_LEN / 8) as usize];
        w[0] = calls;
        w[timer_word(weft_codegen::METRIC_WALL_TOTAL)] = wall;
        w[timer_word(weft_codegen::METRIC_CPU_TOTAL)] = cpu;
        w[timer_word(weft_codegen::METRIC_SELF_TOTAL)] = own;
        w
    };
    let names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
    let figures = [
        (10, 5_000, 4_000, 1_000),
        (1_000, 3_000, 2_000, 3_000),
        (3, 9_000, 100, 9_000),
        (7, 1_000, 900, 500),
        (2, 0, 0, 0),
        (5, 2_000, 8_000, 2_000),
    ];
    let len = (weft_codegen::TIMER_METRIC_LEN / 8) as u32;
    let probes: Vec<ProbeInfo> = names
        .iter()
        .enumerate()
        .map(|(i, n)| ProbeInfo {
            name: (*n).into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: i as u64,
            calls_word: i as u32 * len,
            metrics: crate::exits::Metrics::ALL,
        })
        .collect();
    let words: Vec<u64> = figures
        .iter()
        .flat_map(|&(c, w, u, s)| timed(c, w, u, s))
        .collect();
    let r = Report::build(
        1,
        5,
        &probes,
        &[row(0, 10, layout::ROW_LIVE, words)],
        0,
        |_| None,
    );
    let order = |sort: Option<SortKey>| -> Vec<String> {
        let t = r.to_table_with(&TableOptions {
            sort,
            top: Some(3),
            ..TableOptions::default()
        });
        t.lines()
            .filter(|l| l.contains(" exe "))
            .take(3)
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect()
    };
    assert_eq!(order(None), ["gamma", "alpha", "beta"]);
    assert_eq!(order(Some(SortKey::Calls)), ["beta", "alpha", "delta"]);
    assert_eq!(order(Some(SortKey::Cpu)), ["zeta", "alpha", "beta"]);
    assert_eq!(order(Some(SortKey::SelfTime)), ["gamma", "beta", "zeta"]);
    assert_eq!(order(Some(SortKey::Name)), ["alpha", "beta", "delta"]);
    // Six functions: the long table by default, a line for the rest.
    let t = r.to_table_with(&TableOptions {
        top: Some(4),
        ..TableOptions::default()
    });
    assert!(
        t.contains("… 2 more function(s) not shown: 9 calls, 1.0 µs wall"),
        "{t}"
    );
    // Per-call averages: alpha 5 µs / 10 calls.
    let alpha = t.lines().find(|l| l.starts_with("alpha")).unwrap();
    let cells: Vec<&str> = alpha
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        ["alpha", "exe", "10", "5.0 µs", "1.0 µs", "4.0 µs", "500 ns", "100 ns", "1"],
        "{t}"
    );
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let f = &json["functions"][0];
    assert_eq!(
        (f["self_ns"].as_u64(), f["wall_ns_per_call"].as_u64()),
        (Some(1_000), Some(500))
    );
    assert_eq!(
        (
            f["self_ns_per_call"].as_u64(),
            f["cpu_ns_per_call"].as_u64()
        ),
        (Some(100), Some(400))
    );
    assert_eq!(f["threads"], 1);
    assert!(f.get("histogram").is_none());
    assert_eq!(json["threads"][0]["functions"]["alpha"]["self_ns"], 1_000);
    // No histogram without one; the compact table for few functions.
    let few = Report::build(
        1,
        5,
        &probes[..2],
        &[row(
            0,
            10,
            layout::ROW_LIVE,
            timed(4, 8, 4, 2)
                .into_iter()
                .chain(timed(1, 1, 1, 1))
                .collect(),
        )],
        0,
        |_| None,
    );
    let t = few.to_table();
    assert!(t.lines().nth(1).unwrap().starts_with("TID"), "{t}");
    assert!(t.contains("self"), "{t}");
}

#[test]
fn histograms_serialise_their_non_empty_buckets() {
    let mut h = Histogram::empty();
    h.counts[0] = 1;
    h.counts[13] = 20;
    h.counts[weft_codegen::HIST_BUCKETS - 1] = 2;
    let json = serde_json::to_string(&h).unwrap();
    assert_eq!(
        json,
        r#"[{"from_ns":0,"to_ns":2,"count":1},{"from_ns":8192,"to_ns":16384,"count":20},{"from_ns":549755813888,"count":2}]"#
    );
    let mut out = String::new();
    histogram_text("f", &h, &mut out);
    assert_eq!(out.lines().count(), 1 + weft_codegen::HIST_BUCKETS);
    assert!(out.contains("23 call(s)"), "{out}");
    assert_eq!(ellipsize("abcdefghij", 7), "abcd…ij");
    assert_eq!(ellipsize("abc", 7), "abc");
}

#[test]
fn digits_are_grouped() {
    assert_eq!(group_digits(0), "0");
    assert_eq!(group_digits(999), "999");
    assert_eq!(group_digits(1000), "1,000");
    assert_eq!(group_digits(1234567), "1,234,567");
}

/// The library's table names no command-line flag; a caller's hints go in
/// parentheses on each line that leaves something out.
#[test]
fn table_hints_come_from_the_caller() {
    let r = big_report(2_000, 3);
    let plain = r.to_table_with(&TableOptions {
        by_thread: true,
        histograms: vec!["f3".into()],
        ..TableOptions::default()
    });
    assert!(plain.contains("more function(s) not shown"), "{plain}");
    assert!(
        !plain.contains("--"),
        "a flag in the library's table: {plain}"
    );
    let hints = TableHints {
        show_all: Some("SHOW ALL"),
        by_thread: Some("BY THREAD"),
        write_trace: Some("WRITE TRACE"),
        keep_histogram: Some("KEEP HISTOGRAM"),
    };
    let hinted = r.to_table_with(&TableOptions {
        by_thread: false,
        hints,
        ..TableOptions::default()
    });
    assert!(hinted.contains("not shown: "), "{hinted}");
    assert!(hinted.contains("(SHOW ALL)"), "{hinted}");
}

/// Several processes: totals by module and name over the processes that
/// have the function, times summed only where measured, busiest first;
/// the table shows each process, then the totals.
#[test]
fn processes_report_sums_functions_by_module_and_name() {
    let report = |pid: i32, functions: Vec<FunctionReport>| Report {
        pid,
        duration_ns: 1_000_000_000 + pid as u64,
        metrics: vec!["calls", "wall"],
        clocks: None,
        functions,
        threads: Vec::new(),
        overflow_threads: 0,
        runtime: None,
        kernel: None,
        trace: None,
        trace_log: None,
    };
    let function = |name: &str, module: &str, calls: u64, wall: Option<u64>| FunctionReport {
        calls,
        wall_ns: wall,
        threads: 2,
        ..FunctionReport::empty(name.into(), module.into(), "0x1000".into())
    };
    let both = ProcessesReport::new(vec![
        ProcessReport {
            command: "nginx".into(),
            exited: false,
            report: report(
                101,
                vec![
                    function("serve", "nginx", 10, Some(500)),
                    function("log", "nginx", 3, Some(30)),
                ],
            ),
        },
        ProcessReport {
            command: "nginx".into(),
            exited: true,
            report: report(
                102,
                vec![
                    function("serve", "nginx", 5, Some(200)),
                    // Another module's function of the same name.
                    function("log", "libc.so.6", 7, None),
                ],
            ),
        },
    ]);
    assert_eq!(both.duration_ns, 1_000_000_102);
    type Total<'a> = (&'a str, &'a str, u64, Option<u64>, u32, u32);
    let totals: Vec<Total> = both
        .totals
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.module.as_str(),
                t.calls,
                t.wall_ns,
                t.processes,
                t.threads,
            )
        })
        .collect();
    assert_eq!(
        totals,
        vec![
            ("serve", "nginx", 15, Some(700), 2, 4),
            ("log", "nginx", 3, Some(30), 1, 2),
            ("log", "libc.so.6", 7, None, 1, 2),
        ]
    );
    let table = both.to_table_with(&TableOptions::default());
    assert!(table.contains("== pid 101 (nginx)\n"), "{table}");
    assert!(table.contains("== pid 102 (nginx), exited\n"), "{table}");
    assert!(table.contains("== total over 2 processes"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&both.to_json()).unwrap();
    assert_eq!(json["processes"][1]["pid"], 102);
    assert_eq!(json["processes"][1]["exited"], true);
    assert_eq!(json["totals"][0]["calls"], 15);
}
