//! The coordinator's key-value store over TCP: [`Coordinator`] serves it (process 0),
//! [`TcpStore`] is every process's client, a [`KeyValueStore`] a PJRT client can be
//! created with.
//!
//! Frames are little-endian: a request is `op u8, key_len u32, key`, then `value_len u64,
//! value` for a put or `timeout_ms u64` for a get; an answer is a status byte, then
//! `len u64, value` for a value or `len u32, message` for an error. Both ends check each
//! length against [`MAX_KEY`] / [`MAX_VALUE`] before allocating. A connection opens with
//! [`HELLO`] both ways, so a port serving something else is named as such.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::pjrt::{ErrorCode, KeyValueStore, KvError};

/// The first bytes of a connection, each way.
pub const HELLO: &[u8; 8] = b"zoo-kv1\n";
/// The longest key accepted.
pub const MAX_KEY: usize = 64 << 10;
/// The largest value accepted (PJRT exchanges topologies of a few KiB per process).
pub const MAX_VALUE: usize = 256 << 20;

const PUT: u8 = 1;
const GET: u8 = 2;
const TRY_GET: u8 = 3;

const VALUE: u8 = 0;
const DONE: u8 = 1;
const NOT_FOUND: u8 = 2;
const TIMED_OUT: u8 = 3;
const FAILED: u8 = 4;

type Table = Arc<(Mutex<HashMap<String, Vec<u8>>>, Condvar)>;

/// `timeout` from now, or a year from now for a longer one (an `Instant` past the clock's
/// range would not be representable).
pub(crate) fn later(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Values are inserted whole, so a poisoned table is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// `len` bytes after checking `len` against `limit`.
fn read_bytes(r: &mut impl Read, len: u64, limit: usize, what: &str) -> io::Result<Vec<u8>> {
    if len > limit as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {what} of {len} bytes is over the limit of {limit}"),
        ));
    }
    let mut v = vec![0u8; len as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn hello(s: &mut TcpStream) -> io::Result<()> {
    s.write_all(HELLO)?;
    let mut got = [0u8; 8];
    s.read_exact(&mut got)?;
    if &got != HELLO {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer is not a zoo coordinator (it answered something else)",
        ));
    }
    Ok(())
}

/// The key-value store of a job, served on a TCP port by process 0 until dropped.
pub struct Coordinator {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections open now.
    open: Arc<AtomicUsize>,
    table: Table,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Coordinator {
    /// Serves a store on `addr` (`HOST:PORT`; port 0 picks a free one, see [`Self::addr`]).
    pub fn bind(addr: &str) -> io::Result<Coordinator> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let table: Table = Arc::default();
        let accept = {
            let (stop, table, open) = (stop.clone(), table.clone(), open.clone());
            std::thread::Builder::new()
                .name("zoo-coordinator".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        let Ok(conn) = conn else { continue };
                        open.fetch_add(1, Ordering::AcqRel);
                        let (stop, table, conn_open) = (stop.clone(), table.clone(), open.clone());
                        // One thread per connection: a job has a few per process, and a
                        // get may wait for a put that another connection brings.
                        let spawned = std::thread::Builder::new()
                            .name("zoo-coordinator-conn".into())
                            .spawn(move || {
                                serve(conn, &table, &stop);
                                conn_open.fetch_sub(1, Ordering::AcqRel);
                            });
                        if spawned.is_err() {
                            open.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                })?
        };
        Ok(Coordinator {
            addr,
            stop,
            open,
            table,
            accept: Some(accept),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until every client closed its connections (or `timeout` passed): the answer
    /// to a client's last request is written after the request took effect, so process 0
    /// leaving as soon as it saw the others' last keys would cut those answers off.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = later(timeout);
        while self.open.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.table.1.notify_all();
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Answers one connection's requests until it closes, fails or the coordinator stops.
fn serve(mut conn: TcpStream, table: &Table, stop: &AtomicBool) {
    let _ = conn.set_nodelay(true);
    if hello(&mut conn).is_err() {
        let _ = conn.shutdown(Shutdown::Both);
        return;
    }
    while !stop.load(Ordering::Acquire) {
        match answer(&mut conn, table, stop) {
            Ok(()) => {}
            Err(e) => {
                // A malformed or oversized request gets its reason before the connection
                // closes; a closed connection gets nothing.
                if e.kind() == io::ErrorKind::InvalidData {
                    let _ = write_failed(&mut conn, &e.to_string());
                }
                let _ = conn.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

fn write_failed(conn: &mut TcpStream, message: &str) -> io::Result<()> {
    let m = &message.as_bytes()[..message.len().min(MAX_KEY)];
    let mut out = vec![FAILED];
    out.extend_from_slice(&(m.len() as u32).to_le_bytes());
    out.extend_from_slice(m);
    conn.write_all(&out)
}

fn answer(conn: &mut TcpStream, table: &Table, stop: &AtomicBool) -> io::Result<()> {
    let mut op = [0u8];
    conn.read_exact(&mut op)?;
    let len = read_u32(conn)?;
    let key = read_bytes(conn, len.into(), MAX_KEY, "key")?;
    let key = String::from_utf8(key)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a key that is not UTF-8"))?;
    let (map, ready) = &**table;
    let found = match op[0] {
        PUT => {
            let len = read_u64(conn)?;
            let value = read_bytes(conn, len, MAX_VALUE, "value")?;
            lock(map).insert(key, value);
            ready.notify_all();
            return conn.write_all(&[DONE]);
        }
        TRY_GET => lock(map).get(&key).cloned(),
        GET => {
            let timeout = Duration::from_millis(read_u64(conn)?);
            let deadline = Instant::now().checked_add(timeout);
            let mut guard = lock(map);
            loop {
                if let Some(v) = guard.get(&key) {
                    break Some(v.clone());
                }
                let now = Instant::now();
                let left = match deadline {
                    Some(d) if d > now => d - now,
                    Some(_) => break None,
                    None => Duration::from_secs(3600),
                };
                if stop.load(Ordering::Acquire) {
                    break None;
                }
                guard = ready
                    .wait_timeout(guard, left.min(Duration::from_secs(1)))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown request {other}"),
            ))
        }
    };
    match found {
        Some(v) => {
            let mut out = Vec::with_capacity(9 + v.len());
            out.push(VALUE);
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            out.extend_from_slice(&v);
            conn.write_all(&out)
        }
        None if op[0] == GET => conn.write_all(&[TIMED_OUT]),
        None => conn.write_all(&[NOT_FOUND]),
    }
}

/// A process's client of the [`Coordinator`]: connections are opened as calls need them
/// (a get that waits holds its own) and kept for the next call.
pub struct TcpStore {
    addr: SocketAddr,
    idle: Mutex<Vec<TcpStream>>,
    closed: AtomicBool,
}

impl TcpStore {
    /// Connects to the coordinator at `addr`, retrying until `timeout` (process 0 may start
    /// after the others).
    pub fn connect(addr: &str, timeout: Duration) -> io::Result<TcpStore> {
        let deadline = later(timeout);
        let mut last: io::Error;
        loop {
            match Self::try_connect(addr) {
                Ok((addr, conn)) => {
                    return Ok(TcpStore {
                        addr,
                        idle: Mutex::new(vec![conn]),
                        closed: AtomicBool::new(false),
                    })
                }
                Err(e) => last = e,
            }
            if last.kind() == io::ErrorKind::InvalidData || Instant::now() >= deadline {
                return Err(last);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_connect(addr: &str) -> io::Result<(SocketAddr, TcpStream)> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
                Ok(mut s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(Duration::from_secs(30)))?;
                    hello(&mut s)?;
                    return Ok((a, s));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Closes the connections; every later call fails (the process left the job, though a
    /// client created with this store may live on).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for c in lock(&self.idle).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    fn unavailable(&self, key: &str, e: io::Error) -> KvError {
        KvError {
            code: ErrorCode::Unavailable,
            message: format!("coordinator {}: {key:?}: {e}", self.addr),
        }
    }

    /// Sends one request and reads its answer on an idle or new connection.
    fn call(&self, key: &str, op: u8, tail: &[u8], wait: Duration) -> Result<Answer, KvError> {
        if key.len() > MAX_KEY {
            return Err(KvError {
                code: ErrorCode::InvalidArgument,
                message: format!(
                    "a key of {} bytes is over the limit of {MAX_KEY}",
                    key.len()
                ),
            });
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(KvError {
                code: ErrorCode::Unavailable,
                message: format!(
                    "{key:?}: this process left the job of coordinator {}",
                    self.addr
                ),
            });
        }
        let conn = lock(&self.idle).pop();
        let mut conn = match conn {
            Some(c) => c,
            None => {
                Self::try_connect(&self.addr.to_string())
                    .map_err(|e| self.unavailable(key, e))?
                    .1
            }
        };
        let result = (|| {
            conn.set_read_timeout(Some(wait.saturating_add(Duration::from_secs(30))))?;
            let mut req = Vec::with_capacity(5 + key.len() + tail.len());
            req.push(op);
            req.extend_from_slice(&(key.len() as u32).to_le_bytes());
            req.extend_from_slice(key.as_bytes());
            req.extend_from_slice(tail);
            conn.write_all(&req)?;
            let mut status = [0u8];
            conn.read_exact(&mut status)?;
            Ok(match status[0] {
                VALUE => {
                    let len = read_u64(&mut conn)?;
                    Answer::Value(read_bytes(&mut conn, len, MAX_VALUE, "value")?)
                }
                DONE => Answer::Done,
                NOT_FOUND => Answer::NotFound,
                TIMED_OUT => Answer::TimedOut,
                FAILED => {
                    let len = read_u32(&mut conn)?;
                    let m = read_bytes(&mut conn, len.into(), MAX_KEY, "message")?;
                    Answer::Failed(String::from_utf8_lossy(&m).into_owned())
                }
                s => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the coordinator answered status {s}"),
                    ))
                }
            })
        })();
        match result {
            Ok(Answer::Failed(m)) => Err(KvError {
                code: ErrorCode::InvalidArgument,
                message: format!("coordinator {}: {key:?}: {m}", self.addr),
            }),
            Ok(a) => {
                if !self.closed.load(Ordering::Acquire) {
                    lock(&self.idle).push(conn);
                }
                Ok(a)
            }
            Err(e) => Err(self.unavailable(key, e)),
        }
    }
}

enum Answer {
    Value(Vec<u8>),
    Done,
    NotFound,
    TimedOut,
    Failed(String),
}

impl KeyValueStore for TcpStore {
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError> {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        match self.call(key, GET, &ms.to_le_bytes(), timeout)? {
            Answer::Value(v) => Ok(v),
            _ => Err(KvError {
                code: ErrorCode::DeadlineExceeded,
                message: format!(
                    "coordinator {}: no process put {key:?} within {:.1} s",
                    self.addr,
                    timeout.as_secs_f64()
                ),
            }),
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        match self.call(key, TRY_GET, &[], Duration::ZERO)? {
            Answer::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        if value.len() > MAX_VALUE {
            return Err(KvError {
                code: ErrorCode::InvalidArgument,
                message: format!(
                    "{key:?}: a value of {} bytes is over the limit of {MAX_VALUE}",
                    value.len()
                ),
            });
        }
        let mut tail = Vec::with_capacity(8 + value.len());
        tail.extend_from_slice(&(value.len() as u64).to_le_bytes());
        tail.extend_from_slice(value);
        self.call(key, PUT, &tail, Duration::ZERO).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_waits_for_a_put_from_another_client() {
        let c = Coordinator::bind("127.0.0.1:0").unwrap();
        let addr = c.addr().to_string();
        let a = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
        let b = Arc::new(TcpStore::connect(&addr, Duration::from_secs(5)).unwrap());
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || b.get("k", Duration::from_secs(20)))
        };
        std::thread::sleep(Duration::from_millis(200));
        // A put from the waiting client's own process passes on another connection.
        b.put("other", b"x").unwrap();
        a.put("k", &[0, 1, 2, 255]).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), vec![0, 1, 2, 255]);
        assert_eq!(a.try_get("other").unwrap(), Some(b"x".to_vec()));
        assert_eq!(a.try_get("nobody").unwrap(), None);
        let e = a.get("nobody", Duration::from_millis(150)).unwrap_err();
        assert_eq!(e.code, ErrorCode::DeadlineExceeded);
        assert!(e.message.contains("nobody"), "{e}");
    }

    #[test]
    fn oversized_and_foreign_frames_are_refused_by_name() {
        let c = Coordinator::bind("127.0.0.1:0").unwrap();
        // A declared length past the limit is refused before anything is allocated.
        let mut s = TcpStream::connect(c.addr()).unwrap();
        hello(&mut s).unwrap();
        let mut req = vec![PUT];
        req.extend_from_slice(&1u32.to_le_bytes());
        req.push(b'k');
        req.extend_from_slice(&u64::MAX.to_le_bytes());
        s.write_all(&req).unwrap();
        let mut status = [0u8];
        s.read_exact(&mut status).unwrap();
        assert_eq!(status[0], FAILED);
        let len = read_u32(&mut s).unwrap();
        let m = read_bytes(&mut s, len.into(), MAX_KEY, "message").unwrap();
        assert!(String::from_utf8_lossy(&m).contains("over the limit"));

        // A client of something that is not a coordinator says so at once.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = other.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = other.accept().unwrap();
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        });
        let e = TcpStore::connect(&addr.to_string(), Duration::from_secs(30))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not a zoo coordinator"), "{e}");

        let store = TcpStore::connect(&c.addr().to_string(), Duration::from_secs(5)).unwrap();
        let e = store.put("k", &vec![0u8; MAX_VALUE + 1]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
    }

    #[test]
    fn nobody_listening_is_unavailable_after_the_timeout() {
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let t = Instant::now();
        let e = TcpStore::connect(&free.to_string(), Duration::from_millis(400))
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert!(t.elapsed() >= Duration::from_millis(400));
    }
}
