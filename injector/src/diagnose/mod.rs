//! The Performance Consultant (issue #14), after Paradyn: which hypothesis
//! to test where, when a test concludes, how a true test is refined down
//! the call graph ([`Search`], pure), and the driver that runs it on a
//! live process ([`Consultant`]: starts from the threads' live stacks,
//! instruments each test, samples what threads wait on, bounds its own
//! cost). See `docs/diagnose.md`.

mod consultant;
mod cost;
mod decision;
mod graph;
mod roots;
mod search;
mod timeline;
mod waits;

pub use consultant::{
    Bottleneck, Consultant, CustomHypothesis, Diagnosis, Measure, NodeReport, Options, Progress,
    Summary, TestState, SMALL_IO_BYTES, SMALL_IO_RATE,
};
pub use decision::{
    Decision, Hypothesis, HypothesisName, Reading, Thresholds, Verdict, MAX_CUSTOM,
};
pub use graph::{Calls, StaticCallGraph};
pub use search::{CallGraph, Change, Focus, Node, NodeId, Search, Setback, State};
