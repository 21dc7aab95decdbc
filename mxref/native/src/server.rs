//! The metadata server's transport: accepts calls of the methods Python lists (`Server(methods=)`),
//! refuses a call without an accepted token before reading its body, queues the rest (reads and
//! writes apart) for Python's workers (`Server.take`), and sends their answers (`Incoming.answer`).
//! It keeps no rule of the service's own: the names, which calls are reads and the token's
//! metadata key come from Python (`mxref.metadata.native`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tonic::codegen::{http, BoxFuture};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::{front, RawCodec, WINDOW_BYTES};

/// One method Python serves (`Server(methods=...)`): its service and name, and whether it is a
/// read. Reads (a listing, a lookup) and writes wait in queues of their own, taken in turn.
#[derive(Clone, Copy)]
struct Route {
    service: &'static str,
    method: &'static str,
    read: bool,
}

/// The method table Python gave, by path (`service/method`). Its names live as long as the
/// process (a server is made a few times per process; the strings are a few bytes each).
fn routes(methods: Vec<(String, String, bool)>) -> PyResult<HashMap<String, Route>> {
    if methods.is_empty() {
        return Err(PyValueError::new_err("methods: give at least one (service, method, is_read)"));
    }
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let mut table = HashMap::new();
    for (service, method, read) in methods {
        if service.is_empty() || method.is_empty() || service.contains('/') || method.contains('/') {
            return Err(PyValueError::new_err(format!("methods: {service:?}/{method:?} is not a service and a method name")));
        }
        let path = format!("{service}/{method}");
        table.insert(path, Route { service: leak(service), method: leak(method), read });
    }
    Ok(table)
}

/// The refusal reasons, as `mxref.security.RefusalReason` names them.
const MISSING_TOKEN: &str = "missing_token";
const WRONG_TOKEN: &str = "wrong_token";

/// Distinct (peer, method, reason) refusal counts kept between two `Server.refusals`; beyond,
/// a refusal counts under the peer `other`.
const MAX_REFUSAL_KEYS: usize = 4096;

/// One call waiting for Python: what it asked, and where its answer goes.
struct Pending {
    service: &'static str,
    method: &'static str,
    body: Bytes,
    peer: String,
    authorization: Vec<Bytes>,
    reply: tokio::sync::oneshot::Sender<Answer>,
    _queued: Queued,
    read: Option<ReadOpen>,
}

/// The reads not yet answered (queued or taken), and how many have been answered: a writer
/// worker yields the GIL to them (`Server.yield_to_reads`).
#[derive(Default)]
struct ReadGauge {
    counts: Mutex<(usize, u64)>,
    changed: Condvar,
}

/// One read counted open in its `ReadGauge` until it is answered or dropped.
struct ReadOpen {
    gauge: Arc<ReadGauge>,
}

impl ReadOpen {
    fn new(gauge: &Arc<ReadGauge>) -> Self {
        gauge.counts.lock().unwrap().0 += 1;
        ReadOpen { gauge: gauge.clone() }
    }
}

impl Drop for ReadOpen {
    fn drop(&mut self) {
        let mut counts = self.gauge.counts.lock().unwrap();
        counts.0 -= 1;
        counts.1 += 1;
        drop(counts);
        self.gauge.changed.notify_all();
    }
}

/// A queued call's bytes, counted against `Shared::max_queued_bytes` until it is taken or dropped.
struct Queued {
    bytes: Arc<AtomicUsize>,
    n: usize,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.bytes.fetch_sub(self.n, Ordering::Relaxed);
    }
}

/// Who may call: the `authorization` values accepted, and the details of each refusal.
struct Tokens {
    accepted: Vec<Vec<u8>>,
    missing_details: String,
    wrong_details: String,
}

impl Tokens {
    /// Why `values` are refused (a reason name), or None: exactly one value, one of the accepted.
    fn refusal(&self, values: &[&[u8]]) -> Option<&'static str> {
        match values {
            [] => Some(MISSING_TOKEN),
            [value] => {
                // compared with every accepted value, each in time independent of where it differs
                let matched = self.accepted.iter().fold(false, |any, a| any | same_bytes(a, value));
                if matched {
                    None
                } else {
                    Some(WRONG_TOKEN)
                }
            }
            _ => Some(WRONG_TOKEN),
        }
    }
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

type RefusalKey = (String, &'static str, &'static str, &'static str);

/// Refusals counted per (peer address, service, method, reason) until Python takes them.
#[derive(Default)]
struct Refusals {
    counts: Mutex<HashMap<RefusalKey, u64>>,
    wake: Option<crossbeam_channel::Sender<()>>,
}

impl Refusals {
    fn add(&self, peer: String, service: &'static str, method: &'static str, reason: &'static str) {
        let mut counts = self.counts.lock().unwrap();
        let full = counts.len() >= MAX_REFUSAL_KEYS;
        let key = (peer, service, method, reason);
        let key = if full && !counts.contains_key(&key) { ("other".to_string(), service, method, reason) } else { key };
        *counts.entry(key).or_insert(0) += 1;
        drop(counts);
        if let Some(wake) = &self.wake {
            let _ = wake.try_send(());
        }
    }
}

/// What a call's body and its answer may take (`front_door`'s keys, from Python).
struct CallLimits {
    /// A body arrives within this, plus its size at `min_body_rate` bytes a second.
    body_timeout: Duration,
    min_body_rate: f64,
    /// Answer bytes not yet handed to HTTP/2 (a peer that reads none), per connection and in all.
    max_unsent_per_connection: usize,
    max_unsent: usize,
}

struct Shared {
    reads: crossbeam_channel::Sender<Pending>,
    writes: crossbeam_channel::Sender<Pending>,
    /// Request bytes received (counted as each frame arrives, before it is kept) and queued.
    queued_bytes: Arc<AtomicUsize>,
    reads_open: Arc<ReadGauge>,
    max_queued_bytes: usize,
    queue_full: AtomicU64,
    body_timeouts: AtomicU64,
    unsent_full: AtomicU64,
    unsent_bytes: Arc<AtomicUsize>,
    call_limits: CallLimits,
    max_message_bytes: usize,
    tokens: Option<Tokens>,
    refusals: Refusals,
    routes: HashMap<String, Route>,
    authorization_key: http::HeaderName,
}

/// The caller as grpcio's `context.peer()` names it (`ipv4:127.0.0.1:51234`), the write-rate key.
fn peer_name(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("ipv4:{a}"),
        SocketAddr::V6(a) => format!("ipv6:[{}]:{}", a.ip(), a.port()),
    }
}

/// The caller's address without its port (`ipv4:127.0.0.1`): whom refusals are counted against.
fn peer_address(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("ipv4:{}", a.ip()),
        SocketAddr::V6(a) => format!("ipv6:[{}]", a.ip()),
    }
}

struct Call {
    shared: Arc<Shared>,
    route: Route,
    peer: String,
    authorization: Vec<Bytes>,
    /// The body's bytes, counted since they arrived (`receive`); queued with the call.
    queued: Option<Queued>,
    activity: Arc<front::Activity>,
    /// Where the answer's `Unsent` goes, for the response body to hold (`Router::call`).
    unsent: Arc<Mutex<Option<Unsent>>>,
}

/// An answer's bytes not yet handed to HTTP/2, counted per connection and in all until then.
struct Unsent {
    total: Arc<AtomicUsize>,
    activity: Arc<front::Activity>,
    n: usize,
}

impl Unsent {
    fn reserve(shared: &Shared, activity: &Arc<front::Activity>, n: usize) -> Result<Unsent, String> {
        let limits = &shared.call_limits;
        let before = activity.unsent.fetch_add(n, Ordering::Relaxed);
        if before + n > limits.max_unsent_per_connection {
            activity.unsent.fetch_sub(n, Ordering::Relaxed);
            return Err(format!(
                "this connection has {before} bytes of answers it has not read, and {n} more would pass the {} bytes \
                 one connection may hold",
                limits.max_unsent_per_connection
            ));
        }
        let all = shared.unsent_bytes.fetch_add(n, Ordering::Relaxed);
        if all + n > limits.max_unsent {
            shared.unsent_bytes.fetch_sub(n, Ordering::Relaxed);
            activity.unsent.fetch_sub(n, Ordering::Relaxed);
            return Err(format!("the server holds {all} bytes of answers not yet read, its most is {}", limits.max_unsent));
        }
        if before == 0 {
            activity.sent(); // the stall clock starts now
        }
        Ok(Unsent { total: shared.unsent_bytes.clone(), activity: activity.clone(), n })
    }

    fn handed_on(&mut self, k: usize) {
        let k = k.min(self.n);
        self.n -= k;
        self.total.fetch_sub(k, Ordering::Relaxed);
        self.activity.unsent.fetch_sub(k, Ordering::Relaxed);
        self.activity.sent();
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.total.fetch_sub(self.n, Ordering::Relaxed);
        self.activity.unsent.fetch_sub(self.n, Ordering::Relaxed);
    }
}

/// The most of an answer handed to HTTP/2 at once: it asks for the next piece only when the
/// peer's window has room, so an unread answer stays here, counted (`Unsent`).
const SEND_PIECE: usize = 16 << 10;

/// A response body whose data leaves in `SEND_PIECE`s, each copied (so HTTP/2's buffer does not
/// hold the whole answer), counted in its `Unsent` until handed on.
struct Sending {
    inner: tonic::body::BoxBody,
    rest: Bytes,
    unsent: Unsent,
}

impl hyper::body::Body for Sending {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Status>>> {
        use bytes::Buf;
        use std::task::Poll;
        let this = self.get_mut();
        if this.rest.is_empty() {
            match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return other,
            }
        }
        let k = this.rest.len().min(SEND_PIECE);
        let piece = Bytes::copy_from_slice(&this.rest[..k]);
        this.rest.advance(k);
        this.unsent.handed_on(k);
        Poll::Ready(Some(Ok(hyper::body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }
}

/// A request body already received, whole: what tonic reads after `receive`.
struct Whole(Option<Bytes>);

impl hyper::body::Body for Whole {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::task::Poll::Ready(self.get_mut().0.take().map(|b| Ok(hyper::body::Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}

/// The gRPC length prefix: a flag byte, then the message's length (big-endian).
const GRPC_PREFIX: usize = 5;

/// Read a call's body as it arrives: each frame counted against the received-and-queued budget
/// before it is kept (over it: RESOURCE_EXHAUSTED), the message's declared length checked as soon
/// as its prefix is in (over the receive limit: RESOURCE_EXHAUSTED, as grpcio answers), and the
/// whole due within `body_timeout` plus its size at `min_body_rate` (else DEADLINE_EXCEEDED).
async fn receive(shared: &Shared, method: &str, body: hyper::body::Incoming) -> Result<(Bytes, Queued), Status> {
    use hyper::body::Body;
    let limits = &shared.call_limits;
    let mut body = Box::pin(body);
    let mut queued = Queued { bytes: shared.queued_bytes.clone(), n: 0 };
    let mut kept = bytes::BytesMut::new();
    let started = tokio::time::Instant::now();
    let mut declared: Option<usize> = None;
    loop {
        let due = started + limits.body_timeout + Duration::from_secs_f64(kept.len() as f64 / limits.min_body_rate);
        let frame = match tokio::time::timeout_at(due, std::future::poll_fn(|cx| body.as_mut().poll_frame(cx))).await {
            Err(_) => {
                shared.body_timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(Status::deadline_exceeded(format!(
                    "{method}: the request's body did not arrive in time ({} bytes in {:.1} s; a body is due within {} s \
                     plus its size at {} bytes a second)",
                    kept.len(),
                    started.elapsed().as_secs_f64(),
                    limits.body_timeout.as_secs_f64(),
                    limits.min_body_rate
                )));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(Status::cancelled(format!("{method}: the request's body: {e}"))),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: a unary request has none worth keeping
        };
        let n = data.len();
        if shared.queued_bytes.fetch_add(n, Ordering::Relaxed) + n > shared.max_queued_bytes {
            shared.queued_bytes.fetch_sub(n, Ordering::Relaxed);
            shared.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "{method}: the server is busy ({} bytes of calls received or queued); try again later",
                shared.max_queued_bytes
            )));
        }
        queued.n += n;
        kept.extend_from_slice(&data);
        if declared.is_none() && kept.len() >= GRPC_PREFIX {
            let length = u32::from_be_bytes([kept[1], kept[2], kept[3], kept[4]]) as usize;
            if length > shared.max_message_bytes {
                return Err(Status::resource_exhausted(format!(
                    "Received message larger than max ({length} vs. {})",
                    shared.max_message_bytes
                )));
            }
            declared = Some(length);
        }
        if declared.is_some_and(|length| kept.len() > GRPC_PREFIX + length) {
            return Err(Status::invalid_argument(format!("{method}: a unary call carries one message")));
        }
    }
    Ok((kept.freeze(), queued))
}

/// (gRPC code, details, trailing metadata, response, delay): code 0 answers with the response;
/// the answer leaves after the delay (seconds), which holds the caller's stream, not a thread.
type Answer = (i32, String, Vec<(String, String)>, Bytes, f64);

impl tonic::server::UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let body = request.into_inner();
        let (shared, Route { service, method, read }) = (self.shared.clone(), self.route);
        let (peer, authorization) = (std::mem::take(&mut self.peer), std::mem::take(&mut self.authorization));
        let queued = self.queued.take().unwrap_or(Queued { bytes: shared.queued_bytes.clone(), n: 0 });
        let (activity, unsent) = (self.activity.clone(), self.unsent.clone());
        Box::pin(async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let queue = if read { &shared.reads } else { &shared.writes };
            let read = read.then(|| ReadOpen::new(&shared.reads_open));
            match queue.try_send(Pending { service, method, body, peer, authorization, reply, _queued: queued, read }) {
                Ok(()) => {}
                Err(crossbeam_channel::TrySendError::Full(_)) => {
                    shared.queue_full.fetch_add(1, Ordering::Relaxed);
                    return Err(Status::resource_exhausted(format!(
                        "{method}: the server is busy ({} calls queued); try again later",
                        queue.capacity().unwrap_or(0)
                    )));
                }
                Err(crossbeam_channel::TrySendError::Disconnected(_)) => {
                    return Err(Status::unavailable(format!("{method}: the server is stopping")));
                }
            }
            let (code, details, trailing, response, delay_s) =
                answer.await.map_err(|_| Status::unavailable(format!("{method}: the server stopped before answering")))?;
            if delay_s > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(delay_s.min(60.0))).await;
            }
            if code == 0 {
                match Unsent::reserve(&shared, &activity, response.len()) {
                    Ok(reserved) => *unsent.lock().unwrap() = Some(reserved),
                    Err(why) => {
                        shared.unsent_full.fetch_add(1, Ordering::Relaxed);
                        return Err(Status::resource_exhausted(format!("{method}: {why}; read the answers you asked for")));
                    }
                }
                return Ok(tonic::Response::new(response));
            }
            let mut metadata = MetadataMap::new();
            for (key, value) in trailing {
                if let (Ok(k), Ok(v)) = (
                    key.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
                    MetadataValue::try_from(value.as_str()),
                ) {
                    metadata.insert(k, v);
                }
            }
            Err(Status::with_metadata(Code::from_i32(code), details, metadata))
        })
    }
}

/// A call taken by Python (`Server.take`): answer it once with `answer`.
#[pyclass(module = "mxref_native")]
pub(crate) struct Incoming {
    #[pyo3(get)]
    service: &'static str,
    #[pyo3(get)]
    method: &'static str,
    #[pyo3(get)]
    peer: String,
    body: Bytes,
    authorization: Vec<Bytes>,
    reply: Mutex<Option<tokio::sync::oneshot::Sender<Answer>>>,
    read: Mutex<Option<ReadOpen>>,
}

#[pymethods]
impl Incoming {
    #[getter]
    fn request<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.body)
    }

    /// The call's `authorization` metadata values, as sent (none: an empty list).
    #[getter]
    fn authorization<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.authorization.iter().map(|v| PyBytes::new(py, v)).collect()
    }

    /// Send the answer (code 0: `response`; else the error with `details` and `trailing`), after
    /// `delay_s`; False if it was answered before or its caller is gone.
    #[pyo3(signature = (code, details, trailing, response, delay_s=0.0))]
    fn answer(&self, code: i32, details: String, trailing: Vec<(String, String)>, response: &[u8], delay_s: f64) -> bool {
        let sent = match self.reply.lock().unwrap().take() {
            Some(reply) => reply.send((code, details, trailing, Bytes::copy_from_slice(response), delay_s)).is_ok(),
            None => false,
        };
        drop(self.read.lock().unwrap().take()); // a read answered: no longer open
        sent
    }
}

/// One connection's calls: routed by path, refused before their body is read when they carry no
/// accepted token, else framed (tonic) and queued for Python.
#[derive(Clone)]
pub struct Router {
    shared: Arc<Shared>,
    peer: SocketAddr,
    activity: Arc<front::Activity>,
}

fn answer_now(status: Status) -> BoxFuture<http::Response<tonic::body::BoxBody>, Infallible> {
    Box::pin(async move { Ok(status.into_http()) })
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Router {
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let Some(route) = self.shared.routes.get(req.uri().path().trim_start_matches('/')).copied() else {
            let path = req.uri().path().to_string();
            return answer_now(Status::unimplemented(format!("{path}: no such method")));
        };
        let Route { service, method, .. } = route;
        let values: Vec<&[u8]> =
            req.headers().get_all(&self.shared.authorization_key).iter().map(|v| v.as_bytes()).collect();
        if let Some(tokens) = &self.shared.tokens {
            if let Some(reason) = tokens.refusal(&values) {
                self.shared.refusals.add(peer_address(self.peer), service, method, reason);
                let details = if reason == MISSING_TOKEN { &tokens.missing_details } else { &tokens.wrong_details };
                return answer_now(Status::unauthenticated(details.clone()));
            }
        }
        let authorization = values.iter().map(|v| Bytes::copy_from_slice(v)).collect();
        let busy = self.activity.begin();
        let (shared, activity, peer) = (self.shared.clone(), self.activity.clone(), peer_name(self.peer));
        Box::pin(async move {
            let _busy = busy;
            let (parts, body) = req.into_parts();
            let (body, queued) = match receive(&shared, method, body).await {
                Ok(received) => received,
                Err(status) => return Ok(status.into_http()),
            };
            let unsent = Arc::new(Mutex::new(None));
            let limit = shared.max_message_bytes;
            let call = Call { shared, route, peer, authorization, queued: Some(queued), activity, unsent: unsent.clone() };
            let mut grpc = tonic::server::Grpc::new(RawCodec).max_decoding_message_size(limit);
            let mut response = grpc.unary(call, http::Request::from_parts(parts, Whole(Some(body)))).await;
            as_grpcio_size_refusal(response.headers_mut());
            let reserved = unsent.lock().unwrap().take();
            Ok(match reserved {
                Some(unsent) => response.map(|inner| tonic::body::boxed(Sending { inner, rest: Bytes::new(), unsent })),
                None => response,
            })
        })
    }
}

/// tonic refuses a request over the receive limit with OUT_OF_RANGE ("decoded message length too
/// large: found N bytes, the limit is: M bytes"); gRPC's rule, and grpcio's answer, is
/// RESOURCE_EXHAUSTED "Received message larger than max (N vs. M)": answer as grpcio does.
fn as_grpcio_size_refusal(headers: &mut http::HeaderMap) {
    let out_of_range = headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"11");
    let Some(message) = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(|m| percent_encoding::percent_decode_str(m).decode_utf8_lossy().into_owned())
    else {
        return;
    };
    if !out_of_range || !message.contains("message length too large") {
        return;
    }
    let numbers: Vec<&str> = message.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).collect();
    let text = match numbers.as_slice() {
        [found, limit] => format!("Received message larger than max ({found} vs. {limit})"),
        _ => format!("Received message larger than max ({message})"),
    };
    headers.insert("grpc-status", http::HeaderValue::from(Code::ResourceExhausted as i32));
    if let Ok(value) = http::HeaderValue::from_str(&text) {
        headers.insert("grpc-message", value);
    }
}

/// A running native server: its port, its queues, and `stop`.
#[pyclass(module = "mxref_native")]
pub(crate) struct Server {
    port: u16,
    shared: Arc<Shared>,
    reads: crossbeam_channel::Receiver<Pending>,
    writes: crossbeam_channel::Receiver<Pending>,
    wake: crossbeam_channel::Receiver<()>,
    /// Disconnected once the server has stopped (its sender dropped): wakes the workers
    /// waiting in `take` and `refusals` at once, instead of at the end of their wait.
    closed: crossbeam_channel::Receiver<()>,
    close: Mutex<Option<crossbeam_channel::Sender<()>>>,
    stats: Arc<front::Stats>,
    stop_tx: watch_sender::Sender,
    ended: Arc<Mutex<Option<String>>>,
    done: Mutex<Option<crossbeam_channel::Receiver<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

mod watch_sender {
    /// The stop signal: its value is the grace (seconds) the calls in flight have.
    pub type Sender = tokio::sync::watch::Sender<Option<f64>>;
}

/// The front door's limits as Python gives them (`mxref.metadata.native.FRONT_DOOR`): every key
/// named, each a positive number; Rust keeps no default of its own. Problems are collected and
/// `finish` names them all.
struct FrontDoor {
    given: HashMap<String, f64>,
    problems: Vec<String>,
}

impl FrontDoor {
    fn new(given: HashMap<String, f64>) -> Self {
        FrontDoor { given, problems: Vec::new() }
    }

    fn positive(&mut self, key: &str) -> f64 {
        match self.given.remove(key) {
            Some(value) if value.is_finite() && value > 0.0 => value,
            Some(value) => {
                self.problems.push(format!("{key} must be a positive number, not {value}"));
                1.0
            }
            None => {
                self.problems.push(format!("{key} is missing"));
                1.0
            }
        }
    }

    fn seconds(&mut self, key: &str) -> Duration {
        Duration::from_secs_f64(self.positive(key))
    }

    fn count(&mut self, key: &str) -> usize {
        let value = self.positive(key);
        if value.fract() != 0.0 || value > usize::MAX as f64 {
            self.problems.push(format!("{key} must be a whole number, not {value}"));
        }
        value as usize
    }

    fn finish(self) -> PyResult<()> {
        let mut problems = self.problems;
        let mut unknown: Vec<&String> = self.given.keys().collect();
        unknown.sort();
        problems.extend(unknown.into_iter().map(|key| format!("{key} is not a front-door limit")));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!("front_door: {}", problems.join("; "))))
        }
    }
}

#[pymethods]
impl Server {
    /// Bind `host:port` (0: any free port) and serve `methods`, each `(service, method, is_read)`
    /// as Python's table lists them (any other path: UNIMPLEMENTED); `OSError` naming the address when it
    /// cannot be bound. With `tls_cert_pem` and `tls_key_pem` (PEM: the certificate chain and
    /// its key) it serves TLS only (rustls); `ValueError` when they cannot be used. With
    /// `accepted_authorization` (the values of the `authorization_key` metadata that pass, e.g. `b"Bearer <token>"`)
    /// a call carrying none of them, or more than one value, is refused UNAUTHENTICATED with
    /// `refusal_details[reason]` (reasons `missing_token`, `wrong_token`) before its body is
    /// read, and counted for `refusals`. Calls wait in two queues (reads, writes) of
    /// `max_queued_calls` each and `max_queued_bytes` together; beyond, RESOURCE_EXHAUSTED.
    /// `front_door`: every connection and call limit (`front::Limits`, `CallLimits`), by the names
    /// `mxref.metadata.native.FRONT_DOOR` gives them; `ValueError` naming a missing, unknown or
    /// bad one.
    #[new]
    #[pyo3(signature = (host, port, *, methods, authorization_key, max_concurrent_streams, max_message_bytes, tls_cert_pem=None, tls_key_pem=None,
                        accepted_authorization=None, refusal_details=None, max_queued_calls=4096,
                        max_queued_bytes=256 << 20, front_door))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        methods: Vec<(String, String, bool)>,
        authorization_key: String,
        max_concurrent_streams: u32,
        max_message_bytes: usize,
        tls_cert_pem: Option<Vec<u8>>,
        tls_key_pem: Option<Vec<u8>>,
        accepted_authorization: Option<Vec<Vec<u8>>>,
        refusal_details: Option<HashMap<String, String>>,
        max_queued_calls: usize,
        max_queued_bytes: usize,
        front_door: HashMap<String, f64>,
    ) -> PyResult<Self> {
        let routes = routes(methods)?;
        let authorization_key = http::HeaderName::from_bytes(authorization_key.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("authorization_key {authorization_key:?}: {e}")))?;
        let tls = match (tls_cert_pem, tls_key_pem) {
            (Some(cert), Some(key)) => Some(
                front::tls_acceptor(&cert, &key).map_err(|e| PyValueError::new_err(format!("TLS certificate and key: {e}")))?,
            ),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("TLS needs both a certificate and its key")),
        };
        let tokens = match accepted_authorization {
            None => None,
            Some(accepted) if accepted.is_empty() => {
                return Err(PyValueError::new_err("accepted_authorization: give at least one value, or None (no check)"))
            }
            Some(accepted) => {
                let details = refusal_details.unwrap_or_default();
                let text = |reason: &str| {
                    details.get(reason).cloned().unwrap_or_else(|| format!("{reason}: this service needs a valid bearer token"))
                };
                Some(Tokens { accepted, missing_details: text(MISSING_TOKEN), wrong_details: text(WRONG_TOKEN) })
            }
        };
        if max_queued_calls == 0 || max_queued_bytes == 0 {
            return Err(PyValueError::new_err("max_queued_calls and max_queued_bytes must be > 0"));
        }
        let mut door = FrontDoor::new(front_door);
        let limits = front::Limits {
            max_connections: door.count("max_connections"),
            max_connections_per_peer: door.count("max_connections_per_peer"),
            max_connections_per_block: door.count("max_connections_per_block"),
            handshake_timeout: door.seconds("handshake_timeout_s"),
            first_request_timeout: door.seconds("first_request_timeout_s"),
            keepalive_interval: door.seconds("keepalive_interval_s"),
            keepalive_timeout: door.seconds("keepalive_timeout_s"),
            idle_timeout: door.seconds("idle_timeout_s"),
            max_age: door.seconds("max_connection_age_s"),
            send_stall_timeout: door.seconds("send_stall_timeout_s"),
            max_concurrent_streams,
            window_bytes: WINDOW_BYTES,
        };
        let call_limits = CallLimits {
            body_timeout: door.seconds("body_timeout_s"),
            min_body_rate: door.positive("min_body_bytes_per_s"),
            max_unsent_per_connection: door.count("max_unsent_bytes_per_connection"),
            max_unsent: door.count("max_unsent_bytes"),
        };
        door.finish()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mxref-native-grpc")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("native gRPC runtime: {e}")))?;
        let address = format!("{host}:{port}");
        let listener = py
            .allow_threads(|| runtime.block_on(tokio::net::TcpListener::bind(address.as_str())))
            .map_err(|e| PyOSError::new_err(format!("cannot bind {address}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| PyOSError::new_err(format!("{address}: {e}")))?.port();
        let (reads_tx, reads_rx) = crossbeam_channel::bounded::<Pending>(max_queued_calls);
        let (writes_tx, writes_rx) = crossbeam_channel::bounded::<Pending>(max_queued_calls);
        let (wake_tx, wake_rx) = crossbeam_channel::bounded::<()>(1);
        let (close_tx, close_rx) = crossbeam_channel::bounded::<()>(0);
        let shared = Arc::new(Shared {
            reads: reads_tx,
            writes: writes_tx,
            queued_bytes: Arc::new(AtomicUsize::new(0)),
            reads_open: Arc::new(ReadGauge::default()),
            max_queued_bytes,
            queue_full: AtomicU64::new(0),
            body_timeouts: AtomicU64::new(0),
            unsent_full: AtomicU64::new(0),
            unsent_bytes: Arc::new(AtomicUsize::new(0)),
            call_limits,
            max_message_bytes,
            tokens,
            refusals: Refusals { counts: Mutex::new(HashMap::new()), wake: Some(wake_tx) },
            routes,
            authorization_key,
        });
        let stats = Arc::new(front::Stats::default());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel::<Option<f64>>(None);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        let ended = Arc::new(Mutex::new(None));
        let make_shared = shared.clone();
        let make: Arc<front::MakeService> =
            Arc::new(move |peer, activity| Router { shared: make_shared.clone(), peer, activity });
        let (thread_stats, thread_ended, asked) = (stats.clone(), ended.clone(), stop_rx.clone());
        let thread = std::thread::Builder::new()
            .name("mxref-native-server".to_string())
            .spawn(move || {
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    runtime.block_on(front::serve(listener, tls, limits, thread_stats, make, stop_rx));
                }));
                let why = match (served, asked.borrow().is_some()) {
                    (Ok(()), true) => "stopped".to_string(),
                    (Ok(()), false) => "the accept loop ended without being asked to".to_string(),
                    (Err(panic), _) => {
                        let text = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        format!("the server thread panicked: {text}")
                    }
                };
                if why != "stopped" {
                    eprintln!("mxref native gRPC server: serving ended: {why}");
                }
                *thread_ended.lock().unwrap() = Some(why);
                runtime.shutdown_timeout(Duration::from_secs(1));
                let _ = done_tx.send(());
            })
            .map_err(|e| PyRuntimeError::new_err(format!("native gRPC server thread: {e}")))?;
        Ok(Server {
            port: bound,
            shared,
            reads: reads_rx,
            writes: writes_rx,
            wake: wake_rx,
            closed: close_rx,
            close: Mutex::new(Some(close_tx)),
            stats,
            stop_tx,
            ended,
            done: Mutex::new(Some(done_rx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// How many calls wait to be taken: (reads, writes).
    fn queued(&self) -> (usize, usize) {
        (self.reads.len(), self.writes.len())
    }

    /// The calls waiting, up to `most`, a read and a write in turn (reads first) while both
    /// queues hold some, so neither kind waits behind a flood of the other: waits up to
    /// `timeout_s` for the first (without the GIL), then takes what is there. With `lane`
    /// (`reads` or `writes`) only that queue's calls. None once the server has stopped and its
    /// queues are empty; a stop wakes a waiting `take` at once.
    #[pyo3(signature = (most, timeout_s, lane=None))]
    fn take(&self, py: Python<'_>, most: usize, timeout_s: f64, lane: Option<&str>) -> PyResult<Option<Vec<Incoming>>> {
        let (reads, writes) = match lane {
            None => (Some(self.reads.clone()), Some(self.writes.clone())),
            Some("reads") => (Some(self.reads.clone()), None),
            Some("writes") => (None, Some(self.writes.clone())),
            Some(other) => return Err(PyValueError::new_err(format!("lane {other:?}: must be reads, writes or None"))),
        };
        let never = crossbeam_channel::never::<Pending>();
        let closed = self.closed.clone();
        let wait = Duration::from_secs_f64(timeout_s.max(0.0));
        let most = most.max(1);
        let taken = py.allow_threads(move || -> Option<Vec<Pending>> {
            let (reads, writes) = (reads.unwrap_or_else(|| never.clone()), writes.unwrap_or(never));
            let drain = |out: &mut Vec<Pending>| {
                while out.len() < most {
                    let mut took = false;
                    for queue in [&reads, &writes] {
                        if out.len() < most {
                            if let Ok(p) = queue.try_recv() {
                                out.push(p);
                                took = true;
                            }
                        }
                    }
                    if !took {
                        break;
                    }
                }
            };
            let mut out = Vec::new();
            drain(&mut out);
            if out.is_empty() {
                crossbeam_channel::select! {
                    recv(reads) -> p => out.push(p.ok()?),
                    recv(writes) -> p => out.push(p.ok()?),
                    // stopped: what is still queued is taken, then nothing is left
                    recv(closed) -> _ => {
                        drain(&mut out);
                        return if out.is_empty() { None } else { Some(out) };
                    }
                    default(wait) => return Some(out),
                }
                drain(&mut out);
            }
            Some(out)
        });
        let Some(taken) = taken else {
            return Ok(None);
        };
        Ok(Some(
            taken
                .into_iter()
                .map(|p| Incoming {
                    service: p.service,
                    method: p.method,
                    peer: p.peer,
                    body: p.body,
                    authorization: p.authorization,
                    reply: Mutex::new(Some(p.reply)),
                    read: Mutex::new(p.read),
                })
                .collect(),
        ))
    }

    /// How many reads are queued or taken and not yet answered.
    fn reads_open(&self) -> usize {
        self.shared.reads_open.counts.lock().unwrap().0
    }

    /// A writer's turn given to the reads: when reads are open, let go of the GIL until none
    /// is, or `most` more have been answered, or `timeout_s` has passed (so the writes keep
    /// their turn under a flood of reads); True if it waited. With no read open it returns at
    /// once, the GIL kept.
    fn yield_to_reads(&self, py: Python<'_>, most: u64, timeout_s: f64) -> bool {
        let gauge = &self.shared.reads_open;
        let start = {
            let counts = gauge.counts.lock().unwrap();
            if counts.0 == 0 {
                return false;
            }
            counts.1
        };
        let wait = Duration::from_secs_f64(timeout_s.max(0.0));
        py.allow_threads(|| {
            let counts = gauge.counts.lock().unwrap();
            let _ = gauge
                .changed
                .wait_timeout_while(counts, wait, |c| c.0 > 0 && c.1 - start < most.max(1))
                .unwrap();
        });
        true
    }

    /// The calls refused for their token since the last time, as (service, method, reason,
    /// peer address, count); waits up to `timeout_s` (without the GIL) when there are none, and
    /// not at all once the server has stopped.
    fn refusals(&self, py: Python<'_>, timeout_s: f64) -> Vec<(&'static str, &'static str, &'static str, String, u64)> {
        let take = || -> Vec<(&'static str, &'static str, &'static str, String, u64)> {
            let counts = std::mem::take(&mut *self.shared.refusals.counts.lock().unwrap());
            counts.into_iter().map(|((peer, service, method, reason), n)| (service, method, reason, peer, n)).collect()
        };
        let now = take();
        if !now.is_empty() {
            return now;
        }
        let (wake, closed) = (self.wake.clone(), self.closed.clone());
        let wait = Duration::from_secs_f64(timeout_s.max(0.0));
        py.allow_threads(move || {
            crossbeam_channel::select! {
                recv(wake) -> _ => {}
                recv(closed) -> _ => {}
                default(wait) => {}
            }
        });
        take()
    }

    /// What the front door saw: connections accepted, open, refused over a cap, failed
    /// handshakes, closed idle or for their age, accept errors; calls refused for a full queue.
    fn stats(&self) -> HashMap<&'static str, u64> {
        let s = &self.stats;
        HashMap::from([
            ("accepted", s.accepted.load(Ordering::Relaxed)),
            ("open", s.open.load(Ordering::Relaxed) as u64),
            ("over_cap", s.over_cap.load(Ordering::Relaxed)),
            ("handshake_failures", s.handshake_failures.load(Ordering::Relaxed)),
            ("closed_idle", s.closed_idle.load(Ordering::Relaxed)),
            ("closed_age", s.closed_age.load(Ordering::Relaxed)),
            ("closed_silent", s.closed_silent.load(Ordering::Relaxed)),
            ("closed_stalled", s.closed_stalled.load(Ordering::Relaxed)),
            ("evicted", s.evicted.load(Ordering::Relaxed)),
            ("body_timeouts", self.shared.body_timeouts.load(Ordering::Relaxed)),
            ("unsent_full", self.shared.unsent_full.load(Ordering::Relaxed)),
            ("unsent_bytes", self.shared.unsent_bytes.load(Ordering::Relaxed) as u64),
            ("received_bytes", self.shared.queued_bytes.load(Ordering::Relaxed) as u64),
            ("accept_errors", s.accept_errors.load(Ordering::Relaxed)),
            ("queue_full", self.shared.queue_full.load(Ordering::Relaxed)),
        ])
    }

    /// None while serving; else why serving ended (`stopped` after `stop`). Waits up to
    /// `timeout_s` (without the GIL) for it to end.
    fn ended(&self, py: Python<'_>, timeout_s: f64) -> Option<String> {
        let ended = self.ended.clone();
        let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
        py.allow_threads(move || loop {
            if let Some(why) = ended.lock().unwrap().clone() {
                return Some(why);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
        })
    }

    /// Stop accepting; the calls in flight have `grace_s` to be answered, then the calls still
    /// queued are dropped (their callers get UNAVAILABLE), so nothing waits on an answer that
    /// will not come. True once the server has stopped (within `grace_s` + 2 s).
    fn stop(&self, py: Python<'_>, grace_s: f64) -> bool {
        let grace_s = grace_s.max(0.0);
        self.stop_tx.send_if_modified(|value| {
            if value.is_none() {
                *value = Some(grace_s);
                true
            } else {
                false
            }
        });
        let mut done = self.done.lock().unwrap();
        let Some(finished) = done.as_ref() else {
            return true; // stopped before
        };
        let (reads, writes) = (&self.reads, &self.writes);
        let grace = Duration::from_secs_f64(grace_s);
        let stopped = py.allow_threads(|| {
            if finished.recv_timeout(grace).is_ok() {
                return true;
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                while reads.try_recv().is_ok() || writes.try_recv().is_ok() {}
                if finished.recv_timeout(Duration::from_millis(50)).is_ok() {
                    return true;
                }
            }
            false
        });
        if stopped {
            *done = None;
            self.close.lock().unwrap().take(); // no call can come now: wake the idle workers
            if let Some(thread) = self.thread.lock().unwrap().take() {
                let _ = py.allow_threads(|| thread.join());
            }
        }
        stopped
    }
}
