//! The search's history on a timeline: the Trace Event Format JSON that
//! `--format chrome-trace` writes for call traces (docs/trace.md), for the
//! Perfetto UI, chrome://tracing or speedscope.
//!
//! Each measured test is a slice from its first reading to its conclusion
//! (false, fallen, taken out) or the search's end, with a nested `true`
//! slice while it held true. Tests of one thread run side by side
//! (siblings are tested together), and a viewer's track must nest, so
//! each target thread gets as many tracks ("lanes") as it had tests
//! running at once, named after it.

use super::consultant::{Diagnosis, NodeReport, TestState};
use crate::trace::chrome::ChromeTrace;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Lane track IDs start above any Linux TID (`PID_MAX_LIMIT` is 2^22), so
/// a lane never takes the number of one of the target's threads.
const FIRST_LANE_TID: u64 = 1 << 22;

impl Diagnosis {
    /// The tests as a Trace Event Format JSON object (see the module
    /// docs), as process `pid` named `process`.
    pub fn to_chrome_trace(&self, pid: i32, process: &str) -> String {
        chrome_trace(self, pid, process, &self.threads)
    }
}

fn chrome_trace(
    diagnosis: &Diagnosis,
    pid: i32,
    process: &str,
    thread_names: &BTreeMap<u32, String>,
) -> String {
    let end = diagnosis.summary.seconds;
    let mut by_thread: BTreeMap<u32, Vec<&NodeReport>> = BTreeMap::new();
    for n in &diagnosis.nodes {
        if n.began.is_some() {
            by_thread.entry(n.thread).or_default().push(n);
        }
    }
    let us = |s: f64| (s * 1e6 * 1000.0).round() / 1000.0;
    let mut events = Vec::new();
    let mut lane_tid = FIRST_LANE_TID;
    for (thread, mut nodes) in by_thread {
        nodes.sort_by(|a, b| a.began.unwrap_or(0.0).total_cmp(&b.began.unwrap_or(0.0)));
        // Greedy interval partitioning: a test goes on the first lane
        // whose last test ended before it began.
        let mut lanes: Vec<(u64, f64)> = Vec::new();
        let name = thread_names.get(&thread).map_or("thread", String::as_str);
        for n in nodes {
            let began = n.began.unwrap_or(0.0);
            let ended = n.ended.unwrap_or(end).max(began);
            let tid = match lanes.iter_mut().find(|(_, last)| *last <= began) {
                Some(lane) => {
                    lane.1 = ended;
                    lane.0
                }
                None => {
                    let tid = lane_tid;
                    lane_tid += 1;
                    events.push(json!({
                        "ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": format!("{name} ({thread}) tests {}", lanes.len() + 1)},
                    }));
                    events.push(json!({
                        "ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": tid - FIRST_LANE_TID},
                    }));
                    lanes.push((tid, ended));
                    tid
                }
            };
            let what = format!("{} {}", n.hypothesis, n.path.join(" > "));
            let mut args = json!({
                "hypothesis": n.hypothesis,
                "path": n.path,
                "thread": n.thread,
                "state": n.state,
                "value": n.value,
                "threshold": n.threshold,
            });
            if let Some(reason) = &n.reason {
                args["reason"] = json!(reason);
            }
            events.push(json!({
                "ph": "X", "cat": "diagnose", "name": what, "pid": pid, "tid": tid,
                "ts": us(began), "dur": us(ended - began),
                "cname": match n.state {
                    TestState::True => "terrible",
                    TestState::False => "good",
                    _ => "grey",
                },
                "args": args,
            }));
            if let Some(true_at) = n.true_at {
                let from = true_at.clamp(began, ended);
                let until = match n.state {
                    TestState::True => ended,
                    // It fell: true until then.
                    _ => n.ended.unwrap_or(ended).clamp(from, ended),
                };
                events.push(json!({
                    "ph": "X", "cat": "diagnose", "name": format!("{what}: true"),
                    "pid": pid, "tid": tid, "ts": us(from), "dur": us(until - from),
                    "cname": "terrible",
                    "args": {"state": "true", "value": n.value},
                }));
            }
        }
    }
    let other = json!({
        "tool": "weft diagnose",
        "tests": diagnosis.summary.tests,
        "seconds": end,
        "exhausted": diagnosis.summary.exhausted,
    });
    write(pid, &format!("weft diagnose: {process}"), &events, &other)
        .expect("writing JSON to memory cannot fail")
}

/// The events as one Trace Event Format object (the writer call traces use).
fn write(pid: i32, process: &str, events: &[Value], other: &Value) -> std::io::Result<String> {
    let mut trace = ChromeTrace::begin(Vec::new(), pid, process)?;
    for event in events {
        trace.event(event)?;
    }
    let bytes = trace.finish("ms", other)?;
    String::from_utf8(bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::Summary;

    fn node(path: &[&str], began: f64, true_at: Option<f64>, ended: Option<f64>) -> NodeReport {
        NodeReport {
            hypothesis: "cpu".into(),
            path: path.iter().map(|s| s.to_string()).collect(),
            thread: 7,
            state: if ended.is_some() {
                TestState::False
            } else {
                TestState::True
            },
            value: Some(0.5),
            threshold: 0.3,
            reason: None,
            was_true: None,
            began: Some(began),
            true_at,
            ended,
        }
    }

    #[test]
    fn tests_running_together_get_lanes_of_their_own() {
        let d = Diagnosis {
            bottlenecks: vec![],
            idle: vec![],
            summary: Summary {
                seconds: 10.0,
                ..Summary::default()
            },
            nodes: vec![
                node(&["main"], 0.0, Some(0.0), None),
                node(&["main", "a"], 1.0, None, Some(3.0)),
                node(&["main", "b"], 1.0, Some(2.5), None),
                node(&["main", "c"], 3.5, None, Some(5.0)),
            ],
            threads: [(7, "w".to_string())].into(),
        };
        let v: Value = serde_json::from_str(&d.to_chrome_trace(42, "x")).unwrap();
        let slices: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X" && !e["name"].as_str().unwrap().ends_with(": true"))
            .collect();
        let lane = |name: &str| {
            slices
                .iter()
                .find(|e| e["name"] == name)
                .map(|e| e["tid"].as_u64().unwrap() - FIRST_LANE_TID)
                .unwrap()
        };
        // main spans the search; a and b overlap; c reuses a's lane.
        assert_eq!(lane("cpu main"), 0);
        assert_eq!(lane("cpu main > a"), 1);
        assert_eq!(lane("cpu main > b"), 2);
        assert_eq!(lane("cpu main > c"), 1);
        let b_true = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "cpu main > b: true")
            .unwrap();
        assert_eq!(b_true["ts"], 2_500_000.0);
        assert_eq!(b_true["dur"], 7_500_000.0);
        let names: Vec<&str> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["w (7) tests 1", "w (7) tests 2", "w (7) tests 3"]);
    }
}
