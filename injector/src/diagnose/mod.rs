//! The Performance Consultant's search (issue #14), after Paradyn: which
//! hypothesis to test where, when a test concludes, and how a true test is
//! refined down the call graph. Pure decision logic for now; the driver
//! that instruments the tests (`weft diagnose`) is not built yet — see
//! `docs/diagnose.md` for the plan and what exists.

mod consultant;
mod decision;
mod graph;
mod search;

pub use consultant::{Bottleneck, Consultant, Diagnosis, NodeReport, Options, Progress, Summary};
pub use decision::{Decision, Hypothesis, Reading, Thresholds, Verdict};
pub use graph::{Calls, StaticCallGraph};
pub use search::{CallGraph, Change, Focus, Node, NodeId, Search, State};
