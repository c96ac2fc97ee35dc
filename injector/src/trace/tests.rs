use super::output::Step;
use super::*;

fn log() -> TraceLog {
    let mut log = TraceLog::new(1, 0, 16, 1 << 32, DEFAULT_BUDGET);
    for (base, name) in [(256, "a"), (264, "b"), (272, "c"), (280, "d")] {
        log.names.insert(base, name.into());
    }
    log
}

fn thread() -> ThreadTrace {
    ThreadTrace::new(1, "t".into(), (0, 0), 0)
}

/// `(event, function name, ended, ns)` of a thread's replay, gaps as
/// `("gap", "N", from, to)`.
fn steps(log: &TraceLog, t: &ThreadTrace) -> Vec<(&'static str, String, CallEnd, u64)> {
    let mut out = Vec::new();
    log.replay(t, 0, |s| {
        out.push(match s {
            Step::Begin {
                function,
                ended,
                ns,
            } => ("B", log.function_name(function), ended, ns),
            Step::End {
                function,
                ended,
                ns,
            } => ("E", log.function_name(function), ended, ns),
            Step::Gap { count, from, to } => ("gap", format!("{count} {from}"), CallEnd::Lost, to),
        });
        Ok(())
    })
    .unwrap();
    out
}

fn ev(log: &TraceLog, t: &mut ThreadTrace, time: u64, function: u32, kind: u32, depth: u32) {
    t.event(&log.spill, time, function, kind, depth).unwrap();
}

#[test]
fn nesting_is_rebuilt_from_depths_even_with_lost_events() {
    let log = log();
    let mut t = thread();
    // a(0) { b(1) {} b(1) { c(2) <exit lost> } <entry of d lost> d-exit(1) }
    ev(&log, &mut t, 10, 256, ring::KIND_ENTRY, 0);
    ev(&log, &mut t, 11, 264, ring::KIND_ENTRY, 1);
    ev(&log, &mut t, 12, 264, ring::KIND_EXIT, 1);
    ev(&log, &mut t, 13, 264, ring::KIND_ENTRY, 1);
    ev(&log, &mut t, 14, 272, ring::KIND_ENTRY, 2);
    ev(&log, &mut t, 15, 264, ring::KIND_EXIT, 1);
    ev(&log, &mut t, 16, 280, ring::KIND_EXIT, 1);
    ev(&log, &mut t, 17, 256, ring::KIND_UNWOUND, 0);
    use CallEnd::*;
    let want = [
        ("B", "a", Unwound, 10),
        ("B", "b", Returned, 11),
        ("E", "b", Returned, 12),
        ("B", "b", Returned, 13),
        ("B", "c", Lost, 14),
        ("E", "c", Lost, 15),
        ("E", "b", Returned, 15),
        ("E", "a", Unwound, 17),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|&(e, f, c, ns)| (e, f.to_string(), c, ns))
        .collect();
    assert_eq!(steps(&log, &t), want);
    assert_eq!((t.orphan_exits, t.lost_exits, t.calls), (1, 1, 4));
}

#[test]
fn calls_with_equal_times_nest_by_their_order_and_time_never_goes_back() {
    let log = log();
    let mut t = thread();
    // a(0) { b(1) { c(2) } } on one timestamp (a coarse TSC), then d(0)
    // whose entry reads an earlier time than a's exit.
    for (time, f, kind, depth) in [
        (10, 256, ring::KIND_ENTRY, 0),
        (10, 264, ring::KIND_ENTRY, 1),
        (10, 272, ring::KIND_ENTRY, 2),
        (20, 272, ring::KIND_EXIT, 2),
        (20, 264, ring::KIND_EXIT, 1),
        (20, 256, ring::KIND_EXIT, 0),
        (19, 280, ring::KIND_ENTRY, 0),
        (25, 280, ring::KIND_EXIT, 0),
    ] {
        ev(&log, &mut t, time, f, kind, depth);
    }
    let got: Vec<(&str, String, u64)> = steps(&log, &t)
        .into_iter()
        .map(|(e, f, _, ns)| (e, f, ns))
        .collect();
    let want = [
        ("B", "a", 10),
        ("B", "b", 10),
        ("B", "c", 10),
        ("E", "c", 20),
        ("E", "b", 20),
        ("E", "a", 20),
        ("B", "d", 20),
        ("E", "d", 25),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|&(e, f, ns)| (e, f.to_string(), ns))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn gaps_are_slices_where_events_were_lost_and_open_calls_end_last() {
    let mut log = log();
    let mut t = thread();
    ev(&log, &mut t, 10, 256, ring::KIND_ENTRY, 0);
    ev(&log, &mut t, 12, 264, ring::KIND_ENTRY, 1);
    // The ring filled: 7 events lost, among them b's exit; then c(1).
    t.gap(7, 30);
    ev(&log, &mut t, 30, 272, ring::KIND_ENTRY, 1);
    ev(&log, &mut t, 31, 272, ring::KIND_EXIT, 1);
    // More drops after the last event read, and then the budget.
    t.pending_gap = Some((100, 3));
    t.discard(40);
    t.discard(50);
    log.threads.push(t);
    let t = &log.threads[0];
    use CallEnd::*;
    let got = steps(&log, t);
    let want = [
        ("B", "a", Lost, 10),
        ("B", "b", Lost, 12),
        ("gap", "7 12", Lost, 30),
        ("E", "b", Lost, 30),
        ("B", "c", Returned, 30),
        ("E", "c", Returned, 31),
        ("gap", "3 31", Lost, 31),
        ("gap", "2 31", Lost, 50),
        ("E", "a", Lost, 50),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|&(e, f, c, ns)| (e, f.to_string(), c, ns))
        .collect();
    assert_eq!(got, want);
    // The Chrome trace has them as slices on the thread's track.
    let text = log.to_chrome_trace().unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let gaps: Vec<&serde_json::Value> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "weft-gap" && e["ph"] == "B")
        .collect();
    assert_eq!(gaps.len(), 3, "{text}");
    assert_eq!(gaps[0]["name"], "weft: 7 events lost");
    assert_eq!(gaps[0]["args"]["lost_events"], 7);
    assert_eq!(json["otherData"]["discarded_events"], 2);
}

#[test]
fn folded_stacks_are_self_times() {
    let mut log = log();
    let mut t = thread();
    ev(&log, &mut t, 0, 256, ring::KIND_ENTRY, 0);
    ev(&log, &mut t, 10, 264, ring::KIND_ENTRY, 1);
    ev(&log, &mut t, 30, 264, ring::KIND_EXIT, 1);
    t.gap(5, 40);
    ev(&log, &mut t, 100, 256, ring::KIND_EXIT, 0);
    log.threads.push(t);
    assert_eq!(
        log.folded(false).unwrap(),
        ["a 70", "a;b 20", "a;weft: events lost 10"]
    );
    assert_eq!(
        log.folded(true).unwrap(),
        ["t (1);a 70", "t (1);a;b 20", "t (1);a;weft: events lost 10"]
    );
}

#[test]
fn a_trace_without_calls_is_an_empty_flame_graph_and_chrome_trace() {
    let log = log();
    let svg = log.to_flamegraph(false).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("no calls were traced"), "{svg}");
    let json: serde_json::Value = serde_json::from_str(&log.to_chrome_trace().unwrap()).unwrap();
    assert_eq!(json["traceEvents"].as_array().map(Vec::len), Some(1));
}

#[test]
fn budget_sizes_parse() {
    assert_eq!(parse_size("512M"), Some(512 << 20));
    assert_eq!(parse_size("4g"), Some(4 << 30));
    assert_eq!(parse_size("2GiB"), Some(2 << 30));
    assert_eq!(parse_size("1048576"), Some(1 << 20));
    assert_eq!(parse_size("1000"), None, "under 1 MiB");
    assert_eq!(parse_size("lots"), None);
}
