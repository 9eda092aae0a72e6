//! Reading a client's stream of requests (a client-streaming or bidi RPC,
//! such as `Ingest`), with errors that say which message failed and whose
//! fault it was.
//!
//! A unary call's request, when its bytes do not decode, is answered by
//! tonic before any handler runs, in the response headers, where the layer
//! [`crate::undecodable_is_invalid_argument`] turns tonic's INTERNAL into
//! INVALID_ARGUMENT. A stream's messages are decoded while the handler
//! reads them, after the response headers went out: the error reaches the
//! handler as INTERNAL and its status travels in the trailers, which that
//! layer does not see. [`RequestStream`] maps it where it arises.

use tonic::{Code, Status, Streaming};

/// Whether tonic made `status` because the bytes it was given are not the
/// message they should be (truncated, a field of the wrong wire type, a
/// string that is not UTF-8): prost's decode error, which tonic reports as
/// INTERNAL.
pub(crate) fn is_undecodable(code: Code, message: &str) -> bool {
    code == Code::Internal && message.starts_with("failed to decode Protobuf message")
}

/// The messages of a client's request stream, counted, so that an error
/// names the message it came with. Ends at the first error.
pub struct RequestStream<T> {
    inner: Streaming<T>,
    rpc: &'static str,
    read: u64,
}

impl<T> RequestStream<T> {
    /// The stream of `rpc` (its name, for messages).
    pub fn new(inner: Streaming<T>, rpc: &'static str) -> Self {
        RequestStream { inner, rpc, read: 0 }
    }

    /// The next message; `Ok(None)` when the client ended the stream. An
    /// error is [`stream_message_error`]'s, and ends the stream.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        match self.inner.message().await {
            Ok(Some(m)) => {
                self.read += 1;
                Ok(Some(m))
            }
            Ok(None) => Ok(None),
            Err(status) => Err(stream_message_error(status, self.rpc, self.read + 1)),
        }
    }

    /// Messages read so far.
    pub fn read(&self) -> u64 {
        self.read
    }
}

/// What reading message `n` (counted from 1) of a client's `rpc` stream
/// failed with, as the status to answer. The client's bytes at fault are
/// the client's error, not the server's: a message that does not decode, a
/// frame with a compressed-flag other than 0 and 1 (or 1 without an
/// encoding), a stream that ends inside a message are INVALID_ARGUMENT
/// (tonic says INTERNAL); a message over the size limit is
/// RESOURCE_EXHAUSTED (tonic says OUT_OF_RANGE), as for a unary call. Each
/// names the message. Other errors (the connection reset, the call
/// cancelled) are returned as they are.
pub fn stream_message_error(status: Status, rpc: &str, n: u64) -> Status {
    let code = status.code();
    let message = status.message();
    let at = format!("message {n} of the {rpc} stream");
    if is_undecodable(code, message) {
        return Status::invalid_argument(format!("{at} does not decode: {message}"));
    }
    if code == Code::Internal && message.starts_with("protocol error: received message with") {
        return Status::invalid_argument(format!("{at} is not a gRPC message frame: {message}"));
    }
    if code == Code::Internal && message.starts_with("Unexpected EOF") {
        return Status::invalid_argument(format!("{at} is cut off: the stream ended inside it"));
    }
    if code == Code::OutOfRange && message.contains("message length too large") {
        return Status::resource_exhausted(format!("{at} is too large: {message}"));
    }
    status
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, Bytes, BytesMut};
    use prost::Message;
    use tonic::codec::Codec;

    use super::*;
    use crate::v1;

    fn frame(flag: u8, len: u32, body: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_u8(flag);
        b.put_u32(len);
        b.put_slice(body);
        b.to_vec()
    }

    async fn read_all(body: Vec<u8>) -> (Vec<v1::IngestRequest>, Option<Status>) {
        let decoder = tonic_prost::ProstCodec::<v1::IngestAck, v1::IngestRequest>::default().decoder();
        let streaming = Streaming::new_request(decoder, http_body_util::Full::new(Bytes::from(body)), None, Some(1 << 20));
        let mut s = RequestStream::new(streaming, "Ingest");
        let mut got = Vec::new();
        loop {
            match s.message().await {
                Ok(Some(m)) => got.push(m),
                Ok(None) => return (got, None),
                Err(e) => {
                    assert_eq!(s.read(), got.len() as u64);
                    return (got, Some(e));
                }
            }
        }
    }

    #[tokio::test]
    async fn a_later_message_that_is_not_one_is_the_clients_error_and_named() {
        let first = v1::IngestRequest { collection: "docs".into(), source: "job".into(), offset: 1, ..Default::default() }.encode_to_vec();
        let valid = frame(0, first.len() as u32, &first);
        let cases: Vec<(Vec<u8>, Code, &str)> = vec![
            (frame(0, 1024, &[0xff; 1024]), Code::InvalidArgument, "message 2 of the Ingest stream does not decode: failed to decode"),
            (frame(7, 3, &[1, 2, 3]), Code::InvalidArgument, "message 2 of the Ingest stream is not a gRPC message frame"),
            (frame(0, 100, &[0x0a; 10]), Code::InvalidArgument, "message 2 of the Ingest stream is cut off"),
            (frame(0, 2 << 20, &[]), Code::ResourceExhausted, "message 2 of the Ingest stream is too large"),
        ];
        for (second, code, says) in cases {
            let (got, err) = read_all([valid.clone(), second].concat()).await;
            assert_eq!(got.len(), 1);
            let err = err.expect("an error");
            assert_eq!(err.code(), code, "{err:?}");
            assert!(err.message().starts_with(says), "{err:?}");
        }
        // The first message too.
        let (got, err) = read_all(frame(0, 3, &[0x08, 0x96, 0x01])).await;
        assert!(got.is_empty());
        let err = err.unwrap();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("message 1 of the Ingest stream does not decode"), "{err:?}");
        // A stream that ends cleanly is no error; other errors are kept.
        assert!(read_all(valid).await.1.is_none());
        let reset = stream_message_error(Status::cancelled("h2 protocol error"), "Ingest", 3);
        assert_eq!(reset.code(), Code::Cancelled);
        assert_eq!(reset.message(), "h2 protocol error");
    }
}
