//! workers (Rust): same workload and protocol as workers.c; see that file.
//! Built with: rustc -O --edition 2021 -L native=DIR -C link-arg=-Wl,-rpath,$ORIGIN
//! (DIR holds libwork.so).
use std::io::{BufRead, Write};
use std::sync::{Arc, Condvar, Mutex};

#[link(name = "work")]
extern "C" {
    fn lib_work(counter: *mut i64, x: i64) -> i64;
    fn gettid() -> i32;
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn work_a(counter: *mut i64, x: i64) -> i64 {
    // SAFETY: callers pass a pointer to their own live counter.
    unsafe { *counter += 1 };
    let mut r = x.wrapping_mul(3).wrapping_add(1);
    if r & 4 != 0 {
        r ^= 0x55;
    }
    r
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn work_b(counter: *mut i64, x: i64) -> i64 {
    // SAFETY: callers pass a pointer to their own live counter.
    unsafe { *counter += 1 };
    (x << 1).wrapping_sub(x >> 2).wrapping_add(7)
}

fn ref_a(x: i64) -> i64 {
    let mut r = x.wrapping_mul(3).wrapping_add(1);
    if r & 4 != 0 {
        r ^= 0x55;
    }
    r
}
fn ref_b(x: i64) -> i64 {
    (x << 1).wrapping_sub(x >> 2).wrapping_add(7)
}
fn ref_l(x: i64) -> i64 {
    let mut r = x ^ (x >> 3);
    if r & 1 != 0 {
        r = r.wrapping_add(0x1234);
    }
    r
}

#[derive(Default, Clone)]
struct Result {
    tid: i32,
    a: i64,
    b: i64,
    l: i64,
    ok: bool,
}

#[derive(Default)]
struct Shared {
    phase: i64,
    done: usize,
    started: usize,
    quit: bool,
    results: Vec<Result>,
}

type Sync = Arc<(Mutex<Shared>, Condvar, Condvar)>; // (state, start, done)

fn do_phase(index: usize, p: i64) -> (i64, i64, i64, bool) {
    let i = index as i64;
    let na = 1000 * (i + 1) + 37 * p;
    let nb = 500 * (i + 1) + 11 * p;
    let nl = 250 * (i + 1) + 3 * p;
    let n = na.max(nb).max(nl);
    let (mut a, mut b, mut l) = (0i64, 0i64, 0i64);
    let (mut acc, mut r) = (p, p);
    for k in 0..n {
        if k < na {
            acc = acc.wrapping_mul(31).wrapping_add(work_a(&mut a, acc.wrapping_add(k)));
        }
        if k < nb {
            acc = acc.wrapping_mul(17).wrapping_add(work_b(&mut b, acc ^ k));
        }
        if k < nl {
            // SAFETY: lib_work (libwork.so) only increments the counter passed.
            acc = acc.wrapping_mul(13).wrapping_add(unsafe { lib_work(&mut l, acc.wrapping_sub(k)) });
        }
    }
    for k in 0..n {
        if k < na {
            r = r.wrapping_mul(31).wrapping_add(ref_a(r.wrapping_add(k)));
        }
        if k < nb {
            r = r.wrapping_mul(17).wrapping_add(ref_b(r ^ k));
        }
        if k < nl {
            r = r.wrapping_mul(13).wrapping_add(ref_l(r.wrapping_sub(k)));
        }
    }
    let ok = std::hint::black_box(acc) == r && a == na && b == nb && l == nl;
    (a, b, l, ok)
}

fn worker(sync: Sync, index: usize) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { gettid() };
    let (m, start, done) = &*sync;
    let mut g = m.lock().unwrap();
    g.results[index].tid = tid;
    g.started += 1;
    done.notify_all();
    let mut last = 0;
    loop {
        while g.phase == last && !g.quit {
            g = start.wait(g).unwrap();
        }
        if g.phase == last && g.quit {
            break;
        }
        last = g.phase;
        drop(g);
        let (a, b, l, ok) = do_phase(index, last);
        g = m.lock().unwrap();
        let r = &mut g.results[index];
        r.a = a;
        r.b = b;
        r.l = l;
        r.ok = ok;
        g.done += 1;
        done.notify_all();
    }
}

fn main() {
    let (mut n, mut late, mut phases, mut no_wait, mut exit_code) = (4usize, 0usize, 1i64, false, 0i32);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = || args.get(i + 1).map(|s| s.parse::<i64>().unwrap()).unwrap_or(0);
        match args[i].as_str() {
            "--threads" => { n = v() as usize; i += 1; }
            "--late-threads" => { late = v() as usize; i += 1; }
            "--phases" => { phases = v(); i += 1; }
            "--exit-code" => { exit_code = v() as i32; i += 1; }
            "--no-wait" => no_wait = true,
            a => { eprintln!("workers: bad argument {a}"); std::process::exit(64); }
        }
        i += 1;
    }
    let sync: Sync = Arc::new((Mutex::new(Shared::default()), Condvar::new(), Condvar::new()));
    sync.0.lock().unwrap().results = vec![Result::default(); n + late];
    let mut names = Vec::new();
    let mut handles = Vec::new();
    let spawn = |index: usize, name: String| {
        let s = sync.clone();
        std::thread::Builder::new().name(name).spawn(move || worker(s, index)).expect("spawn")
    };
    for i in 0..n {
        names.push(format!("worker-{i}"));
        handles.push(spawn(i, names[i].clone()));
    }
    {
        let mut g = sync.0.lock().unwrap();
        while g.started < n {
            g = sync.2.wait(g).unwrap();
        }
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ready pid={} threads={}", std::process::id(), n + 1).unwrap();
    out.flush().unwrap();

    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut total = n;
    for p in 1..=phases {
        if !no_wait {
            loop {
                match lines.next() {
                    Some(Ok(l)) if l.trim() == "go" => break,
                    Some(Ok(l)) if l.trim() == "quit" => std::process::exit(2),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        writeln!(out, "FAIL stdin read: {e}").unwrap();
                        out.flush().unwrap();
                        std::process::exit(2);
                    }
                    None => std::process::exit(2),
                }
            }
        }
        if p == 1 && late > 0 {
            for j in 0..late {
                names.push(format!("late-{j}"));
                handles.push(spawn(n + j, names[n + j].clone()));
            }
            total = n + late;
            let mut g = sync.0.lock().unwrap();
            while g.started < total {
                g = sync.2.wait(g).unwrap();
            }
        }
        let results = {
            let mut g = sync.0.lock().unwrap();
            g.done = 0;
            g.phase = p;
            sync.1.notify_all();
            while g.done < total {
                g = sync.2.wait(g).unwrap();
            }
            g.results.clone()
        };
        for (i, r) in results.iter().enumerate().take(total) {
            writeln!(
                out,
                "{{\"phase\":{p},\"index\":{i},\"tid\":{},\"name\":\"{}\",\"work_a\":{},\"work_b\":{},\"lib_work\":{},\"ok\":{}}}",
                r.tid, names[i], r.a, r.b, r.l, r.ok
            )
            .unwrap();
        }
        writeln!(out, "phase {p} done").unwrap();
        out.flush().unwrap();
    }
    {
        let mut g = sync.0.lock().unwrap();
        g.quit = true;
        sync.1.notify_all();
    }
    for h in handles {
        h.join().unwrap();
    }
    writeln!(out, "done").unwrap();
    out.flush().unwrap();
    std::process::exit(exit_code);
}
