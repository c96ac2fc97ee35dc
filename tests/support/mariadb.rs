//! A MariaDB server for tests (Debian 12's `mariadb-server`, which
//! `scripts/test` installs) and a small MySQL-protocol client: handshake,
//! `COM_QUERY`, text result sets, over TCP on loopback.

use super::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const CLIENT_LONG_PASSWORD: u32 = 0x1;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;

/// A server reply to a query.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// An OK packet.
    Ok,
    /// A result set: its rows, each value a string or NULL.
    Rows(Vec<Vec<Option<String>>>),
}

pub struct Conn {
    s: TcpStream,
    /// The connection id from the server's handshake.
    pub id: u64,
}

fn lenenc_int(p: &[u8], at: &mut usize) -> Result<u64, String> {
    let b = *p.get(*at).ok_or("truncated length")?;
    *at += 1;
    let n = match b {
        0..=0xfa => return Ok(u64::from(b)),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        _ => return Err(format!("bad length-encoded integer {b:#x}")),
    };
    let bytes = p.get(*at..*at + n).ok_or("truncated length")?;
    *at += n;
    Ok(bytes
        .iter()
        .rev()
        .fold(0u64, |v, &x| (v << 8) | u64::from(x)))
}

impl Conn {
    fn read_packet(&mut self) -> Result<Vec<u8>, String> {
        let mut h = [0u8; 4];
        self.s
            .read_exact(&mut h)
            .map_err(|e| format!("reading a packet header: {e}"))?;
        let len = usize::from(h[0]) | usize::from(h[1]) << 8 | usize::from(h[2]) << 16;
        let mut p = vec![0u8; len];
        self.s
            .read_exact(&mut p)
            .map_err(|e| format!("reading a packet of {len} bytes: {e}"))?;
        Ok(p)
    }

    /// Writes one packet with one `write` (header and payload together).
    fn write_packet(&mut self, seq: u8, payload: &[u8]) -> Result<(), String> {
        let len = payload.len() as u32;
        let mut b = len.to_le_bytes()[..3].to_vec();
        b.push(seq);
        b.extend_from_slice(payload);
        self.s
            .write_all(&b)
            .map_err(|e| format!("writing a packet: {e}"))
    }

    /// Connects to the server on 127.0.0.1:`port` as user `weft`.
    pub fn connect(port: u16) -> Result<Conn, String> {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        let mut c = Conn { s, id: 0 };
        let hs = c.read_packet()?;
        if hs.first() != Some(&10) {
            return Err(format!("not a protocol 10 handshake: {hs:?}"));
        }
        let nul = hs[1..]
            .iter()
            .position(|&b| b == 0)
            .ok_or("no server version")?;
        let id = hs
            .get(nul + 2..nul + 6)
            .ok_or("no connection id in the handshake")?;
        c.id = u64::from(u32::from_le_bytes(id.try_into().unwrap()));
        let caps = CLIENT_LONG_PASSWORD
            | CLIENT_PROTOCOL_41
            | CLIENT_TRANSACTIONS
            | CLIENT_SECURE_CONNECTION;
        let mut r = caps.to_le_bytes().to_vec();
        r.extend_from_slice(&(1u32 << 24).to_le_bytes());
        r.push(45); // utf8mb4_general_ci
        r.extend_from_slice(&[0; 23]);
        r.extend_from_slice(b"weft\0");
        r.push(0); // no auth response
        c.write_packet(1, &r)?;
        match c.read_packet()? {
            p if p.first() == Some(&0) => Ok(c),
            p => Err(format!("login refused: {:?}", String::from_utf8_lossy(&p))),
        }
    }

    /// Runs one query (`COM_QUERY`) and reads its whole reply.
    pub fn query(&mut self, q: &str) -> Result<Reply, String> {
        let mut p = vec![3u8];
        p.extend_from_slice(q.as_bytes());
        self.write_packet(0, &p)?;
        let first = self.read_packet()?;
        match first.first() {
            Some(0) => return Ok(Reply::Ok),
            Some(0xff) => {
                return Err(format!(
                    "{q:?}: error {:?}",
                    String::from_utf8_lossy(&first[3..])
                ))
            }
            None => return Err(format!("{q:?}: an empty packet")),
            _ => {}
        }
        let columns = lenenc_int(&first, &mut 0)?;
        for _ in 0..columns {
            self.read_packet()?;
        }
        let eof = self.read_packet()?;
        if eof.first() != Some(&0xfe) {
            return Err(format!("{q:?}: no EOF after the columns: {eof:?}"));
        }
        let mut rows = Vec::new();
        loop {
            let r = self.read_packet()?;
            if r.first() == Some(&0xfe) && r.len() < 9 {
                return Ok(Reply::Rows(rows));
            }
            if r.first() == Some(&0xff) {
                return Err(format!("{q:?}: error {:?}", String::from_utf8_lossy(&r)));
            }
            let mut at = 0;
            let mut row = Vec::new();
            for _ in 0..columns {
                if r.get(at) == Some(&0xfb) {
                    at += 1;
                    row.push(None);
                    continue;
                }
                let n = lenenc_int(&r, &mut at)? as usize;
                let v = r.get(at..at + n).ok_or("truncated row")?;
                row.push(Some(String::from_utf8_lossy(v).into_owned()));
                at += n;
            }
            rows.push(row);
        }
    }

    /// A query returning one row of one value.
    pub fn value(&mut self, q: &str) -> Result<String, String> {
        match self.query(q)? {
            Reply::Rows(rows) if rows.len() == 1 && rows[0].len() == 1 => rows[0][0]
                .clone()
                .ok_or_else(|| format!("{q:?} returned NULL")),
            r => Err(format!("{q:?} returned {r:?}, expected one value")),
        }
    }
}

/// The server's global status counter `name`.
pub fn status(ctx: &Ctx, c: &mut Conn, name: &str) -> u64 {
    match c.query(&format!("SHOW GLOBAL STATUS LIKE '{name}'")) {
        Ok(Reply::Rows(rows)) if rows.len() == 1 => rows[0][1]
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| ctx.fail(format!("status {name}: {rows:?}"))),
        r => ctx.fail(format!("SHOW GLOBAL STATUS LIKE '{name}': {r:?}")),
    }
}

/// Starts a MariaDB server of its own: a fresh data directory in scratch
/// directory `name` (`mariadb-install-db --no-defaults`), then `mariadbd
/// --no-defaults` on a free port of 127.0.0.1 with `--skip-grant-tables`
/// (any user, no password), the performance schema on and `more` options.
/// Returns the directory, the server (kill it by its PID) and the port,
/// once it listens.
pub fn start_mariadb(ctx: &Ctx, name: &str, more: &[&str]) -> (PathBuf, Proc, u16) {
    let dir = scratch_dir(name);
    let data = dir.join("data");
    let root = running_as_root();

    // A fresh data directory.
    let mut c = Command::new("mariadb-install-db");
    c.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
        ]);
    if root {
        c.arg("--user=root");
    }
    let mut install = ctx.spawn("mariadb-install-db", c, false);
    install.wait_code(0);

    // The server, on loopback only.
    let port = free_port();
    let mut c = Command::new("mariadbd");
    c.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
        .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
        .arg(format!("--tmpdir={}", dir.display()))
        .arg(format!("--port={port}"))
        .args([
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            "--skip-name-resolve",
            "--max-connections=1000",
            "--performance-schema=ON",
            "--innodb-buffer-pool-size=16M",
        ])
        .args(more);
    if root {
        c.arg("--user=root");
    }
    let mut server = ctx.spawn("mariadbd", c, false);
    let pid = server.pid;
    let deadline = Instant::now() + TIMEOUT;
    while !listens_on(pid, port) {
        ctx.check(server.is_running() && Instant::now() < deadline, || {
            "mariadbd did not start listening".into()
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    (dir, server, port)
}
