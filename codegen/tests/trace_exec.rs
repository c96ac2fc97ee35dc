//! Call traces, executed: traced functions write an entry event and their
//! exit handler an exit event into the thread's ring, in order, with the
//! function, kind and depth; a full ring counts drops and the calls still
//! run and return right; untraced functions of the same lab write nothing.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

#[path = "common/lab.rs"]
mod lab;

use iced_x86::code_asm::*;
use lab::*;
use weft_abi::layout::trace as ring;
use weft_codegen::*;

/// Row byte offset of the lab rows' trace ring (rows are 8 KiB).
const RING: i32 = 4096;
const CAPACITY: u32 = 64;

fn ring_word(off: usize) -> u64 {
    word(RING + off as i32)
}

/// (function, kind, depth) of the events since the last call, which it
/// consumes as the injector does; checks their times never go back and lie
/// in `[lo, hi]` (TSC readings around the calls).
fn take_events_between(lo: u64, hi: u64) -> Vec<(i32, u32, u32)> {
    let head = ring_word(ring::HEAD);
    let tail = ring_word(ring::TAIL);
    let cells = word(CELLS) as u32;
    let mut out = Vec::new();
    let mut last = 0;
    for i in tail..head {
        let slot = ring::EVENTS + ring::EVENT_SIZE * (i % u64::from(CAPACITY)) as usize;
        let time = ring_word(slot + ring::EV_TIME);
        assert!(time >= last, "event {i}: time {time} before {last}");
        assert!(
            (lo..=hi).contains(&time),
            "event {i}: time {time} not in {lo}..={hi}"
        );
        last = time;
        let meta = ring_word(slot + ring::EV_FUNCTION);
        let f = meta as u32;
        let depth = ((meta >> 32) as u32).wrapping_sub(cells) / CELL_SIZE;
        out.push(((f & !ring::KIND_MASK) as i32, f & ring::KIND_MASK, depth));
    }
    set_word(RING + ring::TAIL as i32, head);
    out
}

fn take_events() -> Vec<(i32, u32, u32)> {
    take_events_between(0, u64::MAX)
}

/// `rec(n)` = n + (n-1) + ... + 0, recursively.
fn rec(lab: &mut Lab) -> (u64, usize) {
    lab.assemble(|a, end| {
        let mut start = a.create_label();
        let mut base = a.create_label();
        a.set_label(&mut start).unwrap();
        a.push(rbx).unwrap();
        a.mov(rbx, rdi).unwrap();
        a.test(rdi, rdi).unwrap();
        a.jz(base).unwrap();
        a.lea(rdi, qword_ptr(rdi - 1)).unwrap();
        a.call(start).unwrap();
        a.add(rax, rbx).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut base).unwrap();
        a.xor(eax, eax).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    })
}

fn traced_lab(timers: Option<TimerSpec>) -> Lab {
    Lab::traced(
        timers,
        TraceRing {
            offset: RING,
            capacity: CAPACITY,
            wall: WallRead::Tsc,
        },
    )
}

fn check_recursion(lab: &mut Lab) {
    let f = rec(lab);
    let hooks = lab.hooks().tracing(true);
    let m = lab.hook_as(f, hooks);
    let untraced = rec(lab);
    let hooks = lab.hooks();
    let m_untraced = lab.hook_as(untraced, hooks);
    let cells = lab.cells();
    install_row(cells);

    let lo = weft_rt::clock::rdtsc();
    assert_eq!(fn1(f.0)(3), 6);
    let hi = weft_rt::clock::rdtsc();
    assert_eq!(depth(), 0);
    let want: Vec<(i32, u32, u32)> = (0..4)
        .map(|d| (m, ring::KIND_ENTRY, d))
        .chain((0..4).rev().map(|d| (m, ring::KIND_EXIT, d)))
        .collect();
    assert_eq!(take_events_between(lo, hi), want);
    assert_eq!(ring_word(ring::DROPPED), 0);
    assert_eq!(ring_word(ring::BUSY), 0);

    // Untraced: counted and hooked, nothing in the ring.
    assert_eq!(fn1(untraced.0)(10), 55);
    assert_eq!(counts(m_untraced), [11, 11, 0, 0]);
    assert!(take_events().is_empty());

    // 202 events, 64 slots and nobody reading: the first 64 are written,
    // the rest dropped; the calls are unaffected.
    let head = ring_word(ring::HEAD);
    assert_eq!(fn1(f.0)(100), 5050);
    assert_eq!(depth(), 0);
    assert_eq!(ring_word(ring::HEAD), head + u64::from(CAPACITY));
    assert_eq!(ring_word(ring::DROPPED), 202 - u64::from(CAPACITY));
    let events = take_events();
    assert_eq!(events.len(), CAPACITY as usize);
    assert!(events
        .iter()
        .enumerate()
        .all(|(d, &e)| e == (m, ring::KIND_ENTRY, d as u32)));
    assert_eq!(counts(m), [105, 105, 0, 0]);
    assert_eq!(ring_word(ring::BUSY), 0);
}

#[test]
fn entries_and_exits_in_order_and_drops_counted() {
    let mut lab = traced_lab(None);
    check_recursion(&mut lab);
}

#[test]
fn traced_and_timed() {
    use weft_rt::clock::{WallClock, WallPreference};
    let wall: &'static WallClock = Box::leak(Box::new(WallClock::new(WallPreference::Auto)));
    let spec = timer_spec(
        Timers {
            wall: true,
            cpu: false,
        },
        wall,
    );
    let mut lab = traced_lab(Some(spec));
    check_recursion(&mut lab);
}
