//! Running a routed call's steps: over connections this module keeps to each node (reused,
//! reconnected after a failure, authenticated with `auth-user`/`auth-password`), and locally
//! under the GIL for the steps that fall on this server. Worker threads do the waiting, so a
//! forwarded call blocks its client, never the server.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis_module::raw;

use crate::commands::Reply;
use crate::reshard::migrate;
use crate::route::{
    encode_command, execute, read_reply, Endpoint, Plan, Resp, Routed, Step, StepError,
    StepErrorKind,
};

/// Worker threads that wait on other nodes.
const WORKERS: usize = 4;

/// Counters shown in `INFO shard`.
#[derive(Debug, Default, Clone)]
pub struct RouteStats {
    pub local: u64,
    pub forwarded: u64,
    pub fallbacks: u64,
    pub copies: u64,
    pub timeouts: u64,
    pub errors: u64,
    /// Per node: (errors, timeouts).
    pub per_node: BTreeMap<String, (u64, u64)>,
}

static STATS: Mutex<Option<RouteStats>> = Mutex::new(None);

pub fn stats() -> RouteStats {
    STATS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_default()
}

pub fn count(update: impl FnOnce(&mut RouteStats)) {
    let mut guard = STATS.lock().unwrap_or_else(PoisonError::into_inner);
    update(guard.get_or_insert_with(RouteStats::default));
}

/// How a worker reaches other nodes.
#[derive(Debug, Clone)]
pub struct Link {
    pub timeout: Duration,
    pub auth: Option<(String, String)>,
    pub resp3: bool,
}

/// A blocked client handed to a worker.
struct Blocked(*mut raw::RedisModuleBlockedClient);
// SAFETY: Redis allows a blocked client to be replied to and unblocked from any thread.
unsafe impl Send for Blocked {}

struct Job {
    plan: Plan,
    link: Link,
    client: Blocked,
}

static QUEUE: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

fn queue() -> &'static Mutex<Sender<Job>> {
    QUEUE.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..WORKERS {
            let rx = Arc::clone(&rx);
            let spawned = std::thread::Builder::new()
                .name(format!("shard-call-{i}"))
                .spawn(move || worker(&rx));
            if let Err(e) = spawned {
                redis_module::logging::log_warning(format!(
                    "shard: cannot start a call worker: {e}"
                ));
            }
        }
        Mutex::new(tx)
    })
}

/// Blocks the client and hands the plan to a worker, which replies and unblocks it.
///
/// # Safety
/// `ctx` must be the live context of the command being run.
pub unsafe fn submit(ctx: *mut raw::RedisModuleCtx, plan: Plan, link: Link) -> Result<(), String> {
    // SAFETY: ctx is the live context of a command; no callbacks: the worker replies through a
    // thread-safe context bound to the blocked client.
    let bc = unsafe {
        let block = raw::RedisModule_BlockClient.ok_or("RedisModule_BlockClient is missing")?;
        block(ctx, None, None, None, 0)
    };
    if bc.is_null() {
        return Err("the client cannot be blocked".into());
    }
    let job = Job {
        plan,
        link,
        client: Blocked(bc),
    };
    let sent = queue()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send(job);
    if let Err(failed) = sent {
        finish(
            &failed.0.client,
            Err("the call workers are not running".into()),
        );
    }
    Ok(())
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    let mut pool = Pool::default();
    loop {
        let job = match rx.lock().unwrap_or_else(PoisonError::into_inner).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut steps = Steps {
                pool: &mut pool,
                link: &job.link,
                client: &job.client,
            };
            execute(&job.plan, &mut steps)
        }));
        let result = match outcome {
            Ok(Ok(routed)) => {
                count(|s| {
                    s.forwarded += 1;
                    s.fallbacks += u64::from(routed.fallback);
                    s.copies += u64::from(routed.copied);
                });
                Ok(routed)
            }
            Ok(Err(e)) => {
                count(|s| {
                    let node = s.per_node.entry(e.node.clone()).or_default();
                    if e.kind == StepErrorKind::Timeout {
                        node.1 += 1;
                        s.timeouts += 1;
                    } else {
                        node.0 += 1;
                        s.errors += 1;
                    }
                });
                Err(format!("ERR shard.call: {e}"))
            }
            Err(_) => Err("ERR shard.call: internal error; see the Redis log".into()),
        };
        finish(&job.client, result);
    }
}

/// Replies to the blocked client and unblocks it.
fn finish(client: &Blocked, result: Result<Routed, String>) {
    // SAFETY: the blocked client is live until RedisModule_UnblockClient, called last here.
    unsafe {
        let (Some(get_ctx), Some(free_ctx), Some(unblock)) = (
            raw::RedisModule_GetThreadSafeContext,
            raw::RedisModule_FreeThreadSafeContext,
            raw::RedisModule_UnblockClient,
        ) else {
            return;
        };
        let ctx = get_ctx(client.0);
        let reply = Reply::new(ctx);
        match result {
            Ok(routed) => reply.resp(&routed.reply),
            Err(message) => reply.error(&message),
        }
        free_ctx(ctx);
        unblock(client.0, std::ptr::null_mut());
    }
}

/// Connections to other nodes, per (address, RESP3).
#[derive(Default)]
struct Pool {
    idle: HashMap<(String, bool), Conn>,
}

struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(at: &Endpoint, link: &Link) -> Result<Conn, StepError> {
        let fail = |e: io::Error| io_error(at, "cannot connect", &e, link, Unanswered::Yes);
        let addr = (at.host.as_str(), at.port)
            .to_socket_addrs()
            .map_err(fail)?
            .next()
            .ok_or_else(|| StepError::new(at, "the address does not resolve"))?;
        let stream = TcpStream::connect_timeout(&addr, link.timeout).map_err(fail)?;
        stream.set_read_timeout(Some(link.timeout)).map_err(fail)?;
        stream.set_write_timeout(Some(link.timeout)).map_err(fail)?;
        stream.set_nodelay(true).map_err(fail)?;
        let mut conn = Conn {
            reader: BufReader::new(stream),
        };
        let mut hello: Vec<Vec<u8>> = Vec::new();
        if link.resp3 || link.auth.is_some() {
            hello.push(b"HELLO".to_vec());
            hello.push(if link.resp3 {
                b"3".to_vec()
            } else {
                b"2".to_vec()
            });
            if let Some((user, password)) = &link.auth {
                let user = if user.is_empty() {
                    "default"
                } else {
                    user.as_str()
                };
                hello.extend([
                    b"AUTH".to_vec(),
                    user.as_bytes().to_vec(),
                    password.as_bytes().to_vec(),
                ]);
            }
            if let Resp::Error(e) = conn.request(at, link, &hello)? {
                return Err(StepError::new(
                    at,
                    format!("handshake refused: {}", String::from_utf8_lossy(&e)),
                ));
            }
        }
        Ok(conn)
    }

    /// Whether an idle pooled connection can no longer be used: the node closed it (a restart,
    /// or its `timeout` for idle clients), or something arrived unasked. One non-blocking peek.
    fn closed_while_idle(&self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let mut byte = 0u8;
        // SAFETY: a valid socket and a one-byte buffer that outlives the call.
        let n = unsafe {
            libc::recv(
                self.reader.get_ref().as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // -1 with EAGAIN: open and quiet. 0: closed. > 0: unasked data. Other errors: unusable.
        n != -1 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }

    fn request(&mut self, at: &Endpoint, link: &Link, args: &[Vec<u8>]) -> Result<Resp, StepError> {
        let bytes = encode_command(args);
        self.reader
            .get_mut()
            .write_all(&bytes)
            .map_err(|e| io_error(at, "cannot send", &e, link, Unanswered::Yes))?;
        // Until the first byte of the reply arrives, a closed connection means the node did not
        // answer at all; once some of it has, the command ran and must never be sent again.
        match self.reader.fill_buf() {
            Ok([]) => {
                let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
                return Err(io_error(at, "no reply", &eof, link, Unanswered::Yes));
            }
            Ok(_) => {}
            Err(e) => return Err(io_error(at, "no reply", &e, link, Unanswered::Yes)),
        }
        read_reply(&mut self.reader).map_err(|e| match e {
            crate::route::RespError::Io(io) => {
                io_error(at, "reply cut short", &io, link, Unanswered::No)
            }
            other => StepError::new(at, other.to_string()),
        })
    }
}

/// Whether an I/O error came before any byte of the reply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unanswered {
    Yes,
    No,
}

fn io_error(
    at: &Endpoint,
    what: &str,
    e: &io::Error,
    link: &Link,
    unanswered: Unanswered,
) -> StepError {
    use io::ErrorKind::*;
    match e.kind() {
        WouldBlock | TimedOut => StepError::of_kind(
            at,
            format!("did not answer within {} ms", link.timeout.as_millis()),
            StepErrorKind::Timeout,
        ),
        UnexpectedEof | ConnectionReset | BrokenPipe if unanswered == Unanswered::Yes => {
            StepError::of_kind(at, format!("{what}: {e}"), StepErrorKind::Closed)
        }
        _ => StepError::new(at, format!("{what}: {e}")),
    }
}

/// The steps of one call, run by a worker.
struct Steps<'a> {
    pool: &'a mut Pool,
    link: &'a Link,
    client: &'a Blocked,
}

impl Steps<'_> {
    fn remote(&mut self, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
        let reply = self.remote_reply(at, args)?;
        match &reply {
            // The node wants credentials this module was not given: say which node.
            Resp::Error(e) if e.starts_with(b"NOAUTH") => Err(StepError::new(
                at,
                format!(
                    "{}: set shard.auth-password (and shard.auth-user)",
                    String::from_utf8_lossy(e)
                ),
            )),
            _ => Ok(reply),
        }
    }

    fn remote_reply(&mut self, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
        let key = (at.address.clone(), self.link.resp3);
        // A pooled connection the node closed while it was idle is dropped, not tried.
        let pooled = self
            .pool
            .idle
            .remove(&key)
            .filter(|conn| !conn.closed_while_idle());
        if let Some(mut conn) = pooled {
            match conn.request(at, self.link, args) {
                Ok(reply) => {
                    self.pool.idle.insert(key, conn);
                    return Ok(reply);
                }
                // The node closed it between that check and the request, without answering a
                // byte (the race of an idle timeout): send once more on a new connection.
                Err(e) if e.kind == StepErrorKind::Closed => {}
                Err(e) => return Err(e),
            }
        }
        let mut conn = Conn::open(at, self.link)?;
        let reply = conn.request(at, self.link, args)?;
        self.pool.idle.insert(key, conn);
        Ok(reply)
    }

    /// Runs a command on this server, under the GIL, replicated like the command itself.
    fn local(&mut self, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
        let flags: &[u8] = if self.link.resp3 { b"v!E3\0" } else { b"v!E\0" };
        // SAFETY: the thread-safe context is bound to the live blocked client; every string
        // created is freed before the context is unlocked and freed.
        unsafe { call_locally(self.client.0, args, flags) }.map_err(|e| StepError::new(at, e))
    }
}

impl Step for Steps<'_> {
    fn run(&mut self, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
        if at.is_self {
            self.local(at, args)
        } else {
            self.remote(at, args)
        }
    }

    fn copy(&mut self, from: &Endpoint, to: &Endpoint, key: &[u8]) -> Result<(), StepError> {
        let timeout_ms = u64::try_from(self.link.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut args = vec![b"MIGRATE".to_vec()];
        args.extend(migrate::copy_args(
            &to.host,
            to.port,
            key,
            timeout_ms,
            false,
            self.link.auth.as_ref(),
        ));
        match self.run(from, &args)? {
            Resp::Error(e) if !e.windows(7).any(|w| w == b"BUSYKEY") => Err(StepError::new(
                from,
                format!(
                    "copying the key to {} failed: {}",
                    to.name,
                    String::from_utf8_lossy(&e)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// RM_Call under the GIL from a worker, returning the reply parsed from its protocol bytes.
unsafe fn call_locally(
    bc: *mut raw::RedisModuleBlockedClient,
    args: &[Vec<u8>],
    flags: &[u8],
) -> Result<Resp, String> {
    let missing = || "a Redis module API function is missing".to_string();
    let get_ctx = raw::RedisModule_GetThreadSafeContext.ok_or_else(missing)?;
    let free_ctx = raw::RedisModule_FreeThreadSafeContext.ok_or_else(missing)?;
    let lock = raw::RedisModule_ThreadSafeContextLock.ok_or_else(missing)?;
    let unlock = raw::RedisModule_ThreadSafeContextUnlock.ok_or_else(missing)?;
    let call = raw::RedisModule_Call.ok_or_else(missing)?;
    let create = raw::RedisModule_CreateString.ok_or_else(missing)?;
    let free_string = raw::RedisModule_FreeString.ok_or_else(missing)?;
    let proto = raw::RedisModule_CallReplyProto.ok_or_else(missing)?;
    let free_reply = raw::RedisModule_FreeCallReply.ok_or_else(missing)?;
    let (name, rest) = args.split_first().ok_or("no command")?;
    let name =
        CString::new(name.clone()).map_err(|_| "a command name with a NUL byte".to_string())?;

    let ctx = get_ctx(bc);
    lock(ctx);
    let mut argv: Vec<*mut raw::RedisModuleString> = rest
        .iter()
        .map(|a| create(ctx, a.as_ptr().cast(), a.len()))
        .collect();
    let reply = call(
        ctx,
        name.as_ptr(),
        flags.as_ptr().cast(),
        argv.as_mut_ptr(),
        argv.len(),
    );
    let result = if reply.is_null() {
        Err(format!(
            "the command could not run here: {}",
            io::Error::last_os_error()
        ))
    } else {
        let mut len = 0usize;
        let ptr = proto(reply, &mut len);
        let bytes = if ptr.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        };
        let parsed = read_reply(&mut &bytes[..]).map_err(|e| e.to_string());
        free_reply(reply);
        parsed
    };
    for s in argv {
        free_string(ctx, s);
    }
    unlock(ctx);
    free_ctx(ctx);
    result
}

/// Timeout of forwarded calls from the configuration.
pub fn link_timeout(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms.max(1)).unwrap_or(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(port: u16) -> Endpoint {
        Endpoint {
            name: "n1".into(),
            host: "127.0.0.1".into(),
            port,
            address: format!("127.0.0.1:{port}"),
            is_self: false,
        }
    }

    fn link() -> Link {
        Link {
            timeout: Duration::from_millis(250),
            auth: None,
            resp3: false,
        }
    }

    #[test]
    fn io_errors_map_to_the_kind_that_decides_a_resend() {
        let (at, link) = (endpoint(6379), link());
        let kind = |k: io::ErrorKind, unanswered| {
            io_error(&at, "no reply", &io::Error::from(k), &link, unanswered)
        };
        let timeout = kind(io::ErrorKind::TimedOut, Unanswered::Yes);
        assert_eq!(timeout.kind, StepErrorKind::Timeout);
        assert_eq!(timeout.message, "did not answer within 250 ms");
        assert_eq!(
            kind(io::ErrorKind::WouldBlock, Unanswered::No).kind,
            StepErrorKind::Timeout
        );
        for closed in [
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
        ] {
            assert_eq!(
                kind(closed, Unanswered::Yes).kind,
                StepErrorKind::Closed,
                "{closed:?}"
            );
            // Once part of the reply arrived, the command ran: never a resend.
            assert_eq!(
                kind(closed, Unanswered::No).kind,
                StepErrorKind::Failed,
                "{closed:?}"
            );
        }
        let refused = kind(io::ErrorKind::ConnectionRefused, Unanswered::Yes);
        assert_eq!(refused.kind, StepErrorKind::Failed);
        assert!(
            refused.message.starts_with("no reply: "),
            "{}",
            refused.message
        );
    }

    /// A node on a local listener: accepts connections and runs `serve` on each, counting them.
    fn fake_node(
        serve: impl Fn(TcpStream) + Send + 'static,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for stream in listener.incoming().take(4).flatten() {
                counter.fetch_add(1, Ordering::SeqCst);
                serve(stream);
            }
        });
        (port, accepted)
    }

    fn read_request(stream: &mut TcpStream) {
        let mut reader = BufReader::new(stream);
        // Tests send one `*1\r\n$4\r\nPING\r\n`: three lines.
        for _ in 0..3 {
            let mut line = String::new();
            reader.read_line(&mut line).expect("request");
        }
    }

    #[test]
    fn a_connection_closed_while_idle_is_seen_before_reuse() {
        use std::sync::atomic::Ordering;
        let (port, accepted) = fake_node(|mut s| {
            read_request(&mut s);
            s.write_all(b"+PONG\r\n").expect("reply");
            // Then close, as a node does with an idle client after `timeout`.
        });
        let (at, link) = (endpoint(port), link());
        let mut conn = Conn::open(&at, &link).expect("connect");
        assert!(!conn.closed_while_idle(), "a fresh connection is open");
        let reply = conn
            .request(&at, &link, &[b"PING".to_vec()])
            .expect("reply");
        assert_eq!(reply, Resp::Simple(b"PONG".to_vec()));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !conn.closed_while_idle() {
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_reply_cut_short_is_a_failure_never_a_resend() {
        let (port, _) = fake_node(|mut s| {
            read_request(&mut s);
            s.write_all(b"$10\r\nhalf").expect("reply");
        });
        let (at, link) = (endpoint(port), link());
        let mut conn = Conn::open(&at, &link).expect("connect");
        let err = conn
            .request(&at, &link, &[b"PING".to_vec()])
            .expect_err("cut short");
        assert_eq!(err.kind, StepErrorKind::Failed, "{err}");
    }

    #[test]
    fn a_close_before_any_reply_byte_may_be_resent() {
        let (port, _) = fake_node(|mut s| read_request(&mut s));
        let (at, link) = (endpoint(port), link());
        let mut conn = Conn::open(&at, &link).expect("connect");
        let err = conn
            .request(&at, &link, &[b"PING".to_vec()])
            .expect_err("closed");
        assert_eq!(err.kind, StepErrorKind::Closed, "{err}");
    }
}
