//! When a test concludes: Paradyn's decision rule, on one node's value.
//!
//! A test's value is a share of the time of the threads in its focus (CPU
//! time in the function, time blocked in synchronization or in I/O under
//! it), measured from the moment its instrumentation went in. It is
//! compared with the hypothesis's threshold with a band of hysteresis: the
//! test turns true only above `threshold × (1 + h)`, false only below
//! `threshold × (1 − h)`, and either only once the value has stayed on that
//! side for the minimum observation time. Between the two, it keeps
//! testing. A true node keeps being watched (its children are being tested
//! under it) over a window of the most recent observation time, and turns
//! false again when that window's value falls below the band: the report
//! keeps the interval it was true.

use std::time::Duration;

/// What is being looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hypothesis {
    /// The threads spend their CPU time here.
    CpuBound,
    /// The threads wait here for locks, condition variables, joins…
    SyncWaiting,
    /// The threads wait here for reads, writes, polls…
    IoBlocking,
    /// A tool's own: the threads spend their time in a set of functions it
    /// names (`Options::custom`, by index).
    Custom(u8),
}

/// A hypothesis as reported: one of weft's own, or a custom one by its
/// name. Serialized, shown and ordered as its name (`cpu`, `sync`, `io`,
/// the custom one's own), as the reports always spelled it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HypothesisName {
    /// [`Hypothesis::CpuBound`]: `cpu`.
    Cpu,
    /// [`Hypothesis::SyncWaiting`]: `sync`.
    Sync,
    /// [`Hypothesis::IoBlocking`]: `io`.
    Io,
    /// A custom hypothesis, by its name (never one of the three above:
    /// [`HypothesisName::from_name`] makes a custom hypothesis named
    /// like a built-in one that one, as their names compared equal).
    Custom(String),
}

impl HypothesisName {
    /// The hypothesis reported as `name`.
    pub fn from_name(name: &str) -> HypothesisName {
        match name {
            n if n == Hypothesis::CpuBound.name() => HypothesisName::Cpu,
            n if n == Hypothesis::SyncWaiting.name() => HypothesisName::Sync,
            n if n == Hypothesis::IoBlocking.name() => HypothesisName::Io,
            n => HypothesisName::Custom(n.to_string()),
        }
    }

    /// The name in reports and JSON.
    pub fn as_str(&self) -> &str {
        match self {
            HypothesisName::Cpu => Hypothesis::CpuBound.name(),
            HypothesisName::Sync => Hypothesis::SyncWaiting.name(),
            HypothesisName::Io => Hypothesis::IoBlocking.name(),
            HypothesisName::Custom(name) => name,
        }
    }
}

impl std::fmt::Display for HypothesisName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl serde::Serialize for HypothesisName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// By name, as the reports ordered the names they were.
impl Ord for HypothesisName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for HypothesisName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl From<&str> for HypothesisName {
    fn from(name: &str) -> Self {
        HypothesisName::from_name(name)
    }
}

impl PartialEq<str> for HypothesisName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for HypothesisName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Most custom hypotheses one search tests.
pub const MAX_CUSTOM: usize = 8;

impl Hypothesis {
    /// The name used in reports and JSON (`cpu`, `sync`, `io`).
    pub fn name(&self) -> &'static str {
        match self {
            Hypothesis::CpuBound => "cpu",
            Hypothesis::SyncWaiting => "sync",
            Hypothesis::IoBlocking => "io",
            Hypothesis::Custom(_) => "custom",
        }
    }
}

/// The decision parameters, with Paradyn's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Share of a thread's time on the CPU in the focus (0.30).
    pub cpu: f64,
    /// Share of a thread's time waiting for synchronization (0.20).
    pub sync: f64,
    /// Share of a thread's time blocked in I/O (0.20).
    pub io: f64,
    /// Half the width of the band around a threshold, relative to it
    /// (0.05: a 0.30 threshold turns true above 0.315, false below 0.285).
    pub hysteresis: f64,
    /// How long a value must stay on one side of the band before the test
    /// concludes.
    pub min_observation: Duration,
    /// The custom hypotheses' thresholds, by index (0.20 each).
    pub custom: [f64; MAX_CUSTOM],
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            cpu: 0.30,
            sync: 0.20,
            io: 0.20,
            hysteresis: 0.05,
            min_observation: Duration::from_secs(1),
            custom: [0.20; MAX_CUSTOM],
        }
    }
}

impl Thresholds {
    /// The threshold of `h`.
    pub fn of(&self, h: Hypothesis) -> f64 {
        match h {
            Hypothesis::CpuBound => self.cpu,
            Hypothesis::SyncWaiting => self.sync,
            Hypothesis::IoBlocking => self.io,
            Hypothesis::Custom(i) => self.custom.get(usize::from(i)).copied().unwrap_or(0.20),
        }
    }
}

/// One reading of a test's figures: cumulative since the test began.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Reading {
    /// When, since the test began.
    pub at: Duration,
    /// Time the hypothesis counts (CPU in the focus, blocked…), ns.
    pub part_ns: u64,
    /// The focus threads' whole time over the same span, ns.
    pub whole_ns: u64,
}

impl Reading {
    fn share_since(&self, earlier: &Reading) -> Option<f64> {
        let whole = self.whole_ns.checked_sub(earlier.whole_ns)?;
        let part = self.part_ns.saturating_sub(earlier.part_ns);
        (whole > 0).then(|| (part as f64 / whole as f64).min(1.0))
    }
}

/// Where a test stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Not concluded: too early, or inside the band.
    Testing,
    /// True since `since` (test time).
    True {
        /// When it turned true.
        since: Duration,
    },
    /// False: it never held, or held from `was_true.0` to `was_true.1`.
    False {
        /// The interval it was true, if it ever was.
        was_true: Option<(Duration, Duration)>,
    },
}

/// The decision state of one test.
#[derive(Clone, Debug)]
pub struct Decision {
    threshold: f64,
    band: (f64, f64),
    min_observation: Duration,
    readings: Vec<Reading>,
    /// Since when the value has been above the band (`Some(true)`) or below
    /// it (`Some(false)`), by the cumulative rule while testing.
    side: Option<(bool, Duration)>,
    verdict: Verdict,
    value: Option<f64>,
    /// The span `value` covers, in test time.
    window: Option<(Duration, Duration)>,
}

/// Two decisions are equal when they stand at the same verdict and value.
impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.verdict() == other.verdict() && self.value() == other.value()
    }
}

impl Decision {
    /// A new test of `hypothesis` under `thresholds`.
    pub fn new(hypothesis: Hypothesis, thresholds: &Thresholds) -> Decision {
        let threshold = thresholds.of(hypothesis);
        let h = thresholds.hysteresis.clamp(0.0, 0.99);
        Decision {
            threshold,
            band: (threshold * (1.0 - h), threshold * (1.0 + h)),
            min_observation: thresholds.min_observation,
            readings: vec![Reading::default()],
            side: None,
            verdict: Verdict::Testing,
            value: None,
            window: None,
        }
    }

    /// A test taken as true without measuring it: a thread's root (its
    /// start routine, `main`) holds all of the thread's time, and was
    /// entered before any probe could time it.
    pub fn assumed_true(hypothesis: Hypothesis, thresholds: &Thresholds) -> Decision {
        let mut d = Decision::new(hypothesis, thresholds);
        d.verdict = Verdict::True {
            since: Duration::ZERO,
        };
        d
    }

    /// The threshold the value is compared with.
    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    /// The latest value: the share since the test began while testing,
    /// over the last observation window once true.
    pub fn value(&self) -> Option<f64> {
        self.value
    }

    /// The span of test time [`Decision::value`] covers: from the test's
    /// start while testing, the last observation window once true.
    pub fn value_window(&self) -> Option<(Duration, Duration)> {
        self.window
    }

    /// Where the test stands.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Takes a reading (cumulative since the test began; readings must come
    /// in time order, earlier ones are ignored) and returns the verdict.
    pub fn observe(&mut self, r: Reading) -> Verdict {
        let last = *self.readings.last().expect("never empty");
        if r.at <= last.at || r.whole_ns < last.whole_ns {
            return self.verdict;
        }
        self.readings.push(r);
        match self.verdict {
            Verdict::Testing => self.while_testing(r),
            Verdict::True { since } => self.while_true(r, since),
            Verdict::False { .. } => {}
        }
        self.verdict
    }

    fn while_testing(&mut self, r: Reading) {
        let Some(v) = r.share_since(&self.readings[0]) else {
            return;
        };
        self.value = Some(v);
        self.window = Some((self.readings[0].at, r.at));
        let now_side = if v > self.band.1 {
            Some(true)
        } else if v < self.band.0 {
            Some(false)
        } else {
            None
        };
        self.side = match (self.side, now_side) {
            (Some((a, since)), Some(b)) if a == b => Some((a, since)),
            (_, Some(b)) => Some((b, r.at)),
            (_, None) => None,
        };
        // The value counts from the test's start: it must have held for
        // the minimum time since the start, and kept its side since then.
        if let Some((above, _)) = self.side {
            if r.at >= self.min_observation {
                self.verdict = if above {
                    Verdict::True { since: r.at }
                } else {
                    Verdict::False { was_true: None }
                };
            }
        }
    }

    fn while_true(&mut self, r: Reading, since: Duration) {
        // The most recent window of the minimum observation time.
        let from = r.at.saturating_sub(self.min_observation);
        let i = self.readings.partition_point(|x| x.at <= from);
        let start = self.readings[i.saturating_sub(1)];
        if r.at.saturating_sub(start.at) < self.min_observation / 2 {
            return;
        }
        let Some(v) = r.share_since(&start) else {
            return;
        };
        self.value = Some(v);
        self.window = Some((start.at, r.at));
        if v < self.band.0 && r.at.saturating_sub(since) >= self.min_observation {
            self.verdict = Verdict::False {
                was_true: Some((since, r.at)),
            };
        }
        // Old readings are no longer needed.
        if i > 1 {
            let keep = i - 1;
            self.readings.drain(1..keep.max(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Feeds readings of a constant share, 100 ms apart, for `ms`.
    fn feed(d: &mut Decision, from_ms: u64, to_ms: u64, share: f64, acc: &mut (u64, u64)) {
        let mut at = from_ms;
        while at < to_ms {
            at += 100;
            acc.1 += 100_000_000;
            acc.0 += (100_000_000.0 * share) as u64;
            d.observe(Reading {
                at: t(at),
                part_ns: acc.0,
                whole_ns: acc.1,
            });
        }
    }

    fn defaults() -> Thresholds {
        Thresholds::default()
    }

    #[test]
    fn a_value_above_the_band_turns_true_only_after_the_observation_time() {
        let mut d = Decision::new(Hypothesis::CpuBound, &defaults());
        let mut acc = (0, 0);
        feed(&mut d, 0, 900, 0.40, &mut acc);
        assert_eq!(d.verdict(), Verdict::Testing);
        feed(&mut d, 900, 1000, 0.40, &mut acc);
        assert!(matches!(d.verdict(), Verdict::True { since } if since == t(1000)));
        assert!((d.value().unwrap() - 0.40).abs() < 1e-9);
    }

    #[test]
    fn inside_the_band_it_keeps_testing() {
        let mut d = Decision::new(Hypothesis::CpuBound, &defaults());
        let mut acc = (0, 0);
        // 0.30 ± 5 % is 0.285..0.315.
        feed(&mut d, 0, 5000, 0.31, &mut acc);
        assert_eq!(d.verdict(), Verdict::Testing);
        feed(&mut d, 5000, 5100, 0.29, &mut acc);
        assert_eq!(d.verdict(), Verdict::Testing);
    }

    #[test]
    fn below_the_band_turns_false() {
        let mut d = Decision::new(Hypothesis::SyncWaiting, &defaults());
        let mut acc = (0, 0);
        feed(&mut d, 0, 1000, 0.08, &mut acc);
        assert_eq!(d.verdict(), Verdict::False { was_true: None });
        // A false test stays false.
        feed(&mut d, 1000, 3000, 0.9, &mut acc);
        assert_eq!(d.verdict(), Verdict::False { was_true: None });
    }

    #[test]
    fn a_true_node_whose_recent_value_falls_turns_false_with_its_interval() {
        let mut d = Decision::new(Hypothesis::IoBlocking, &defaults());
        let mut acc = (0, 0);
        feed(&mut d, 0, 2000, 0.5, &mut acc);
        assert!(matches!(d.verdict(), Verdict::True { .. }));
        // Cumulatively still high for a while, but the recent window falls.
        feed(&mut d, 2000, 3500, 0.02, &mut acc);
        match d.verdict() {
            Verdict::False {
                was_true: Some((from, to)),
            } => {
                assert_eq!(from, t(1000));
                assert!(to > t(2000) && to <= t(3500), "{to:?}");
            }
            v => panic!("expected false after true, got {v:?}"),
        }
    }

    #[test]
    fn readings_out_of_order_are_ignored() {
        let mut d = Decision::new(Hypothesis::CpuBound, &defaults());
        let mut acc = (0, 0);
        feed(&mut d, 0, 500, 0.5, &mut acc);
        d.observe(Reading {
            at: t(100),
            part_ns: 0,
            whole_ns: 1,
        });
        feed(&mut d, 500, 1000, 0.5, &mut acc);
        assert!(matches!(d.verdict(), Verdict::True { .. }));
    }
}
