//! mxref's native gRPC transport for the metadata server: HTTP/2 and gRPC framing in Rust
//! (hyper and tonic on tokio), every call's decision in Python.
//!
//! `Server` (`server`) accepts calls of the methods Python lists (`mxref.v1.P2pService` and
//! `model_express.p2p.P2pService`, as `mxref.metadata.native` gives them; its own accept loop,
//! caps and timeouts: `front`) and queues each one, as raw bytes with its caller's address; Python threads take the queued calls in batches (`Server.take`, which waits without
//! the GIL) and answer each (`Incoming.answer`), so the servicer's checks, store, counts and
//! events stay the ones the grpcio server runs, and a busy server hands calls to Python without
//! a thread switch per call. What is refused here, before a body is read or a call queued: a
//! call carrying none of the accepted token values Python gave (counted per peer
//! address for `Server.refusals`), and a call finding its queue full (RESOURCE_EXHAUSTED).
//! `unary_load` and `unary_latencies` (`clients`) are clients of the same framing, for the
//! benchmarks: they send from this process without the GIL.

mod clients;
mod front;
mod server;

use bytes::{Buf, BufMut, Bytes};
use pyo3::prelude::*;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Messages as bytes, unparsed: the Python side parses and checks them.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawCodec;

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

/// HTTP/2 flow-control windows: a 5000-worker listing (~330 KB) in one window, not six round trips.
pub(crate) const WINDOW_BYTES: u32 = 8 << 20;

#[pymodule]
fn mxref_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<server::Server>()?;
    m.add_class::<server::Incoming>()?;
    m.add_function(wrap_pyfunction!(clients::unary_load, m)?)?;
    m.add_function(wrap_pyfunction!(clients::unary_latencies, m)?)?;
    Ok(())
}
