//! The server's front door: its own accept loop, TLS handshakes and each connection's life.
//!
//! tonic's own accept stream ends for good on an error it does not list (EMFILE, ENOMEM, a TLS
//! handshake that fails), after which the process serves nothing and says nothing. Here the
//! accept loop never ends by itself: an accept error is logged (at most one line a second, with
//! the count of the others), the loop backs off (5 ms doubling to 1 s) and goes on. Each
//! connection is admitted against caps on open connections per peer address and per address
//! block (an IPv4 /24, an IPv6 /64; beyond either: closed at once) and in all: at that cap the
//! oldest connection that has sent no call is dropped to make room, else the one idle longest (a
//! newcomer is refused only when every connection is busy or called within `EVICT_IDLE`). A connection has `handshake_timeout` to finish TLS, then
//! `first_request_timeout` to send its first call (the HTTP/2 preface, SETTINGS and a request's
//! headers), and is served by hyper's HTTP/2 with keepalive pings; it is closed gracefully
//! (GOAWAY, the calls in flight finish) once idle (no call) for `idle_timeout` or older than
//! `max_age`, and dropped `AGE_GRACE` later; one whose answers wait unread (a peer that grants
//! no flow-control window) for `send_stall_timeout` is dropped at once.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// After a connection is asked to close (idle, age, stop), how long its calls in flight have.
const AGE_GRACE: Duration = Duration::from_secs(30);
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_MOST: Duration = Duration::from_secs(1);
/// The most header bytes a call may carry (a token, a path and gRPC's few headers need < 8 KiB).
const MAX_HEADER_BYTES: u32 = 16 << 10;
/// At the connection cap, a connection idle this long (and holding no answer) may be dropped for a
/// newcomer when none is silent; one that called just now keeps its place.
const EVICT_IDLE: Duration = Duration::from_secs(1);

/// What a connection may take: caps, timeouts and HTTP/2 settings.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub max_connections_per_block: usize,
    pub handshake_timeout: Duration,
    pub first_request_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_age: Duration,
    pub send_stall_timeout: Duration,
    pub max_concurrent_streams: u32,
    pub window_bytes: u32,
}

/// What the front door saw, for `Server.stats`.
#[derive(Default)]
pub struct Stats {
    pub accepted: AtomicU64,
    pub accept_errors: AtomicU64,
    pub over_cap: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub closed_idle: AtomicU64,
    pub closed_age: AtomicU64,
    pub closed_silent: AtomicU64,
    pub closed_stalled: AtomicU64,
    pub evicted: AtomicU64,
    pub open: AtomicUsize,
}

/// One line a second at most, with how many were not written since the last.
pub struct Throttled {
    what: &'static str,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttled {
    pub const fn new(what: &'static str) -> Self {
        Throttled { what, state: Mutex::new((None, 0)) }
    }

    pub fn log(&self, detail: &dyn std::fmt::Display) {
        let mut state = self.state.lock().unwrap();
        let now = Instant::now();
        if state.0.is_some_and(|last| now.duration_since(last) < Duration::from_secs(1)) {
            state.1 += 1;
            return;
        }
        let more = std::mem::take(&mut state.1);
        state.0 = Some(now);
        drop(state);
        if more > 0 {
            eprintln!("mxref native gRPC server: {}: {detail} (and {more} more since the last line)", self.what);
        } else {
            eprintln!("mxref native gRPC server: {}: {detail}", self.what);
        }
    }
}

static ACCEPT_FAILED: Throttled = Throttled::new("accept failed, backing off");
static OVER_CAP: Throttled = Throttled::new("connection refused");

/// An address block: an IPv4 /24 or an IPv6 /64 (one host is often handed a whole /64).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Block {
    V4(u32),
    V6(u64),
}

fn block_of(ip: IpAddr) -> Block {
    match ip.to_canonical() {
        IpAddr::V4(v4) => Block::V4(u32::from(v4) & 0xFFFF_FF00),
        IpAddr::V6(v6) => Block::V6((u128::from(v6) >> 64) as u64),
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Block::V4(net) => write!(f, "{}/24", std::net::Ipv4Addr::from(*net)),
            Block::V6(net) => write!(f, "{}/64", std::net::Ipv6Addr::from(u128::from(*net) << 64)),
        }
    }
}

/// An open connection as the gate sees it: what it has done, and how to drop it.
struct Open {
    activity: Arc<Activity>,
    evict: Arc<Notify>,
}

/// The connections open, in all, per peer address and per address block.
struct Gate {
    limits: Limits,
    state: Mutex<GateState>,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct GateState {
    per_peer: HashMap<IpAddr, usize>,
    per_block: HashMap<Block, usize>,
    /// Every connection not yet dropped, by id (the order they were accepted in).
    open: BTreeMap<u64, Open>,
    next_id: u64,
}

/// An admitted connection's place: given back when dropped.
struct Ticket {
    gate: Arc<Gate>,
    ip: IpAddr,
    id: u64,
    activity: Arc<Activity>,
    evict: Arc<Notify>,
}

impl Gate {
    fn admit(gate: &Arc<Gate>, ip: IpAddr) -> Result<Ticket, String> {
        let ip = ip.to_canonical();
        let block = block_of(ip);
        let mut state = gate.state.lock().unwrap();
        let mine = state.per_peer.get(&ip).copied().unwrap_or(0);
        if mine >= gate.limits.max_connections_per_peer {
            return Err(format!("{ip} has {mine} connections open, the most one address may"));
        }
        let ours = state.per_block.get(&block).copied().unwrap_or(0);
        if ours >= gate.limits.max_connections_per_block {
            return Err(format!("{block} has {ours} connections open, the most one address block may"));
        }
        let open = gate.stats.open.load(Ordering::Relaxed);
        if open >= gate.limits.max_connections {
            // room for the newcomer: the oldest connection that has sent no call goes, else the one
            // idle longest (no call in flight, no answer waiting, idle `EVICT_IDLE` at least)
            let silent = state.open.iter().find(|(_, c)| !c.activity.ever.load(Ordering::Relaxed)).map(|(id, _)| *id);
            let victim = silent.or_else(|| {
                state
                    .open
                    .iter()
                    .map(|(id, c)| (*id, c.activity.idle_for(), c.activity.unsent.load(Ordering::Relaxed)))
                    .filter(|(_, idle, unsent)| *unsent == 0 && *idle >= EVICT_IDLE)
                    .max_by_key(|(_, idle, _)| *idle)
                    .map(|(id, _, _)| id)
            });
            let Some(victim) = victim else {
                return Err(format!("{open} connections open, the most allowed, each busy or called within the last second"));
            };
            if let Some(gone) = state.open.remove(&victim) {
                gone.evict.notify_one();
                gate.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        *state.per_peer.entry(ip).or_insert(0) += 1;
        *state.per_block.entry(block).or_insert(0) += 1;
        let id = state.next_id;
        state.next_id += 1;
        let (activity, evict) = (Activity::new(), Arc::new(Notify::new()));
        state.open.insert(id, Open { activity: activity.clone(), evict: evict.clone() });
        gate.stats.open.fetch_add(1, Ordering::Relaxed);
        Ok(Ticket { gate: gate.clone(), ip, id, activity, evict })
    }
}

fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock().unwrap();
        release(&mut state.per_peer, &self.ip);
        release(&mut state.per_block, &block_of(self.ip));
        state.open.remove(&self.id);
        self.gate.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Calls in flight on one connection and when the last one ended (the idle clock); whether it
/// has sent a call at all; the bytes of its answers not yet handed to HTTP/2, and when a byte of
/// them last was (the stall clock).
#[derive(Default)]
pub struct Activity {
    active: AtomicUsize,
    last_ms: AtomicU64,
    started: std::sync::OnceLock<Instant>,
    ever: AtomicBool,
    pub unsent: AtomicUsize,
    sent_ms: AtomicU64,
}

/// One call in flight: ends when dropped.
pub struct Busy(Arc<Activity>);

impl Activity {
    fn new() -> Arc<Self> {
        let activity = Activity::default();
        let _ = activity.started.set(Instant::now());
        Arc::new(activity)
    }

    fn now_ms(&self) -> u64 {
        self.started.get().map_or(0, |s| s.elapsed().as_millis() as u64)
    }

    pub fn begin(self: &Arc<Self>) -> Busy {
        self.ever.store(true, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.now_ms().saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }

    /// Answer bytes handed on (or newly waiting after none were): the stall clock starts again.
    pub fn sent(&self) {
        self.sent_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// How long answers have waited without a byte handed on (zero when none wait).
    fn stalled_for(&self) -> Duration {
        if self.unsent.load(Ordering::Relaxed) == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.now_ms().saturating_sub(self.sent_ms.load(Ordering::Relaxed)))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_ms.store(self.0.now_ms(), Ordering::Relaxed);
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Makes the service of one connection (it knows the peer and the connection's activity).
pub type MakeService = dyn Fn(SocketAddr, Arc<Activity>) -> crate::server::Router + Send + Sync;

/// Serve `listener` until `stop` says so (its value: the grace the calls in flight have), then
/// wait for every connection to end. Never returns before: an accept error is logged, backed
/// off from and served past.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    stats: Arc<Stats>,
    make: Arc<MakeService>,
    mut stop: watch::Receiver<Option<f64>>,
) {
    let gate = Arc::new(Gate { limits: limits.clone(), state: Mutex::new(GateState::default()), stats: stats.clone() });
    let mut connections = JoinSet::new();
    let mut backoff = Duration::ZERO;
    loop {
        while connections.try_join_next().is_some() {}
        if stop.borrow().is_some() {
            break;
        }
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff = Duration::ZERO;
                accepted
            }
            Err(e) => {
                stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                backoff = (backoff * 2).clamp(BACKOFF_FIRST, BACKOFF_MOST);
                ACCEPT_FAILED.log(&format_args!("{e} (next try in {} ms)", backoff.as_millis()));
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = tokio::time::sleep(backoff) => continue,
                }
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let ticket = match Gate::admit(&gate, peer.ip()) {
            Ok(ticket) => ticket,
            Err(why) => {
                stats.over_cap.fetch_add(1, Ordering::Relaxed);
                OVER_CAP.log(&why);
                drop(stream);
                continue;
            }
        };
        let (tls, limits, stats, make, stop) = (tls.clone(), limits.clone(), stats.clone(), make.clone(), stop.clone());
        connections.spawn(async move {
            let (activity, evict) = (ticket.activity.clone(), ticket.evict.clone());
            tokio::select! {
                _ = connection(stream, peer, tls, limits, stats, make, stop, activity) => {}
                _ = evict.notified() => {}
            }
            drop(ticket);
        });
    }
    while connections.join_next().await.is_some() {}
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    stats: Arc<Stats>,
    make: Arc<MakeService>,
    mut stop: watch::Receiver<Option<f64>>,
    activity: Arc<Activity>,
) {
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return http2(stream, peer, limits, stats, make, stop, activity).await;
    };
    let handshake = tokio::time::timeout(limits.handshake_timeout, tls.accept(stream));
    let stream = tokio::select! {
        _ = stop.changed() => return,
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(_)) | Err(_) => {
                stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                return;
            }
        },
    };
    http2(stream, peer, limits, stats, make, stop, activity).await
}

async fn http2<I>(
    io: I,
    peer: SocketAddr,
    limits: Limits,
    stats: Arc<Stats>,
    make: Arc<MakeService>,
    mut stop: watch::Receiver<Option<f64>>,
    activity: Arc<Activity>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = make(peer, activity.clone());
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .initial_stream_window_size(limits.window_bytes)
        .initial_connection_window_size(limits.window_bytes)
        .max_header_list_size(MAX_HEADER_BYTES)
        .keep_alive_interval(Some(limits.keepalive_interval))
        .keep_alive_timeout(limits.keepalive_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // the age of each connection differs a little (by its port), so a fleet does not reconnect at once
    let spread = 0.9 + 0.2 * f64::from(peer.port() % 1000) / 1000.0;
    let age = tokio::time::sleep(limits.max_age.mul_f64(spread));
    tokio::pin!(age);
    let hard_stop = tokio::time::sleep(Duration::from_secs(86400 * 365));
    tokio::pin!(hard_stop);
    // the first call's headers are due this long after accept (after TLS, with it)
    let first_request = tokio::time::sleep(limits.first_request_timeout);
    tokio::pin!(first_request);
    let check_every = (limits.idle_timeout.min(limits.send_stall_timeout) / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut idle_check = tokio::time::interval(check_every);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = &mut first_request, if !activity.ever.load(Ordering::Relaxed) => {
                stats.closed_silent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ = &mut age, if !closing => {
                stats.closed_age.fetch_add(1, Ordering::Relaxed);
                conn.as_mut().graceful_shutdown();
                closing = true;
                hard_stop.as_mut().reset(tokio::time::Instant::now() + AGE_GRACE);
            }
            _ = idle_check.tick() => {
                if activity.stalled_for() >= limits.send_stall_timeout {
                    stats.closed_stalled.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                if !closing && activity.idle_for() >= limits.idle_timeout {
                    stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    hard_stop.as_mut().reset(tokio::time::Instant::now() + AGE_GRACE);
                }
            }
            changed = stop.changed(), if !closing => {
                let grace = if changed.is_ok() { stop.borrow().unwrap_or(0.0) } else { 0.0 };
                conn.as_mut().graceful_shutdown();
                closing = true;
                hard_stop.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs_f64(grace.clamp(0.0, 60.0) + 1.0));
            }
            _ = &mut hard_stop => return,
        }
    }
}

/// The TLS acceptor of a PEM certificate chain and key (rustls, HTTP/2 by ALPN); why not, as text.
pub fn tls_acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<tokio_rustls::TlsAcceptor, String> {
    use tokio_rustls::rustls;
    let certs = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if certs.is_empty() {
        return Err("certificate: no PEM certificate in it".to_string());
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| format!("key: {e}"))?
        .ok_or_else(|| "key: no PEM private key in it".to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
