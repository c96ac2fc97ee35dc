//! Where a trace is kept between the drains and the writing: per thread, a
//! compact stream of records (a few bytes per event), in memory up to a
//! chunk and then appended to one unnamed temporary file shared by the
//! threads. weft's memory then holds a chunk per thread that traces, not
//! the trace; the file holds the rest, up to the budget
//! ([`super::BUDGET_ENV`]).
//!
//! Records, each a tag byte and LEB128 numbers (times are raw clock ticks,
//! each record's the previous record's of the thread plus `dt`):
//!
//! ```text
//! BEGIN  tag = 0 | ended << 4, dt, function   a call began
//! END    tag = 1, dt                          the innermost open call ended
//! GAP    tag = 2, count, dt                   `count` events were lost
//!                                             between the previous record's
//!                                             time and dt after it
//! ```
//!
//! `ended` ([`super::CallEnd`]) is only known when the call ends, which
//! may be after its BEGIN went to the file: the tag is then rewritten in
//! place ([`Stream::set_ended`]). The records of a thread are in its
//! nesting order (a callee's BEGIN after its caller's, its END before), as
//! the writers emit them.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes of a thread's stream kept in memory before they go to the file.
pub(super) const CHUNK: usize = 64 * 1024;

pub(super) const TAG_BEGIN: u8 = 0;
pub(super) const TAG_END: u8 = 1;
pub(super) const TAG_GAP: u8 = 2;
const TAG_KIND: u8 = 0x0f;
const ENDED_SHIFT: u8 = 4;

/// One decoded record, its time absolute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// A call of `function` began at `time`; `at` is its offset in the
    /// stream, `ended` as last set.
    Begin {
        time: u64,
        function: u32,
        ended: u8,
        at: u64,
    },
    /// The innermost open call ended at `time`.
    End { time: u64 },
    /// `count` events were lost from `from` to `to`.
    Gap { count: u64, from: u64, to: u64 },
}

/// The temporary file the threads' full chunks go to, made at the first
/// chunk (a short trace never touches the disk).
#[derive(Debug, Default)]
pub(super) struct Spill {
    file: Option<File>,
    /// Bytes written to it.
    pub(super) len: u64,
}

impl Spill {
    /// Appends `bytes`; returns their offset in the file.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<u64> {
        if self.file.is_none() {
            self.file = Some(unnamed_temp_file()?);
        }
        let file = self.file.as_ref().expect("just made");
        let at = self.len;
        file.write_all_at(bytes, at)?;
        self.len += bytes.len() as u64;
        Ok(at)
    }

    fn write_at(&self, bytes: &[u8], at: u64) -> std::io::Result<()> {
        match &self.file {
            Some(f) => f.write_all_at(bytes, at),
            None => Err(std::io::Error::other("no trace file")),
        }
    }

    fn read_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        match &self.file {
            Some(f) => f.read_exact_at(buf, at),
            None => Err(std::io::Error::other("no trace file")),
        }
    }
}

/// A file in the temporary directory (`TMPDIR`, else /tmp) that has no
/// name: it goes away with weft, however weft ends.
fn unnamed_temp_file() -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    let tmpfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir);
    match tmpfile {
        Ok(f) => Ok(f),
        // File systems without O_TMPFILE: a fresh name, removed at once.
        Err(_) => {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = dir.join(format!("weft-trace-{}-{n}", std::process::id()));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(f)
        }
    }
}

/// A part of a stream that is in the file.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    /// Offset in the stream of its first byte.
    stream_at: u64,
    /// Offset in the file.
    file_at: u64,
    len: u32,
}

/// One thread's records.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// The records after the last chunk that went to the file.
    buf: Vec<u8>,
    chunks: Vec<Chunk>,
    /// Stream bytes in the file.
    flushed: u64,
    /// Time of the last record.
    time: u64,
}

impl Stream {
    /// The stream's length in bytes.
    pub(super) fn len(&self) -> u64 {
        self.flushed + self.buf.len() as u64
    }

    /// Appends a BEGIN at `time` (not before the last record's); returns
    /// its offset for [`Stream::set_ended`].
    pub(super) fn begin(&mut self, time: u64, function: u32) -> u64 {
        let at = self.len();
        self.buf.push(TAG_BEGIN);
        self.push_time(time);
        push_leb(&mut self.buf, u64::from(function));
        at
    }

    /// Appends an END at `time`.
    pub(super) fn end(&mut self, time: u64) {
        self.buf.push(TAG_END);
        self.push_time(time);
    }

    /// Appends a GAP of `count` events from the last record's time to
    /// `to`.
    pub(super) fn gap(&mut self, count: u64, to: u64) {
        self.buf.push(TAG_GAP);
        push_leb(&mut self.buf, count);
        self.push_time(to);
    }

    fn push_time(&mut self, time: u64) {
        push_leb(&mut self.buf, time.saturating_sub(self.time));
        self.time = self.time.max(time);
    }

    /// Sets how the call whose BEGIN is at `at` ended.
    pub(super) fn set_ended(&mut self, spill: &Spill, at: u64, ended: u8) -> std::io::Result<()> {
        let tag = TAG_BEGIN | ended << ENDED_SHIFT;
        if let Some(i) = at.checked_sub(self.flushed) {
            if let Some(b) = self.buf.get_mut(i as usize) {
                *b = tag;
            }
            return Ok(());
        }
        let c = self.chunks.partition_point(|c| c.stream_at <= at) - 1;
        let chunk = self.chunks[c];
        spill.write_at(&[tag], chunk.file_at + (at - chunk.stream_at))
    }

    /// Sends the records in memory to the file once they fill a chunk
    /// (`always`: whatever there is, and frees the memory: the thread is
    /// gone).
    pub(super) fn spill(&mut self, spill: &mut Spill, always: bool) -> std::io::Result<()> {
        if self.buf.is_empty() || (!always && self.buf.len() < CHUNK) {
            return Ok(());
        }
        let file_at = spill.append(&self.buf)?;
        self.chunks.push(Chunk {
            stream_at: self.flushed,
            file_at,
            len: self.buf.len() as u32,
        });
        self.flushed += self.buf.len() as u64;
        self.buf.clear();
        if always {
            self.buf.shrink_to_fit();
        }
        Ok(())
    }

    /// Reads the records back in order, calling `f` on each.
    pub(super) fn for_each(&self, spill: &Spill, mut f: impl FnMut(Record)) -> std::io::Result<()> {
        let mut decoder = Decoder::default();
        let mut chunk = Vec::new();
        for c in &self.chunks {
            chunk.resize(c.len as usize, 0);
            spill.read_at(&mut chunk, c.file_at)?;
            decoder.decode(&chunk, c.stream_at, &mut f)?;
        }
        decoder.decode(&self.buf, self.flushed, &mut f)
    }
}

/// Decoding state carried from one chunk to the next (a record never
/// spans two chunks: chunks are cut between records).
#[derive(Default)]
struct Decoder {
    time: u64,
}

impl Decoder {
    fn decode(
        &mut self,
        bytes: &[u8],
        stream_at: u64,
        f: &mut impl FnMut(Record),
    ) -> std::io::Result<()> {
        let corrupt =
            || std::io::Error::new(std::io::ErrorKind::InvalidData, "corrupt trace record");
        let mut i = 0;
        while i < bytes.len() {
            let at = stream_at + i as u64;
            let tag = bytes[i];
            i += 1;
            let mut next = || read_leb(bytes, &mut i).ok_or_else(corrupt);
            match tag & TAG_KIND {
                TAG_BEGIN => {
                    self.time += next()?;
                    let function = next()? as u32;
                    f(Record::Begin {
                        time: self.time,
                        function,
                        ended: tag >> ENDED_SHIFT,
                        at,
                    });
                }
                TAG_END => {
                    self.time += next()?;
                    f(Record::End { time: self.time });
                }
                TAG_GAP => {
                    let count = next()?;
                    let from = self.time;
                    self.time += next()?;
                    f(Record::Gap {
                        count,
                        from,
                        to: self.time,
                    });
                }
                _ => return Err(corrupt()),
            }
        }
        Ok(())
    }
}

fn push_leb(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn read_leb(bytes: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*i)?;
        *i += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_the_file_and_take_a_few_bytes() {
        let mut spill = Spill::default();
        let mut s = Stream::default();
        let mut want = Vec::new();
        let mut t = 1_000_000_000u64;
        let mut opened = Vec::new();
        // Enough to fill several chunks.
        for i in 0..40_000u64 {
            t += 37 + i % 5;
            let at = s.begin(t, 0x1234 + (i % 3) as u32 * 8);
            want.push(Record::Begin {
                time: t,
                function: 0x1234 + (i % 3) as u32 * 8,
                ended: 0,
                at,
            });
            opened.push(want.len() - 1);
            t += 11;
            s.end(t);
            want.push(Record::End { time: t });
            if i == 7 {
                s.gap(99, t + 5000);
                want.push(Record::Gap {
                    count: 99,
                    from: t,
                    to: t + 5000,
                });
                t += 5000;
            }
            s.spill(&mut spill, false).unwrap();
        }
        assert!(spill.len > 0, "nothing went to the file");
        // Rewrite the ends of a call in the file and of one in memory.
        for &k in [opened[3], opened[opened.len() - 1]].iter() {
            let Record::Begin { at, ended, .. } = &mut want[k] else {
                unreachable!()
            };
            *ended = 2;
            s.set_ended(&spill, *at, 2).unwrap();
        }
        let mut got = Vec::new();
        s.for_each(&spill, |r| got.push(r)).unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "records differ after the round trip");
        // Per call (a BEGIN and an END): well under the ring's 32 bytes.
        assert!(s.len() < 40_000 * 8, "{} bytes for 40,000 calls", s.len());
        s.spill(&mut spill, true).unwrap();
        let mut again = Vec::new();
        s.for_each(&spill, |r| again.push(r)).unwrap();
        assert!(again == want);
    }
}
