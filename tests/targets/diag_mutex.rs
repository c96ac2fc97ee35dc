//! Two threads contend one `std::sync::Mutex` in `worker > step >
//! update_shared`, each holding it ~1.5 ms asleep, so each waits ~40% of
//! its time whatever the machine's load. Prints `threads a,b`, `ready`,
//! then every 0.5 s each worker's seconds blocked in `lock` and its elapsed
//! seconds: `truth w0=B/E w1=B/E`. Ends when stdin closes.
//!
//! Also prints `mutex ADDR SIZE`: where the mutex is, so a diagnosis can
//! be checked to name it. Used by tests/diagnose/diagnose_real.rs.
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SHARED: Mutex<u64> = Mutex::new(0);
static BLOCKED_US: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

#[inline(never)]
fn update_shared(me: usize) {
    let t0 = Instant::now();
    let mut g = SHARED.lock().unwrap();
    BLOCKED_US[me].fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    *g += 1;
    std::thread::sleep(Duration::from_micros(1500));
    drop(g);
}

#[inline(never)]
fn step(me: usize) {
    update_shared(me);
    std::thread::sleep(Duration::from_micros(300));
}

#[inline(never)]
fn worker(me: usize) {
    loop {
        step(me);
    }
}

fn main() {
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    for me in 0..2 {
        let tx = tx.clone();
        std::thread::spawn(move || {
            tx.send(unsafe { libc_gettid() }).unwrap();
            worker(me)
        });
    }
    let tids: Vec<i64> = (0..2).map(|_| rx.recv().unwrap()).collect();
    println!("threads {},{}", tids[0], tids[1]);
    println!(
        "mutex {:#x} {}",
        &SHARED as *const Mutex<u64> as usize,
        std::mem::size_of_val(&SHARED)
    );
    println!("ready");
    std::thread::spawn(|| {
        let mut buf = [0u8; 16];
        while std::io::stdin().read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
        std::process::exit(0);
    });
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let e = start.elapsed().as_secs_f64();
        println!(
            "truth w0={:.4}/{e:.4} w1={:.4}/{e:.4}",
            BLOCKED_US[0].load(Ordering::Relaxed) as f64 / 1e6,
            BLOCKED_US[1].load(Ordering::Relaxed) as f64 / 1e6,
        );
    }
}

extern "C" {
    fn gettid() -> i32;
}

unsafe fn libc_gettid() -> i64 {
    gettid() as i64
}
