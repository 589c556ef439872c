//! Rewrites HTTP/2 `:authority` values that h2's server would reject.
//!
//! Some gRPC clients of a Unix socket send an `:authority` that is not a valid
//! URI authority, and h2's server resets every such stream with
//! RST_STREAM(PROTOCOL_ERROR) (its maintainers declined to relax that,
//! hyperium/h2#487, hyperium/hyper#3750), where grpc-go's server, which
//! upstream's plugins use, answers them:
//!
//! - grpc-go dialing a passthrough target sends the percent-encoded socket
//!   path, e.g. `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock`
//!   (grpc-go `clientconn.go`, `encodeAuthority`). The kubelet's plugin
//!   watcher dials the registration socket this way in every version
//!   (`pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`),
//!   and kubelets v1.34 and v1.35 re-dial the DRA socket this way for the
//!   health stream (`dra_plugin.go`, `getOrCreateGRPCConn`).
//! - gRPC's C core (grpcio for Python, C++, Ruby, ...) sends the
//!   percent-encoded path without its leading slash for `unix:` targets.
//! - grpc-go's `unix:` resolver (the kubelet's DRA connection since v1.34)
//!   and tonic send `localhost`, which h2 accepts.
//!
//! So every listener of the plugin wraps its connections in a
//! [`NormalizeAuthority`], and what it does is chosen per connection from the
//! client's first header block:
//!
//! - its `:authority` is valid (or absent): the block's frames are handed on
//!   unchanged and so is every later byte of the connection; this costs one
//!   HPACK decode per connection;
//! - it is invalid: that block and every later one of the connection are
//!   rewritten as below (≈ 50 µs per request with tonic's client in
//!   `plugin_roundtrip`, mostly loona-hpack building a Huffman table for every
//!   Huffman-coded string).
//!
//! gRPC clients send one authority per channel, so a connection is never
//! split between the two cases; a client that switched from a valid to an
//! invalid authority on one connection would see the later streams reset.
//!
//! How a connection is rewritten (client→server bytes only):
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
//! connection.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf as _, BufMut as _, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Every frame starts with a 9-byte header.
pub(super) const FRAME_HEADER_LEN: usize = 9;

pub(super) const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;

pub(super) const END_STREAM: u8 = 0x1;
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
    /// Not HTTP/2 with prior knowledge, or the first header block's
    /// `:authority` was valid: everything passes through.
    Raw,
}

/// A header block being collected, and the HEADERS frame it started in.
struct Block {
    stream: u32,
    /// END_STREAM and PRIORITY of the HEADERS frame.
    flags: u8,
    priority: [u8; PRIORITY_LEN],
    fragment: Vec<u8>,
    /// The block's frames as received, while the connection's mode is
    /// undecided (they are handed on unchanged if it passes through).
    frames: Option<BytesMut>,
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
    /// Whether the first header block had an invalid `:authority`, so that
    /// every block of the connection is rewritten.
    rewriting: bool,
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
            rewriting: false,
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
                    self.header_frame(ty, flags, stream, frame)?;
                    if self.held.capacity() > 4 * READ_SIZE {
                        // Do not keep what a rare big header block grew.
                        self.held = BytesMut::from(&self.held[..]);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Adds a HEADERS or CONTINUATION frame (header and payload) to the
    /// header block and hands the block on once it is complete.
    fn header_frame(&mut self, ty: u8, flags: u8, stream: u32, frame: BytesMut) -> io::Result<()> {
        let payload = &frame[FRAME_HEADER_LEN..];
        let mut block = match (self.block.take(), ty) {
            (None, HEADERS) => {
                let (priority, fragment) = split_headers_payload(flags, payload)
                    .ok_or_else(|| malformed(stream, "malformed HEADERS frame (padding or priority)"))?;
                let flags = flags & (END_STREAM | PRIORITY);
                let frames = (!self.rewriting).then(BytesMut::new);
                Block { stream, flags, priority, fragment: fragment.to_vec(), frames }
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
        if let Some(frames) = &mut block.frames {
            frames.extend_from_slice(&frame);
        }
        if flags & END_HEADERS == 0 {
            self.block = Some(block);
            return Ok(());
        }
        let (encoded, replaced) = self.rewrite_block(block.stream, &block.fragment)?;
        match block.frames.take() {
            Some(frames) if replaced.is_none() => {
                // The first block is fine: so is the connection.
                tracing::trace!("the client's first :authority is valid, passing the connection through");
                self.out.extend_from_slice(&frames);
                self.phase = Phase::Raw;
            }
            _ => {
                if let Some(authority) = replaced
                    && !std::mem::replace(&mut self.rewriting, true)
                {
                    tracing::debug!(
                        stream = block.stream,
                        %authority,
                        "the client sent an HTTP/2 :authority the server would reject, rewriting this \
                         connection's requests with localhost"
                    );
                }
                put_header_frames(&mut self.out, &block, &encoded);
            }
        }
        Ok(())
    }

    /// Decodes a complete header block and re-encodes it with an invalid
    /// `:authority` replaced; also returns the replaced value.
    fn rewrite_block(&mut self, stream: u32, block: &[u8]) -> io::Result<(Vec<u8>, Option<String>)> {
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
        Ok((encoded, replaced))
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
mod tests;
