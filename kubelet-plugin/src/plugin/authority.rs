//! Rewrites HTTP/2 `:authority` values that h2's server would reject.
//!
//! grpc-go clients that dial with a passthrough target send the
//! percent-encoded socket path as `:authority`, e.g.
//! `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock` (grpc-go
//! `clientconn.go`, `encodeAuthority`). h2's server resets every stream whose
//! `:authority` is not an [`http::uri::Authority`] with
//! RST_STREAM(PROTOCOL_ERROR), and its maintainers declined to relax that
//! (hyperium/h2#487, hyperium/hyper#3750). Which kubelet connections do this
//! (Kubernetes v1.34.3, v1.35.4, v1.36.3, v1.37.2):
//!
//! - registration: `pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`
//!   (`dial`) uses `grpc.DialContext(ctx, unixSocketPath, WithContextDialer(..))`,
//!   a passthrough target, in every version. So the registration listener
//!   always rewrites.
//! - DRA: `pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go` uses
//!   `grpc.NewClient("unix:" + endpoint)`, and grpc-go's unix resolver
//!   overrides the authority with `localhost`. But in v1.34 and v1.35,
//!   `dra_plugin.go` `getOrCreateGRPCConn` (NodeWatchResources, the health
//!   stream) re-dials with `grpc.Dial(endpoint, WithContextDialer(..))` once
//!   that connection is shut down; v1.36 removed it. So the DRA listener only
//!   rewrites when [`PluginConfig::dra_authority_rewrite`](super::PluginConfig::dra_authority_rewrite)
//!   is set, for kubelets older than v1.36.
//!
//! [`NormalizeAuthority`] rewrites the client→server bytes of one connection:
//!
//! - the 24-byte connection preface passes through; any other start means the
//!   peer does not speak HTTP/2 with prior knowledge, and every byte passes
//!   through unchanged;
//! - frames other than HEADERS and CONTINUATION pass through unchanged, and
//!   are handed on as they arrive, without waiting for their end;
//! - a header block (HEADERS + CONTINUATION frames) is collected, decoded by a
//!   [`loona_hpack::Decoder`] that follows the client's dynamic table, an
//!   invalid `:authority` is replaced with `localhost`, and every field is
//!   re-encoded, in order, as a never-indexed literal without Huffman coding.
//!   Nothing enters the server's dynamic table, so its decoder stays in sync
//!   with what we emit, and a field the client sent never-indexed stays so
//!   (RFC 7541 §6.2.3); h2 marks all such values sensitive, which only hides
//!   them from `Debug` output. (loona-hpack's `Encoder` is not used: it
//!   indexes every new field and has no never-indexed form.) Padding is
//!   dropped; PRIORITY fields and END_STREAM are kept;
//! - server→client bytes pass through untouched.
//!
//! A malformed or oversized header block is an I/O error, which closes the
//! connection. A rewritten request costs tens of µs (≈ 50 µs with tonic's
//! client in `plugin_roundtrip`), mostly loona-hpack building a Huffman table
//! for every Huffman-coded string; fine for the few calls that take this path.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf as _, BufMut as _, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;

/// Largest payload of a frame we emit: the initial SETTINGS_MAX_FRAME_SIZE,
/// which every peer accepts (a peer can only raise it).
const MAX_EMITTED_PAYLOAD: usize = 16_384;

/// The largest dynamic table the client may use: the initial
/// SETTINGS_HEADER_TABLE_SIZE, which hyper's server (under tonic) never
/// changes.
const HEADER_TABLE_SIZE: usize = 4096;

/// Limit of one header block (HEADERS + CONTINUATION payloads) and of the
/// header list it decodes to (name + value + 32 per field). Far above what
/// the server accepts, so only abusive peers reach it.
const MAX_HEADER_BLOCK: usize = 16 << 20;

/// What an invalid `:authority` becomes.
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// How much to read at once; also the buffer capacity kept between reads.
const READ_SIZE: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// This many bytes of the preface have been seen.
    Preface(usize),
    /// Frames follow.
    Frames,
    /// Not HTTP/2 with prior knowledge: everything passes through.
    Raw,
}

/// A header block being collected, and the HEADERS frame it started in.
struct Block {
    stream: u32,
    /// END_STREAM and PRIORITY of the HEADERS frame.
    flags: u8,
    priority: [u8; PRIORITY_LEN],
    fragment: Vec<u8>,
}

fn malformed(stream: u32, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("HTTP/2 stream {stream}: {what}"))
}

/// Rewrites the client's HTTP/2 header blocks of one connection so that h2
/// accepts their `:authority` (see the module docs).
pub(crate) struct NormalizeAuthority {
    phase: Phase,
    /// Payload bytes of the current pass-through frame not yet handed on.
    passing: usize,
    /// Client bytes read but not yet handed on.
    held: BytesMut,
    /// Bytes ready to be handed on.
    out: BytesMut,
    /// A header block awaiting its CONTINUATION frames.
    block: Option<Block>,
    /// Follows the client's HPACK encoder.
    decoder: loona_hpack::Decoder<'static>,
    /// Whether a replacement was logged on this connection.
    logged: bool,
}

impl NormalizeAuthority {
    /// The state of a new connection.
    pub(crate) fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        NormalizeAuthority {
            phase: Phase::Preface(0),
            passing: 0,
            held: BytesMut::new(),
            out: BytesMut::new(),
            block: None,
            decoder,
            logged: false,
        }
    }

    /// Moves the first `n` held bytes to the output.
    fn pass(&mut self, n: usize) {
        self.out.extend_from_slice(&self.held[..n]);
        self.held.advance(n);
    }

    /// Moves what it can of the held bytes to the output; false when more
    /// bytes must be read first.
    fn process(&mut self) -> io::Result<bool> {
        if self.held.is_empty() {
            return Ok(false);
        }
        match self.phase {
            Phase::Raw => self.pass(self.held.len()),
            Phase::Preface(seen) => {
                let n = (PREFACE.len() - seen).min(self.held.len());
                if self.held[..n] != PREFACE[seen..seen + n] {
                    tracing::trace!("the client does not start with the HTTP/2 preface, passing it through");
                    self.phase = Phase::Raw;
                    return Ok(true);
                }
                self.phase = if seen + n == PREFACE.len() { Phase::Frames } else { Phase::Preface(seen + n) };
                self.pass(n);
            }
            Phase::Frames if self.passing > 0 => {
                let n = self.passing.min(self.held.len());
                self.passing -= n;
                self.pass(n);
            }
            Phase::Frames => {
                let Some(header) = self.held.get(..FRAME_HEADER_LEN) else { return Ok(false) };
                let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
                let (ty, flags) = (header[3], header[4]);
                let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
                if self.block.is_none() && ty != HEADERS && ty != CONTINUATION {
                    self.passing = len;
                    self.pass(FRAME_HEADER_LEN);
                } else if self.held.len() < FRAME_HEADER_LEN + len {
                    return Ok(false);
                } else {
                    let frame = self.held.split_to(FRAME_HEADER_LEN + len);
                    self.header_frame(ty, flags, stream, &frame[FRAME_HEADER_LEN..])?;
                    if self.held.capacity() > 4 * READ_SIZE {
                        // Do not keep what a rare big header block grew.
                        self.held = BytesMut::from(&self.held[..]);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Adds a HEADERS or CONTINUATION frame to the header block and rewrites
    /// the block once it is complete.
    fn header_frame(&mut self, ty: u8, flags: u8, stream: u32, payload: &[u8]) -> io::Result<()> {
        let block = match (self.block.take(), ty) {
            (None, HEADERS) => {
                let (priority, fragment) = split_headers_payload(flags, payload)
                    .ok_or_else(|| malformed(stream, "malformed HEADERS frame (padding or priority)"))?;
                let flags = flags & (END_STREAM | PRIORITY);
                Block { stream, flags, priority, fragment: fragment.to_vec() }
            }
            (Some(mut block), CONTINUATION) if stream == block.stream => {
                if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                    return Err(malformed(
                        stream,
                        format!("header block larger than {MAX_HEADER_BLOCK} bytes"),
                    ));
                }
                block.fragment.extend_from_slice(payload);
                block
            }
            (Some(block), _) => {
                return Err(malformed(
                    block.stream,
                    format!("expected a CONTINUATION frame, got a frame of type {ty:#x} on stream {stream}"),
                ));
            }
            (None, _) => return Err(malformed(stream, "CONTINUATION frame without a HEADERS frame")),
        };
        if flags & END_HEADERS == 0 {
            self.block = Some(block);
            return Ok(());
        }
        let encoded = self.rewrite_block(block.stream, &block.fragment)?;
        put_header_frames(&mut self.out, &block, &encoded);
        Ok(())
    }

    /// Decodes a complete header block and re-encodes it with an invalid
    /// `:authority` replaced.
    fn rewrite_block(&mut self, stream: u32, block: &[u8]) -> io::Result<Vec<u8>> {
        let mut encoded = Vec::with_capacity(block.len() + 256);
        let mut list_size = 0usize;
        let mut replaced = None;
        self.decoder
            .decode_with_cb(block, |name, value| {
                list_size = list_size.saturating_add(name.len() + value.len() + 32);
                if list_size > MAX_HEADER_BLOCK {
                    return;
                }
                let value: &[u8] =
                    if *name == *b":authority" && http::uri::Authority::try_from(&*value).is_err() {
                        replaced.get_or_insert_with(|| String::from_utf8_lossy(&value).into_owned());
                        REPLACEMENT_AUTHORITY
                    } else {
                        &value
                    };
                put_literal(&mut encoded, &name, value);
            })
            .map_err(|e| malformed(stream, format!("cannot decode the HPACK header block: {e}")))?;
        if list_size > MAX_HEADER_BLOCK {
            return Err(malformed(stream, format!("header list larger than {MAX_HEADER_BLOCK} bytes")));
        }
        if let Some(authority) = replaced
            && !std::mem::replace(&mut self.logged, true)
        {
            tracing::debug!(
                stream,
                %authority,
                "the client sent an HTTP/2 :authority the server would reject, replacing it with localhost \
                 (logged once per connection)"
            );
        }
        Ok(encoded)
    }
}

/// Splits a HEADERS payload into its PRIORITY fields (zeros if absent) and
/// header block fragment, without padding.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<([u8; PRIORITY_LEN], &[u8])> {
    let (padding, rest) = match flags & PADDED {
        0 => (0, payload),
        _ => payload.split_first().map(|(&len, rest)| (usize::from(len), rest))?,
    };
    let (priority, rest) = match flags & PRIORITY {
        0 => ([0; PRIORITY_LEN], rest),
        _ => (rest.get(..PRIORITY_LEN)?.try_into().ok()?, rest.get(PRIORITY_LEN..)?),
    };
    Some((priority, rest.get(..rest.len().checked_sub(padding)?)?))
}

/// Appends a field as a never-indexed literal with a literal name (RFC 7541
/// §6.2.3), without Huffman coding (§5.2).
fn put_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x10);
    for string in [name, value] {
        // Writing to a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(string.len(), 7, 0, out);
        out.extend_from_slice(string);
    }
}

fn put_frame_header(out: &mut BytesMut, len: usize, ty: u8, flags: u8, stream: u32) {
    // `len` is at most MAX_EMITTED_PAYLOAD, so it fits 24 bits.
    out.put_slice(&(len as u32).to_be_bytes()[1..]);
    out.put_u8(ty);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// Appends `encoded`, the rewritten `block`, as one HEADERS frame and as
/// many CONTINUATION frames as needed to stay within [`MAX_EMITTED_PAYLOAD`].
fn put_header_frames(out: &mut BytesMut, block: &Block, encoded: &[u8]) {
    let priority = if block.flags & PRIORITY != 0 { &block.priority[..] } else { &[] };
    let (first, rest) = encoded.split_at(encoded.len().min(MAX_EMITTED_PAYLOAD - priority.len()));
    let end_headers = if rest.is_empty() { END_HEADERS } else { 0 };
    put_frame_header(out, priority.len() + first.len(), HEADERS, block.flags | end_headers, block.stream);
    out.put_slice(priority);
    out.put_slice(first);
    let mut chunks = rest.chunks(MAX_EMITTED_PAYLOAD).peekable();
    while let Some(chunk) = chunks.next() {
        let end_headers = if chunks.peek().is_none() { END_HEADERS } else { 0 };
        put_frame_header(out, chunk.len(), CONTINUATION, end_headers, block.stream);
        out.put_slice(chunk);
    }
}

impl NormalizeAuthority {
    /// Reads from `client` like [`AsyncRead::poll_read`], with its header
    /// blocks rewritten.
    pub(crate) fn poll_read<R: AsyncRead + ?Sized>(
        &mut self,
        mut client: Pin<&mut R>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            while self.process()? {}
            if !self.out.is_empty() {
                let n = self.out.len().min(buf.remaining());
                buf.put_slice(&self.out[..n]);
                self.out.advance(n);
                if self.out.is_empty() && self.out.capacity() > 4 * READ_SIZE {
                    // Do not keep what a rare big header block grew.
                    self.out = BytesMut::new();
                }
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if self.phase == Phase::Raw {
                return client.poll_read(cx, buf);
            }
            self.held.reserve(READ_SIZE);
            if ready!(tokio_util::io::poll_read_buf(client.as_mut(), cx, &mut self.held))? == 0 {
                if self.held.is_empty() && self.block.is_none() {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection in the middle of an HTTP/2 frame or header block",
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rand::{Rng as _, SeedableRng as _};
    use tokio::io::{AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

    use super::*;
    use crate::plugin::serving::ServedConnection;

    /// What grpc-go 1.82.1 (as in Kubernetes v1.37.2), dialing like the
    /// kubelet's plugin watcher, sent for GetInfo + NotifyRegistrationStatus
    /// (see tests/data/README.md).
    const VECTOR: &[u8] = include_bytes!("../../tests/data/grpc-go-1.82.1-kubelet-registration.c2s.bin");
    const SOCKET_AUTHORITY: &[u8] =
        b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fcdi-32fc.dra-e2e.test-reg.sock";

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    /// `io` served as the plugin serves connections, rewriting or not.
    fn served(io: impl crate::plugin::Connection, rewrite: bool) -> ServedConnection {
        ServedConnection::new(Box::new(io), &tokio_util::sync::CancellationToken::new(), rewrite)
    }

    /// Yields `data` in reads of the given sizes (the last one repeating),
    /// answering every other poll with Pending (and a wake-up).
    struct Chunked {
        data: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
        reads: usize,
        pending: bool,
    }

    impl Chunked {
        fn new(data: &[u8], sizes: &[usize]) -> Self {
            Chunked { data: data.to_vec(), pos: 0, sizes: sizes.to_vec(), reads: 0, pending: false }
        }
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            this.pending = !this.pending;
            if this.pending {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let size = this.sizes.get(this.reads).or(this.sizes.last()).copied().unwrap_or(usize::MAX);
            this.reads += 1;
            let n = size.min(buf.remaining()).min(this.data.len() - this.pos);
            buf.put_slice(&this.data[this.pos..this.pos + n]);
            this.pos += n;
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Chunked {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Everything the adapter hands on for `input` read in `sizes` chunks,
    /// with reader buffers of `capacity` bytes.
    async fn rewrite_with(input: &[u8], sizes: &[usize], capacity: usize) -> io::Result<Vec<u8>> {
        let mut adapter = served(Chunked::new(input, sizes), true);
        let mut out = Vec::new();
        let mut buf = vec![0; capacity];
        loop {
            let n = adapter.read(&mut buf).await?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    async fn rewrite(input: &[u8]) -> io::Result<Vec<u8>> {
        rewrite_with(input, &[usize::MAX], 64 * 1024).await
    }

    /// Checks that `input` gives the same output (or error kind) however it
    /// is split into reads: 1-byte reads, two reads split at every byte
    /// boundary, assorted sizes, and small reader buffers.
    async fn rewrite_any_split(input: &[u8]) -> io::Result<Vec<u8>> {
        let whole = rewrite(input).await;
        let same = |other: io::Result<Vec<u8>>, how: &str| match (&whole, other) {
            (Ok(a), Ok(b)) => assert!(*a == b, "output differs with {how}"),
            (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "error differs with {how}"),
            (a, b) => panic!("{how}: {a:?} vs {b:?}"),
        };
        same(rewrite_with(input, &[1], 64 * 1024).await, "1-byte reads");
        // (A 0-byte read would be EOF.)
        for split in 1..input.len() {
            same(rewrite_with(input, &[split, usize::MAX], 64 * 1024).await, &format!("a split at {split}"));
        }
        for sizes in [&[7][..], &[9], &[24, 9, 3], &[100], &[33, 1, 500]] {
            same(rewrite_with(input, sizes, 64 * 1024).await, &format!("reads of {sizes:?}"));
        }
        for capacity in [1, 5, 24, 100] {
            same(rewrite_with(input, &[usize::MAX], capacity).await, &format!("{capacity}-byte buffers"));
        }
        whole
    }

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_frame_header(&mut out, payload.len(), ty, flags, stream);
        out.put_slice(payload);
        out.to_vec()
    }

    /// A never-indexed literal field, as the adapter emits them.
    fn literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_literal(&mut out, name, value);
        out
    }

    /// A literal field with incremental indexing and a literal name (RFC 7541
    /// §6.2.1): the same strings after another first byte.
    fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = literal(name, value);
        out[0] = 0x40;
        out
    }

    fn request(authority: &[u8]) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (b":path", b"/pluginregistration.Registration/GetInfo".to_vec()),
            (b":authority", authority.to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
            (b"user-agent", b"grpc-go/1.82.1".to_vec()),
            (b"te", b"trailers".to_vec()),
        ]
    }

    fn request_block(authority: &[u8]) -> Vec<u8> {
        request(authority).iter().flat_map(|(n, v)| literal(n, v)).collect()
    }

    fn with_preface(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        out.extend(frames.concat());
        out
    }

    #[derive(Debug, PartialEq, Eq)]
    struct Frame {
        ty: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    }

    /// Splits the bytes after the preface into frames.
    fn frames(bytes: &[u8]) -> Vec<Frame> {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        let mut rest = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let end = FRAME_HEADER_LEN + len;
            out.push(Frame {
                ty: rest[3],
                flags: rest[4],
                stream: u32::from_be_bytes(rest[5..9].try_into().unwrap()),
                payload: rest[FRAME_HEADER_LEN..end].to_vec(),
            });
            rest = &rest[end..];
        }
        out
    }

    /// The header blocks (stream, block) of the HEADERS frames, PRIORITY
    /// fields and padding stripped, CONTINUATIONs appended.
    fn header_blocks(frames: &[Frame]) -> Vec<(u32, Vec<u8>)> {
        let mut out: Vec<(u32, Vec<u8>)> = Vec::new();
        for f in frames {
            match f.ty {
                HEADERS => {
                    let (_, fragment) = split_headers_payload(f.flags, &f.payload).unwrap();
                    out.push((f.stream, fragment.to_vec()));
                }
                CONTINUATION => out.last_mut().unwrap().1.extend_from_slice(&f.payload),
                _ => {}
            }
        }
        out
    }

    /// Decodes blocks with a fresh decoder (one dynamic table for all).
    fn decode(blocks: &[(u32, Vec<u8>)]) -> Vec<Fields> {
        let mut decoder = loona_hpack::Decoder::new();
        blocks.iter().map(|(_, b)| decoder.decode(b).unwrap()).collect()
    }

    fn owned(fields: &[(&[u8], Vec<u8>)]) -> Fields {
        fields.iter().map(|(n, v)| (n.to_vec(), v.clone())).collect()
    }

    /// Asserts that `block` is its fields as never-indexed literals with
    /// literal names, without Huffman coding: it leaves the dynamic table
    /// alone, so a fresh decoder decodes it.
    fn assert_plain_literals(block: &[u8]) {
        let fields = loona_hpack::Decoder::new().decode(block).unwrap();
        let plain: Vec<u8> = fields.iter().flat_map(|(n, v)| literal(n, v)).collect();
        assert_eq!(block, plain, "not plain never-indexed literals");
    }

    fn grpc_frames(authority: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let settings = frame(0x4, 0, 0, &[0, 0x4, 0, 0, 0x40, 0]);
        let data = frame(0x0, END_STREAM, 1, &[0u8; 100]);
        let window_update = frame(0x8, 0, 0, &[0, 0, 0x10, 0]);
        let headers = frame(HEADERS, END_HEADERS, 1, &request_block(authority));
        (settings, [headers, data].concat(), window_update)
    }

    #[tokio::test]
    async fn replaces_a_percent_encoded_authority_and_passes_other_frames_unchanged() {
        let (settings, request_frames, window_update) = grpc_frames(SOCKET_AUTHORITY);
        let input = with_preface(&[settings.clone(), request_frames, window_update.clone()]);
        let out = rewrite_any_split(&input).await.unwrap();

        let expected_headers = frame(HEADERS, END_HEADERS, 1, &request_block(b"localhost"));
        let data = frame(0x0, END_STREAM, 1, &[0u8; 100]);
        assert_eq!(out, with_preface(&[settings, expected_headers, data, window_update]));
    }

    #[tokio::test]
    async fn keeps_a_valid_authority_byte_for_byte() {
        for authority in [&b"localhost"[..], b"localhost:50051", b"[::]:50051", b"dra.sock", b"10.0.0.1"] {
            let (settings, request_frames, window_update) = grpc_frames(authority);
            let input = with_preface(&[settings, request_frames, window_update]);
            assert_eq!(rewrite(&input).await.unwrap(), input, "{}", String::from_utf8_lossy(authority));
        }
    }

    #[tokio::test]
    async fn replaces_every_authority_h2_rejects() {
        for authority in [&b""[..], b"%2Ftmp%2Fx.sock", b"/tmp/x.sock", b"a b", b"\xff", b"user@host"] {
            let input = with_preface(&[frame(HEADERS, END_HEADERS, 1, &request_block(authority))]);
            let out = rewrite(&input).await.unwrap();
            let decoded = decode(&header_blocks(&frames(&out)));
            let expected =
                if http::uri::Authority::try_from(authority).is_ok() { authority } else { b"localhost" };
            assert_eq!(decoded, vec![owned(&request(expected))], "{}", String::from_utf8_lossy(authority));
        }
    }

    #[tokio::test]
    async fn data_frames_pass_byte_identical() {
        // A large DATA frame crossing many reads, and odd frame types.
        let payload: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let input = with_preface(&[
            frame(0x0, 0, 1, &payload[..16_384]),
            frame(0x0, END_STREAM | PADDED, 3, &[&[3u8][..], b"abc", &[0, 0, 0]].concat()),
            frame(0x6, 0, 0, b"12345678"),
            frame(0xfa, 0xff, 7, b"unknown frame type"),
            frame(0x0, 0, 1, &payload),
        ]);
        assert_eq!(rewrite(&input).await.unwrap(), input);
        for sizes in [&[1][..], &[9], &[10, 16_384]] {
            assert_eq!(rewrite_with(&input, sizes, 8192).await.unwrap(), input);
        }
    }

    #[tokio::test]
    async fn passes_non_http2_peers_through() {
        let inputs: [&[u8]; 5] = [
            b"GET / HTTP/1.1\r\nHost: %2Ftmp%2Fx.sock\r\n\r\n",
            b"PRI * HTTP/1.1\r\n\r\nnot the preface, yet close",
            b"PRI * HTTP/2.0\r\n",
            b"",
            b"\x00\x00\x05\x01\x04\x00\x00\x00\x01garbage",
        ];
        for input in inputs {
            assert_eq!(rewrite_any_split(input).await.unwrap(), input);
        }
    }

    #[tokio::test]
    async fn strips_padding_and_keeps_priority_and_end_stream() {
        let fields = request_block(SOCKET_AUTHORITY);
        let priority = [0x80, 0, 0, 3, 15];
        let payload = [&[4u8][..], &priority, &fields, &[0, 0, 0, 0]].concat();
        let input =
            with_preface(&[frame(HEADERS, END_STREAM | END_HEADERS | PADDED | PRIORITY, 5, &payload)]);
        let out = rewrite_any_split(&input).await.unwrap();
        let expected = [&priority[..], &request_block(b"localhost")].concat();
        assert_eq!(out, with_preface(&[frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY, 5, &expected)]));
    }

    #[tokio::test]
    async fn joins_continuation_frames() {
        let fields = request_block(SOCKET_AUTHORITY);
        let (a, rest) = fields.split_at(10);
        let (b, c) = rest.split_at(40);
        let input = with_preface(&[
            frame(HEADERS, END_STREAM | PADDED, 1, &[&[2u8][..], a, &[0, 0]].concat()),
            frame(CONTINUATION, 0, 1, b),
            frame(CONTINUATION, 0, 1, &[]),
            frame(CONTINUATION, END_HEADERS, 1, c),
            frame(0x0, END_STREAM, 1, b"after"),
        ]);
        let out = rewrite_any_split(&input).await.unwrap();
        assert_eq!(
            out,
            with_preface(&[
                frame(HEADERS, END_STREAM | END_HEADERS, 1, &request_block(b"localhost")),
                frame(0x0, END_STREAM, 1, b"after"),
            ])
        );
    }

    #[tokio::test]
    async fn splits_large_blocks_into_continuation_frames() {
        let big = vec![b'x'; 40_000];
        let mut fields = request(SOCKET_AUTHORITY);
        fields.push((b"x-big", big.clone()));
        let input_block: Vec<u8> = fields.iter().flat_map(|(n, v)| literal(n, v)).collect();
        // The client may send frames up to the server's limit; split at 16 KiB.
        let (a, b) = input_block.split_at(16_000);
        let input = with_preface(&[
            frame(HEADERS, PRIORITY, 3, &[&[0u8, 0, 0, 1, 200][..], a].concat()),
            frame(CONTINUATION, END_HEADERS, 3, b),
        ]);
        let out = rewrite(&input).await.unwrap();
        let out_frames = frames(&out);
        assert_eq!(out_frames.len(), 3);
        assert_eq!((out_frames[0].ty, out_frames[0].flags), (HEADERS, PRIORITY));
        assert_eq!(out_frames[0].payload.len(), MAX_EMITTED_PAYLOAD);
        assert_eq!(&out_frames[0].payload[..5], &[0, 0, 0, 1, 200]);
        assert_eq!((out_frames[1].ty, out_frames[1].flags), (CONTINUATION, 0));
        assert_eq!(out_frames[1].payload.len(), MAX_EMITTED_PAYLOAD);
        assert_eq!((out_frames[2].ty, out_frames[2].flags), (CONTINUATION, END_HEADERS));
        assert!(out_frames.iter().all(|f| f.stream == 3));
        let mut expected = request(b"localhost");
        expected.push((b"x-big", big));
        assert_eq!(decode(&header_blocks(&out_frames)), vec![owned(&expected)]);
    }

    #[tokio::test]
    async fn follows_the_dynamic_table_and_huffman_coding() {
        // RFC 7541 C.4.1-C.4.3: three requests, Huffman-coded, indexed.
        let c4 = [
            "828684418cf1e3c2e5f23a6ba0ab90f4ff",
            "828684be5886a8eb10649cbf",
            "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
        ];
        let mut input_frames: Vec<Vec<u8>> = c4
            .iter()
            .zip([1, 3, 5])
            .map(|(hex, stream)| frame(HEADERS, END_HEADERS | END_STREAM, stream, &hex_bytes(hex)))
            .collect();
        // A socket authority put into the dynamic table, then used by index
        // only (index 62 is the newest entry).
        let first = [indexed_literal(b":authority", SOCKET_AUTHORITY), literal(b":path", b"/a")].concat();
        input_frames.push(frame(HEADERS, END_HEADERS, 7, &first));
        input_frames.push(frame(HEADERS, END_HEADERS, 9, &[0xbe, 0x84]));
        let input = with_preface(&input_frames);

        let out = rewrite_any_split(&input).await.unwrap();
        let blocks = header_blocks(&frames(&out));
        blocks.iter().for_each(|(_, b)| assert_plain_literals(b));
        let as_fields = |fields: &[(&str, &str)]| -> Fields {
            fields.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
        };
        let example =
            [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")];
        let second = [&example[..], &[("cache-control", "no-cache")]].concat();
        let third = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ];
        assert_eq!(
            decode(&blocks),
            vec![
                as_fields(&example),
                as_fields(&second),
                as_fields(&third),
                as_fields(&[(":authority", "localhost"), (":path", "/a")]),
                as_fields(&[(":authority", "localhost"), (":path", "/")]),
            ]
        );
    }

    fn hex_bytes(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    #[tokio::test]
    async fn honours_dynamic_table_size_updates() {
        let insert = frame(HEADERS, END_HEADERS, 1, &indexed_literal(b"x-a", b"1"));
        // Shrinking the table to 0 evicts the entry: a later reference fails.
        let evict = frame(HEADERS, END_HEADERS, 3, &[0x20, 0xbe]);
        let err = rewrite(&with_preface(&[insert.clone(), evict])).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("stream 3"), "{err}");

        // Resizing within the limit keeps the entry.
        let keep = frame(HEADERS, END_HEADERS, 3, &[0x3f, 0xe1, 0x1f, 0xbe]);
        let out = rewrite_any_split(&with_preface(&[insert.clone(), keep])).await.unwrap();
        assert_eq!(decode(&header_blocks(&frames(&out)))[1], vec![(b"x-a".to_vec(), b"1".to_vec())]);

        // Beyond SETTINGS_HEADER_TABLE_SIZE (4097), or after a field: errors.
        for block in [&[0x3f, 0xe2, 0x1f, 0xbe][..], &[0xbe, 0x20]] {
            let err = rewrite(&with_preface(&[insert.clone(), frame(HEADERS, END_HEADERS, 3, block)]))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{block:x?}");
        }
    }

    #[tokio::test]
    async fn keeps_never_indexed_fields_never_indexed() {
        // `authorization` (static index 23) never indexed, then indexed with
        // incremental indexing: both come out as never-indexed literals.
        let never = [&[0x1f, 0x08, 0x06][..], b"secret"].concat();
        let fields =
            [literal(b":authority", SOCKET_AUTHORITY), never, indexed_literal(b"x-a", b"1")].concat();
        let out = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &fields)])).await.unwrap();
        let expected = [
            literal(b":authority", b"localhost"),
            literal(b"authorization", b"secret"),
            literal(b"x-a", b"1"),
        ]
        .concat();
        assert_eq!(out, with_preface(&[frame(HEADERS, END_HEADERS, 1, &expected)]));
    }

    #[tokio::test]
    async fn malformed_streams_are_io_errors() {
        let fields = request_block(SOCKET_AUTHORITY);
        let cases: Vec<(&str, Vec<Vec<u8>>, io::ErrorKind)> = vec![
            (
                "index out of range",
                vec![frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f])],
                io::ErrorKind::InvalidData,
            ),
            (
                "truncated literal",
                vec![frame(HEADERS, END_HEADERS, 1, &fields[..20])],
                io::ErrorKind::InvalidData,
            ),
            (
                "bad Huffman",
                vec![frame(HEADERS, END_HEADERS, 1, &[0x41, 0x81, 0xff])],
                io::ErrorKind::InvalidData,
            ),
            (
                "overlong integer",
                vec![frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])],
                io::ErrorKind::InvalidData,
            ),
            (
                "padding too long",
                vec![frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0x82])],
                io::ErrorKind::InvalidData,
            ),
            ("no pad length", vec![frame(HEADERS, END_HEADERS | PADDED, 1, &[])], io::ErrorKind::InvalidData),
            (
                "short priority",
                vec![frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0])],
                io::ErrorKind::InvalidData,
            ),
            (
                "stray continuation",
                vec![frame(CONTINUATION, END_HEADERS, 1, &fields)],
                io::ErrorKind::InvalidData,
            ),
            (
                "interrupted block",
                vec![frame(HEADERS, 0, 1, &fields[..10]), frame(0x0, 0, 1, b"x")],
                io::ErrorKind::InvalidData,
            ),
            (
                "continuation of another stream",
                vec![frame(HEADERS, 0, 1, &fields[..10]), frame(CONTINUATION, END_HEADERS, 3, &fields[10..])],
                io::ErrorKind::InvalidData,
            ),
            (
                "eof inside a HEADERS frame",
                vec![frame(HEADERS, END_HEADERS, 1, &fields)[..30].to_vec()],
                io::ErrorKind::UnexpectedEof,
            ),
            (
                "eof between HEADERS and CONTINUATION",
                vec![frame(HEADERS, 0, 1, &fields)],
                io::ErrorKind::UnexpectedEof,
            ),
        ];
        for (what, input_frames, kind) in cases {
            let err = rewrite_any_split(&with_preface(&input_frames)).await.unwrap_err();
            assert_eq!(err.kind(), kind, "{what}: {err}");
        }
    }

    #[tokio::test]
    async fn rejects_header_blocks_over_16_mib() {
        let chunk = vec![0u8; MAX_EMITTED_PAYLOAD];
        let mut input = with_preface(&[frame(HEADERS, 0, 1, &chunk)]);
        for _ in 0..MAX_HEADER_BLOCK / MAX_EMITTED_PAYLOAD {
            input.extend(frame(CONTINUATION, 0, 1, &chunk));
        }
        let err = rewrite(&input).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("larger than"), "{err}");

        // A small block that indexes one big entry many times.
        let mut fields = indexed_literal(b"x-big", &vec![b'x'; 4000]);
        fields.extend(std::iter::repeat_n(0xbe, 4300));
        let err = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &fields)])).await.unwrap_err();
        assert!(err.to_string().contains("header list"), "{err}");
    }

    #[tokio::test]
    async fn random_input_never_panics() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let valid = request_block(SOCKET_AUTHORITY);
        for _ in 0..3000 {
            let mut input = PREFACE.to_vec();
            for _ in 0..rng.random_range(1..6) {
                let ty = [HEADERS, CONTINUATION, 0x0, 0x4, rng.random()][rng.random_range(0..5)];
                let len = rng.random_range(0..80);
                let mut payload: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                if rng.random_bool(0.3) {
                    payload.extend_from_slice(&valid[..rng.random_range(0..valid.len())]);
                }
                input.extend(frame(ty, rng.random(), rng.random_range(0..4), &payload));
            }
            let size = rng.random_range(1..40);
            let _ = rewrite_with(&input, &[size], 64).await;
        }
    }

    #[tokio::test]
    async fn writes_pass_through() {
        let (client, server) = tokio::io::duplex(1024);
        let mut adapter = served(server, true);
        adapter.write_all(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00server bytes").await.unwrap();
        adapter.flush().await.unwrap();
        adapter.shutdown().await.unwrap();
        let mut got = Vec::new();
        let mut client = client;
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"\x00\x00\x00\x04\x01\x00\x00\x00\x00server bytes");
    }

    /// Decodes the captured client bytes as they were sent.
    fn vector_requests() -> Vec<Fields> {
        decode(&header_blocks(&frames(VECTOR)))
    }

    fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a [u8]> {
        fields.iter().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| &v[..])
    }

    #[tokio::test]
    async fn real_grpc_go_vector_gets_localhost_and_keeps_every_other_field() {
        let sent = vector_requests();
        assert_eq!(sent.len(), 2, "GetInfo and NotifyRegistrationStatus");
        for request in &sent {
            let authority = field(request, ":authority").unwrap();
            assert_eq!(
                authority,
                b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Ftest-driver.dra-e2e.k8s.io-reg.sock"
            );
            assert!(http::uri::Authority::try_from(authority).is_err());
            assert_eq!(field(request, "user-agent"), Some(&b"grpc-go/1.82.1"[..]));
        }

        let out = rewrite_any_split(VECTOR).await.unwrap();
        let out_frames = frames(&out);
        let blocks = header_blocks(&out_frames);
        blocks.iter().for_each(|(_, b)| assert_plain_literals(b));
        let expected: Vec<Fields> = sent
            .into_iter()
            .map(|fields| {
                fields
                    .into_iter()
                    .map(|(n, v)| if n == b":authority" { (n, b"localhost".to_vec()) } else { (n, v) })
                    .collect()
            })
            .collect();
        assert_eq!(decode(&blocks), expected);

        // Every other frame is unchanged.
        let others =
            |frames: Vec<Frame>| -> Vec<Frame> { frames.into_iter().filter(|f| f.ty != HEADERS).collect() };
        assert_eq!(others(out_frames), others(frames(VECTOR)));
    }

    /// Serves `client_bytes` to h2's server (through the adapter if `adapt`)
    /// and returns the requests it accepted.
    async fn h2_requests(client_bytes: &[u8], adapt: bool) -> Vec<http::request::Parts> {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            let mut connection = h2::server::handshake(served(server, adapt)).await.unwrap();
            let mut requests = Vec::new();
            while let Some(accepted) = connection.accept().await {
                let Ok((request, mut respond)) = accepted else { break };
                requests.push(request.into_parts().0);
                respond.send_response(http::Response::new(()), true).unwrap();
            }
            requests
        });
        client.write_all(client_bytes).await.unwrap();
        let mut server_bytes = Vec::new();
        client.read_to_end(&mut server_bytes).await.unwrap();
        server.await.unwrap()
    }

    #[tokio::test]
    async fn h2_server_accepts_the_rewritten_vector() {
        // The bug: h2 alone refuses both requests (RST_STREAM PROTOCOL_ERROR).
        assert!(h2_requests(VECTOR, false).await.is_empty());

        let requests = h2_requests(VECTOR, true).await;
        let sent = vector_requests();
        assert_eq!(requests.len(), 2);
        for (got, sent) in requests.iter().zip(&sent) {
            assert_eq!(got.uri.authority().map(|a| a.as_str()), Some("localhost"));
            assert_eq!(got.method.as_str().as_bytes(), field(sent, ":method").unwrap());
            assert_eq!(got.uri.scheme_str().unwrap().as_bytes(), field(sent, ":scheme").unwrap());
            assert_eq!(got.uri.path().as_bytes(), field(sent, ":path").unwrap());
            let regular: Fields = sent.iter().filter(|(n, _)| !n.starts_with(b":")).cloned().collect();
            let received: Fields = got
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect();
            assert_eq!(received, regular);
        }
        assert_eq!(requests[0].uri.path(), "/pluginregistration.Registration/GetInfo");
        assert_eq!(requests[1].uri.path(), "/pluginregistration.Registration/NotifyRegistrationStatus");
    }

    #[test]
    fn literal_lengths_decode_like_loona_hpack() {
        for len in [0, 1, 126, 127, 128, 254, 255, 1337, 16_384, 1 << 20] {
            let value = vec![b'v'; len];
            let block = literal(b"x-len", &value);
            let fields = loona_hpack::Decoder::new().decode(&block).unwrap();
            assert_eq!(fields, vec![(b"x-len".to_vec(), value)], "{len}");
        }
    }
}
