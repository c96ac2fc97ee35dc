//! The Trace Event Format's JSON object form, written as a stream: the
//! opening and the process's name, then one event after another, then
//! `displayTimeUnit` and `otherData`. The one writer of weft's Chrome
//! traces, for call traces ([`TraceLog::write_chrome_trace`], millions of
//! events that are never all in memory) and for the consultant's timeline
//! (`Diagnosis::to_chrome_trace`, built as JSON values).
//!
//! [`TraceLog::write_chrome_trace`]: super::TraceLog::write_chrome_trace

use serde_json::Value;
use std::io::{self, Write};

/// A Trace Event Format object being written to `W`.
pub struct ChromeTrace<W: Write> {
    out: W,
}

impl<W: Write> ChromeTrace<W> {
    /// Opens the object and names process `pid` `process` (its `ph: "M"`
    /// `process_name` event).
    pub fn begin(mut out: W, pid: i32, process: &str) -> io::Result<ChromeTrace<W>> {
        write!(
            out,
            "{{\"traceEvents\":[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{pid},\"args\":{{\"name\":{}}}}}",
            json_string(process)
        )?;
        Ok(ChromeTrace { out })
    }

    /// Names track `tid` of process `pid` (a `thread_name` event).
    pub fn thread_name(&mut self, pid: i32, tid: u64, name: &str) -> io::Result<()> {
        write!(
            self.out,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
            json_string(name)
        )
    }

    /// One event, already a JSON object in text: the hot path of a call
    /// trace, where names are escaped once per function.
    pub fn raw(&mut self, event: std::fmt::Arguments<'_>) -> io::Result<()> {
        self.out.write_all(b",\n")?;
        self.out.write_fmt(event)
    }

    /// One event as a JSON value.
    pub fn event(&mut self, event: &Value) -> io::Result<()> {
        self.out.write_all(b",\n")?;
        serde_json::to_writer(&mut self.out, event).map_err(io::Error::from)
    }

    /// Closes the object with the time unit viewers show (`"ns"`, `"ms"`)
    /// and `other` as `otherData`; returns the writer, flushed.
    pub fn finish(mut self, display_time_unit: &str, other: &Value) -> io::Result<W> {
        writeln!(
            self.out,
            "\n],\n\"displayTimeUnit\":{},\n\"otherData\":{other}}}",
            json_string(display_time_unit)
        )?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// `s` as a JSON string, quotes included.
pub fn json_string(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_one_json_object() {
        let mut t = ChromeTrace::begin(Vec::new(), 7, "a \"b\"").unwrap();
        t.thread_name(7, 8, "worker").unwrap();
        t.raw(format_args!(
            "{{\"name\":\"f\",\"ph\":\"B\",\"ts\":1.5,\"pid\":7,\"tid\":8}}"
        ))
        .unwrap();
        t.event(&serde_json::json!({"name": "f", "ph": "E", "ts": 2.5, "pid": 7, "tid": 8}))
            .unwrap();
        let out = t
            .finish("ns", &serde_json::json!({"tool": "weft"}))
            .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0]["args"]["name"], "a \"b\"");
        assert_eq!(events[1]["args"]["name"], "worker");
        assert_eq!(events[3]["ph"], "E");
        assert_eq!(v["displayTimeUnit"], "ns");
        assert_eq!(v["otherData"]["tool"], "weft");
    }
}
