//! Clients of the same framing, for the benchmarks and the adversarial tests: they send from
//! this process without the GIL, over plaintext or TLS, with or without a bearer token.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tonic::codegen::http;
use tonic::metadata::MetadataValue;
use tonic::Code;

use crate::{RawCodec, WINDOW_BYTES};

/// How a client dials: TLS against `ca_pem` (the server's name: `domain`) or plaintext, and the
/// `authorization` value each call carries (none: no token).
#[derive(Clone, Default)]
struct Dial {
    ca_pem: Option<Vec<u8>>,
    domain: Option<String>,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Dial {
    fn new(ca_pem: Option<Vec<u8>>, domain: Option<String>, authorization: Option<String>) -> PyResult<Self> {
        let authorization = authorization
            .map(|a| MetadataValue::try_from(a.as_str()).map_err(|e| PyValueError::new_err(format!("authorization: {e}"))))
            .transpose()?;
        Ok(Dial { ca_pem, domain, authorization })
    }

    fn request(&self, body: Bytes, timeout_s: f64) -> tonic::Request<Bytes> {
        let mut request = tonic::Request::new(body);
        request.set_timeout(Duration::from_secs_f64(timeout_s));
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert("authorization", value.clone());
        }
        request
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

async fn connect(address: &str, dial: &Dial) -> Result<tonic::client::Grpc<tonic::transport::Channel>, String> {
    let scheme = if dial.ca_pem.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| format!("{address}: {e}"))?;
    if let Some(ca) = &dial.ca_pem {
        let mut tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca));
        if let Some(domain) = &dial.domain {
            tls = tls.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| format!("{address}: TLS: {e}"))?;
    }
    let endpoint = endpoint
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
/// over TLS when `ca_pem` is given (checked against `domain`), each call carrying `authorization`
/// when given,
/// as fast as answered, or at `rate` calls per second in all on a fixed schedule (0: closed
/// loop). Every call has `timeout_s`. Returns counts: `ok` (status OK and, when `accepted` is
/// given, a response starting with those bytes), `refused` (OK without them), `status:<code>`
/// for each other status code, and `seconds`. The schedule is `bench_fleet.Pacer`'s rule: one
/// more than 1 s behind starts again from now.
#[pyfunction]
#[pyo3(signature = (address, path, requests, *, connections, window, seconds, rate=0.0, timeout_s=10.0, accepted=None,
                    ca_pem=None, domain=None, authorization=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn unary_load(
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
    ca_pem: Option<Vec<u8>>,
    domain: Option<String>,
    authorization: Option<String>,
) -> PyResult<HashMap<String, f64>> {
    let dial = Dial::new(ca_pem, domain, authorization)?;
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
                clients.push(connect(&address, &dial).await.map_err(PyOSError::new_err)?);
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
                    let (mut client, path, requests, accepted, dial) =
                        (client.clone(), path.clone(), requests.clone(), accepted.clone(), dial.clone());
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
                            let request = dial.request(body, timeout_s);
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
/// `ca_pem`, `domain`, `authorization`: as `unary_load`'s.
#[pyfunction]
#[pyo3(signature = (address, calls, *, rounds, seconds, timeout_s=10.0, interval_s=0.0, ca_pem=None, domain=None,
                    authorization=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn unary_latencies(
    py: Python<'_>,
    address: String,
    calls: Vec<(String, String, Bound<'_, PyBytes>)>,
    rounds: usize,
    seconds: f64,
    timeout_s: f64,
    interval_s: f64,
    ca_pem: Option<Vec<u8>>,
    domain: Option<String>,
    authorization: Option<String>,
) -> PyResult<HashMap<String, (Vec<f64>, Py<PyBytes>)>> {
    let dial = Dial::new(ca_pem, domain, authorization)?;
    let mut parsed = Vec::new();
    for (name, path, body) in calls {
        let p: http::uri::PathAndQuery =
            path.parse().map_err(|e| PyValueError::new_err(format!("path {path:?}: {e}")))?;
        parsed.push((name, p, Bytes::copy_from_slice(body.as_bytes())));
    }
    py.allow_threads(move || {
        let rt = client_runtime()?;
        rt.block_on(async move {
            let mut client = connect(&address, &dial).await.map_err(PyOSError::new_err)?;
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
                    let request = dial.request(body.clone(), timeout_s);
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

