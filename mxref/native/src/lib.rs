//! mxref's native gRPC transport for the metadata server: HTTP/2 and gRPC framing in Rust
//! (tonic on tokio), every call's decision in Python.
//!
//! `Server` accepts calls of `mxref.v1.P2pService` and `model_express.p2p.P2pService` and queues
//! each one, as raw bytes with its caller's address; Python threads take the queued calls in
//! batches (`Server.take`, which waits without the GIL) and answer each (`Incoming.answer`), so
//! the servicer's checks, store, counts and events stay the ones the grpcio server runs, and a
//! busy server hands calls to Python without a thread switch per call. `unary_load` and
//! `unary_latencies` are clients of the same framing, for the fleet benchmark: they send from
//! this process without the GIL.

use std::collections::HashMap;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{empty_body, http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// Messages as bytes, unparsed: the Python side parses and checks them.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

/// A service name the server answers (one type each: tonic routes by a constant name).
trait Package: Send + Sync + 'static {
    const NAME: &'static str;
}

struct Mxref;
impl Package for Mxref {
    const NAME: &'static str = "mxref.v1.P2pService";
}

struct ModelExpress;
impl Package for ModelExpress {
    const NAME: &'static str = "model_express.p2p.P2pService";
}

/// HTTP/2 flow-control windows: a 5000-worker listing (~330 KB) in one window, not six round trips.
const WINDOW_BYTES: u32 = 8 << 20;

/// The metadata key of the bearer token (gRPC's access-token call credentials send it).
const AUTHORIZATION: &str = "authorization";

const METHODS: [&str; 4] = ["PublishMetadata", "ListSources", "GetMetadata", "UpdateStatus"];

/// One call waiting for Python: what it asked, and where its answer goes.
struct Pending {
    service: &'static str,
    method: &'static str,
    body: Bytes,
    peer: String,
    authorization: Vec<Bytes>,
    reply: tokio::sync::oneshot::Sender<Answer>,
}

struct Shared {
    reads: crossbeam_channel::Sender<Pending>,
    writes: crossbeam_channel::Sender<Pending>,
    max_message_bytes: usize,
}

/// Reads (a listing, a lookup) are taken before writes: a reader's ListSources does not queue
/// behind a fleet's heartbeats.
const READS: [&str; 2] = ["ListSources", "GetMetadata"];

struct P2p<P: Package> {
    shared: Arc<Shared>,
    package: PhantomData<P>,
}

impl<P: Package> Clone for P2p<P> {
    fn clone(&self) -> Self {
        P2p { shared: self.shared.clone(), package: PhantomData }
    }
}

impl<P: Package> tonic::server::NamedService for P2p<P> {
    const NAME: &'static str = P::NAME;
}

/// The caller as grpcio's `context.peer()` names it (`ipv4:127.0.0.1:51234`), the write-rate key.
fn peer_name(addr: Option<SocketAddr>) -> String {
    match addr {
        Some(SocketAddr::V4(a)) => format!("ipv4:{a}"),
        Some(SocketAddr::V6(a)) => format!("ipv6:[{}]:{}", a.ip(), a.port()),
        None => "unknown".to_string(),
    }
}

struct Call {
    shared: Arc<Shared>,
    service: &'static str,
    method: &'static str,
}

/// (gRPC code, details, trailing metadata, response, delay): code 0 answers with the response;
/// the answer leaves after the delay (seconds), which holds the caller's stream, not a thread.
type Answer = (i32, String, Vec<(String, String)>, Bytes, f64);

impl tonic::server::UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let peer = peer_name(request.remote_addr());
        // every `authorization` value, as sent: Python checks the bearer token (mxref.security)
        let authorization: Vec<Bytes> = request
            .metadata()
            .get_all(AUTHORIZATION)
            .iter()
            .map(|v| Bytes::copy_from_slice(v.as_bytes()))
            .collect();
        let body = request.into_inner();
        let (shared, service, method) = (self.shared.clone(), self.service, self.method);
        Box::pin(async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let queue = if READS.contains(&method) { &shared.reads } else { &shared.writes };
            queue
                .send(Pending { service, method, body, peer, authorization, reply })
                .map_err(|_| Status::unavailable(format!("{method}: the server is stopping")))?;
            let (code, details, trailing, response, delay_s) =
                answer.await.map_err(|_| Status::unavailable(format!("{method}: the server stopped before answering")))?;
            if delay_s > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(delay_s.min(60.0))).await;
            }
            if code == 0 {
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
struct Incoming {
    #[pyo3(get)]
    service: &'static str,
    #[pyo3(get)]
    method: &'static str,
    #[pyo3(get)]
    peer: String,
    body: Bytes,
    authorization: Vec<Bytes>,
    reply: Mutex<Option<tokio::sync::oneshot::Sender<Answer>>>,
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
        match self.reply.lock().unwrap().take() {
            Some(reply) => reply.send((code, details, trailing, Bytes::copy_from_slice(response), delay_s)).is_ok(),
            None => false,
        }
    }
}

impl<P: Package, B> Service<http::Request<B>> for P2p<P>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        let name = path.rsplit('/').next().unwrap_or("");
        let Some(method) = METHODS.iter().copied().find(|m| *m == name) else {
            return Box::pin(async move {
                let mut response = http::Response::new(empty_body());
                let headers = response.headers_mut();
                headers.insert("grpc-status", http::HeaderValue::from(Code::Unimplemented as i32));
                headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
                Ok(response)
            });
        };
        let shared = self.shared.clone();
        Box::pin(async move {
            let limit = shared.max_message_bytes;
            let call = Call { shared, service: P::NAME, method };
            let mut grpc = tonic::server::Grpc::new(RawCodec).max_decoding_message_size(limit);
            let mut response = grpc.unary(call, req).await;
            as_grpcio_size_refusal(response.headers_mut());
            Ok(response)
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

/// A running native server: its port, and `stop`.
#[pyclass(module = "mxref_native")]
struct Server {
    port: u16,
    reads: crossbeam_channel::Receiver<Pending>,
    writes: crossbeam_channel::Receiver<Pending>,
    shutdown: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    done: Mutex<Option<crossbeam_channel::Receiver<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl Server {
    /// Bind `host:port` (0: any free port) and serve; `OSError` naming the address when it
    /// cannot be bound. With `tls_cert_pem` and `tls_key_pem` (PEM: the certificate chain and
    /// its key) it serves TLS only (rustls); `ValueError` when they cannot be used. The calls
    /// wait in this server's queues for `take`.
    #[new]
    #[pyo3(signature = (host, port, *, max_concurrent_streams, max_message_bytes, tls_cert_pem=None, tls_key_pem=None))]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        max_concurrent_streams: u32,
        max_message_bytes: usize,
        tls_cert_pem: Option<Vec<u8>>,
        tls_key_pem: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let mut builder = tonic::transport::Server::builder();
        match (tls_cert_pem, tls_key_pem) {
            (Some(cert), Some(key)) => {
                let identity = tonic::transport::Identity::from_pem(cert, key);
                builder = builder
                    .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                    .map_err(|e| PyValueError::new_err(format!("TLS certificate and key: {e}")))?;
            }
            (None, None) => {}
            _ => return Err(PyValueError::new_err("TLS needs both a certificate and its key")),
        }
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
        let (reads_tx, reads_rx) = crossbeam_channel::unbounded::<Pending>();
        let (writes_tx, writes_rx) = crossbeam_channel::unbounded::<Pending>();
        let shared = Arc::new(Shared { reads: reads_tx, writes: writes_tx, max_message_bytes });
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("mxref-native-server".to_string())
            .spawn(move || {
                let _guard = runtime.enter(); // the listener's stream registers with this runtime
                let incoming = match tonic::transport::server::TcpIncoming::from_listener(listener, true, None) {
                    Ok(incoming) => incoming,
                    Err(e) => {
                        eprintln!("mxref native gRPC server: {e}");
                        let _ = done_tx.send(());
                        return;
                    }
                };
                let served = builder
                    .max_concurrent_streams(max_concurrent_streams)
                    .initial_stream_window_size(WINDOW_BYTES)
                    .initial_connection_window_size(WINDOW_BYTES)
                    .add_service(P2p::<Mxref> { shared: shared.clone(), package: PhantomData })
                    .add_service(P2p::<ModelExpress> { shared, package: PhantomData })
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = shutdown_rx.await;
                    });
                if let Err(e) = runtime.block_on(served) {
                    eprintln!("mxref native gRPC server: {e}");
                }
                runtime.shutdown_timeout(Duration::from_secs(1));
                let _ = done_tx.send(());
            })
            .map_err(|e| PyRuntimeError::new_err(format!("native gRPC server thread: {e}")))?;
        Ok(Server {
            port: bound,
            reads: reads_rx,
            writes: writes_rx,
            shutdown: Mutex::new(Some(shutdown_tx)),
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

    /// The calls waiting, up to `most`, reads first: waits up to `timeout_s` for the first
    /// (without the GIL), then takes what is there. None once the server has stopped.
    fn take(&self, py: Python<'_>, most: usize, timeout_s: f64) -> Option<Vec<Incoming>> {
        let (reads, writes) = (self.reads.clone(), self.writes.clone());
        let wait = Duration::from_secs_f64(timeout_s.max(0.0));
        let most = most.max(1);
        let taken = py.allow_threads(move || -> Option<Vec<Pending>> {
            let drain = |out: &mut Vec<Pending>| {
                for queue in [&reads, &writes] {
                    while out.len() < most {
                        match queue.try_recv() {
                            Ok(p) => out.push(p),
                            Err(_) => break,
                        }
                    }
                }
            };
            let mut out = Vec::new();
            drain(&mut out);
            if out.is_empty() {
                crossbeam_channel::select! {
                    recv(reads) -> p => out.push(p.ok()?),
                    recv(writes) -> p => out.push(p.ok()?),
                    default(wait) => return Some(out),
                }
                drain(&mut out);
            }
            Some(out)
        })?;
        Some(
            taken
                .into_iter()
                .map(|p| Incoming {
                    service: p.service,
                    method: p.method,
                    peer: p.peer,
                    body: p.body,
                    authorization: p.authorization,
                    reply: Mutex::new(Some(p.reply)),
                })
                .collect(),
        )
    }

    /// Stop accepting; the calls in flight have `grace_s` to be answered, then the calls still
    /// queued are dropped (their callers get UNAVAILABLE), so nothing waits on an answer that
    /// will not come. True once the server has stopped (within `grace_s` + 2 s).
    fn stop(&self, py: Python<'_>, grace_s: f64) -> bool {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
        let mut done = self.done.lock().unwrap();
        let Some(finished) = done.as_ref() else {
            return true; // stopped before
        };
        let (reads, writes) = (&self.reads, &self.writes);
        let grace = Duration::from_secs_f64(grace_s.max(0.0));
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
            if let Some(thread) = self.thread.lock().unwrap().take() {
                let _ = py.allow_threads(|| thread.join());
            }
        }
        stopped
    }
}

/// The clients' runtime: one thread (the calls are I/O; the server under test needs the CPU).
fn client_runtime() -> PyResult<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("native gRPC client runtime: {e}")))
}

async fn connect(address: &str) -> Result<tonic::client::Grpc<tonic::transport::Channel>, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("{address}: {e}"))?
        .tcp_nodelay(true)
        .initial_stream_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES)
        .connect_timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| format!("cannot connect to {address}: {e}"))?;
    Ok(tonic::client::Grpc::new(channel))
}

/// A failed call's count key: `status:<gRPC code number>` (the caller names the codes).
fn status_key(code: Code) -> String {
    format!("status:{}", code as i32)
}

/// Unary calls of `path` (`/package.Service/Method`) for `seconds`: `requests` round robin, from
/// `connections` connections (each its own TCP connection) with `window` calls in flight each,
/// as fast as answered, or at `rate` calls per second in all on a fixed schedule (0: closed
/// loop). Every call has `timeout_s`. Returns counts: `ok` (status OK and, when `accepted` is
/// given, a response starting with those bytes), `refused` (OK without them), `status:<code>`
/// for each other status code, and `seconds`. The schedule is `bench_fleet.Pacer`'s rule: one
/// more than 1 s behind starts again from now.
#[pyfunction]
#[pyo3(signature = (address, path, requests, *, connections, window, seconds, rate=0.0, timeout_s=10.0, accepted=None))]
#[allow(clippy::too_many_arguments)]
fn unary_load(
    py: Python<'_>,
    address: String,
    path: String,
    requests: Vec<Bound<'_, PyBytes>>,
    connections: usize,
    window: usize,
    seconds: f64,
    rate: f64,
    timeout_s: f64,
    accepted: Option<Vec<u8>>,
) -> PyResult<HashMap<String, f64>> {
    if requests.is_empty() || connections == 0 || window == 0 || seconds <= 0.0 || rate < 0.0 {
        return Err(PyValueError::new_err("requests, connections, window and seconds must be > 0, rate >= 0"));
    }
    let path: http::uri::PathAndQuery =
        path.parse().map_err(|e| PyValueError::new_err(format!("path {path:?}: {e}")))?;
    let requests: Arc<Vec<Bytes>> = Arc::new(requests.iter().map(|r| Bytes::copy_from_slice(r.as_bytes())).collect());
    let accepted = accepted.map(Bytes::from);
    py.allow_threads(move || {
        let rt = client_runtime()?;
        rt.block_on(async move {
            let mut clients = Vec::with_capacity(connections);
            for _ in 0..connections {
                clients.push(connect(&address).await.map_err(PyOSError::new_err)?);
            }
            let next = Arc::new(AtomicUsize::new(0));
            let counts: Arc<Mutex<HashMap<String, f64>>> = Arc::new(Mutex::new(HashMap::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let started = Instant::now();
            let deadline = started + Duration::from_secs_f64(seconds);
            let senders = (connections * window) as f64;
            let interval = if rate > 0.0 { Some(Duration::from_secs_f64(senders / rate)) } else { None };
            let mut tasks = Vec::new();
            for (c, client) in clients.into_iter().enumerate() {
                for w in 0..window {
                    let (mut client, path, requests, accepted) =
                        (client.clone(), path.clone(), requests.clone(), accepted.clone());
                    let (next, counts, stop) = (next.clone(), counts.clone(), stop.clone());
                    let offset = interval.map(|i| i.mul_f64((c * window + w) as f64 / senders));
                    tasks.push(tokio::spawn(async move {
                        let mut due = tokio::time::Instant::now() + offset.unwrap_or_default();
                        let mut mine: HashMap<String, f64> = HashMap::new();
                        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                            if let Some(i) = interval {
                                let now = tokio::time::Instant::now();
                                if now.saturating_duration_since(due) > Duration::from_secs(1) {
                                    due = now; // far behind: start again from now, no burst
                                }
                                tokio::time::sleep_until(due).await;
                                due += i;
                            }
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            let body = requests[n % requests.len()].clone();
                            let mut request = tonic::Request::new(body);
                            request.set_timeout(Duration::from_secs_f64(timeout_s));
                            let key = match client.ready().await {
                                Err(e) => format!("NOT_READY: {e}"),
                                Ok(()) => match client.unary::<Bytes, Bytes, RawCodec>(request, path.clone(), RawCodec).await {
                                    Ok(response) => match &accepted {
                                        Some(prefix) if !response.get_ref().starts_with(prefix) => "refused".to_string(),
                                        _ => "ok".to_string(),
                                    },
                                    Err(status) => status_key(status.code()),
                                },
                            };
                            *mine.entry(key).or_default() += 1.0;
                        }
                        let mut all = counts.lock().unwrap();
                        for (k, v) in mine {
                            *all.entry(k).or_default() += v;
                        }
                    }));
                }
            }
            for task in tasks {
                if task.await.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
            }
            let mut all = counts.lock().unwrap().clone();
            all.insert("seconds".to_string(), started.elapsed().as_secs_f64());
            Ok(all)
        })
    })
}

/// Sequential unary calls of each named `(name, path, request)` in turn, round robin, on one
/// connection of its own, until `rounds` rounds are done or `seconds` pass, `interval_s` apart;
/// per name, each call's latency in seconds and the last answer. A call that fails raises.
#[pyfunction]
#[pyo3(signature = (address, calls, *, rounds, seconds, timeout_s=10.0, interval_s=0.0))]
fn unary_latencies(
    py: Python<'_>,
    address: String,
    calls: Vec<(String, String, Bound<'_, PyBytes>)>,
    rounds: usize,
    seconds: f64,
    timeout_s: f64,
    interval_s: f64,
) -> PyResult<HashMap<String, (Vec<f64>, Py<PyBytes>)>> {
    let mut parsed = Vec::new();
    for (name, path, body) in calls {
        let p: http::uri::PathAndQuery =
            path.parse().map_err(|e| PyValueError::new_err(format!("path {path:?}: {e}")))?;
        parsed.push((name, p, Bytes::copy_from_slice(body.as_bytes())));
    }
    py.allow_threads(move || {
        let rt = client_runtime()?;
        rt.block_on(async move {
            let mut client = connect(&address).await.map_err(PyOSError::new_err)?;
            let mut out: HashMap<String, (Vec<f64>, Bytes)> = HashMap::new();
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            'rounds: for round in 0..rounds {
                if round > 0 && interval_s > 0.0 {
                    let rest = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(Duration::from_secs_f64(interval_s).min(rest)).await;
                }
                for (name, path, body) in &parsed {
                    if Instant::now() >= deadline {
                        break 'rounds;
                    }
                    let mut request = tonic::Request::new(body.clone());
                    request.set_timeout(Duration::from_secs_f64(timeout_s));
                    client.ready().await.map_err(|e| PyOSError::new_err(format!("{address}: {e}")))?;
                    let started = Instant::now();
                    let response = client
                        .unary::<Bytes, Bytes, RawCodec>(request, path.clone(), RawCodec)
                        .await
                        .map_err(|s| PyRuntimeError::new_err(format!("{name}: {:?} {}", s.code(), s.message())))?;
                    let entry = out.entry(name.clone()).or_default();
                    entry.0.push(started.elapsed().as_secs_f64());
                    entry.1 = response.into_inner();
                }
            }
            Ok(out)
        })
    })
    .map(|out| {
        out.into_iter()
            .map(|(name, (latencies, last))| (name, (latencies, PyBytes::new(py, &last).unbind())))
            .collect()
    })
}

#[pymodule]
fn mxref_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Server>()?;
    m.add_class::<Incoming>()?;
    m.add_function(wrap_pyfunction!(unary_load, m)?)?;
    m.add_function(wrap_pyfunction!(unary_latencies, m)?)?;
    Ok(())
}
