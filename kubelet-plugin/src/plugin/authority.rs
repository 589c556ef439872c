//! Rewrites HTTP/2 `:authority` values that h2's server would reject.
//!
//! grpc-go clients that dial a Unix socket with a passthrough target (the
//! kubelet's plugin watcher does) send the percent-encoded socket path as
//! `:authority`, e.g. `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock`.
//! h2's server answers every request whose `:authority` does not parse as an
//! [`http::uri::Authority`] with RST_STREAM(PROTOCOL_ERROR), and its
//! maintainers declined to relax that (hyperium/h2#487, hyperium/hyper#3750).
//! So [`NormalizeAuthority`] sits between every served connection and the
//! server and rewrites the client's byte stream:
//!
//! - the 24-byte connection preface passes through; any other start means the
//!   peer does not speak HTTP/2 with prior knowledge, and then every byte
//!   passes through unchanged;
//! - frames pass through unchanged, except HEADERS and their CONTINUATION
//!   frames: their header block is HPACK-decoded with a decoder that follows
//!   the client's dynamic table, an `:authority` that is not a valid
//!   authority is replaced with `localhost`, and the block is re-encoded with
//!   literals that do not touch the dynamic table (never-indexed fields stay
//!   never-indexed) and no Huffman coding, so the server's dynamic table stays
//!   empty. Every field and its order survive; padding is dropped, PRIORITY
//!   fields and END_STREAM are kept;
//! - server→client bytes pass through untouched.
//!
//! Bytes are only held back from the start of a HEADERS or CONTINUATION
//! frame (or an incomplete frame header) until that frame is complete; all
//! other bytes are handed on as they are read, in place. A malformed header
//! block is an I/O error, which closes the connection.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf as _, BufMut as _, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
/// which is also what hyper's server (under tonic) advertises. A peer can
/// only raise its limit, so frames this large are always accepted.
const MAX_EMITTED_PAYLOAD: usize = 16_384;

/// The largest dynamic table the client may use: the initial
/// SETTINGS_HEADER_TABLE_SIZE. hyper's server (under tonic) never advertises
/// another value and h2 rejects larger dynamic table size updates, so we do
/// too.
const HEADER_TABLE_SIZE: usize = 4096;

/// Limit of one header block (HEADERS + CONTINUATION payloads) and of the
/// header list it decodes to (name + value + 32 per field), which bounds what
/// one connection buffers. Far above what the server accepts (hyper's server
/// advertises a 16 KiB header list), so only abusive peers reach it.
const MAX_HEADER_BLOCK: usize = 16 << 20;

/// What an invalid `:authority` becomes.
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// How much to read at least, and at most, while completing a held frame.
const MIN_HELD_READ: usize = 8 * 1024;
const MAX_HELD_READ: usize = 64 * 1024;

/// Why a client's HTTP/2 stream cannot be rewritten.
#[derive(Debug, thiserror::Error)]
enum RewriteError {
    #[error("HTTP/2 HEADERS frame of stream {stream} is malformed: {what}")]
    MalformedHeaders { stream: u32, what: &'static str },
    #[error(
        "expected a CONTINUATION frame of stream {expected}, got a frame of type {ty:#x} on stream {got}"
    )]
    ExpectedContinuation { expected: u32, ty: u8, got: u32 },
    #[error("HTTP/2 CONTINUATION frame on stream {stream} without a HEADERS frame before it")]
    StrayContinuation { stream: u32 },
    #[error("the header block of HTTP/2 stream {stream} is larger than {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge { stream: u32 },
    #[error("the header list of HTTP/2 stream {stream} is larger than {MAX_HEADER_BLOCK} bytes")]
    HeaderListTooLarge { stream: u32 },
    #[error("cannot decode the HPACK header block of HTTP/2 stream {stream}: {what}")]
    HpackLayout { stream: u32, what: &'static str },
    #[error("cannot decode the HPACK header block of HTTP/2 stream {stream}: {source}")]
    Hpack { stream: u32, source: loona_hpack::decoder::DecoderError },
    #[error("cannot decode a Huffman-coded string in the header block of HTTP/2 stream {stream}: {source}")]
    Huffman { stream: u32, source: loona_hpack::huffman::HuffmanDecoderError },
    #[error("the client closed the connection in the middle of an HTTP/2 header block")]
    Truncated,
}

impl From<RewriteError> for io::Error {
    fn from(e: RewriteError) -> Self {
        let kind = match e {
            RewriteError::Truncated => io::ErrorKind::UnexpectedEof,
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

/// A 9-byte frame header.
#[derive(Clone, Copy, Debug)]
struct FrameHeader {
    len: usize,
    ty: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    /// The header at the start of `bytes`, if all 9 bytes are there.
    fn parse(bytes: &[u8]) -> Option<FrameHeader> {
        let b: [u8; FRAME_HEADER_LEN] = bytes.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        Some(FrameHeader {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            ty: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        })
    }
}

fn put_frame_header(out: &mut BytesMut, len: usize, ty: u8, flags: u8, stream: u32) {
    // `len` never exceeds MAX_EMITTED_PAYLOAD, so it fits 24 bits.
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.put_slice(&len[1..]);
    out.put_u8(ty);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// A HEADERS frame whose header block is being collected.
#[derive(Clone, Copy, Debug)]
struct HeadersHead {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
}

impl HeadersHead {
    /// Splits a HEADERS payload into its head and header block fragment.
    fn parse<'p>(header: &FrameHeader, payload: &'p [u8]) -> Result<(HeadersHead, &'p [u8]), RewriteError> {
        let malformed = |what| RewriteError::MalformedHeaders { stream: header.stream, what };
        let mut rest = payload;
        let mut padding = 0;
        if header.flags & PADDED != 0 {
            let (&len, tail) = rest.split_first().ok_or_else(|| malformed("no pad length"))?;
            padding = usize::from(len);
            rest = tail;
        }
        let mut priority = None;
        if header.flags & PRIORITY != 0 {
            let fields = rest.get(..PRIORITY_LEN).ok_or_else(|| malformed("PRIORITY fields missing"))?;
            priority = fields.try_into().ok();
            rest = &rest[PRIORITY_LEN..];
        }
        let fragment_len =
            rest.len().checked_sub(padding).ok_or_else(|| malformed("padding exceeds the payload"))?;
        let head =
            HeadersHead { stream: header.stream, end_stream: header.flags & END_STREAM != 0, priority };
        Ok((head, &rest[..fragment_len]))
    }
}

/// What [`Rewriter::take_frame`] did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Moved bytes to the output; call again.
    Progress,
    /// The held bytes end inside a frame; this many more bytes complete it.
    NeedMore(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// This many bytes of the preface have been seen.
    Preface(usize),
    /// Frames follow.
    Frames,
    /// Not HTTP/2 with prior knowledge: everything passes through.
    Raw,
}

/// The client→server state machine.
struct Rewriter {
    phase: Phase,
    /// Payload bytes of the current pass-through frame still to come.
    passing: usize,
    /// The HEADERS frame whose CONTINUATION frames are awaited.
    block: Option<HeadersHead>,
    /// The header block collected so far (only when it spans frames).
    fragment: Vec<u8>,
    /// Follows the client's HPACK encoder.
    decoder: loona_hpack::Decoder<'static>,
    /// Per field of the block being rewritten: whether it is never-indexed.
    never_indexed: Vec<bool>,
    /// The block being rewritten with its Huffman-coded strings decoded.
    plain: Vec<u8>,
    huffman: Huffman,
    /// The re-encoded block.
    encoded: Vec<u8>,
    /// Whether a replacement was logged on this connection.
    logged: bool,
}

impl Rewriter {
    fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Rewriter {
            phase: Phase::Preface(0),
            passing: 0,
            block: None,
            fragment: Vec::new(),
            decoder,
            never_indexed: Vec::new(),
            plain: Vec::new(),
            huffman: Huffman::default(),
            encoded: Vec::new(),
            logged: false,
        }
    }

    /// Advances over the leading bytes of `data` that pass through unchanged
    /// and returns their count. It stops at the first byte that must be held
    /// back: the start of a HEADERS or CONTINUATION frame, or of a frame
    /// header that `data` does not hold completely.
    fn scan(&mut self, data: &[u8]) -> usize {
        let mut pos = 0;
        loop {
            match self.phase {
                Phase::Raw => return data.len(),
                Phase::Preface(seen) => {
                    let expected = &PREFACE[seen..];
                    let n = expected.len().min(data.len() - pos);
                    if data[pos..pos + n] != expected[..n] {
                        tracing::trace!(
                            "the client does not start with the HTTP/2 preface, passing it through"
                        );
                        self.phase = Phase::Raw;
                        return data.len();
                    }
                    pos += n;
                    if seen + n < PREFACE.len() {
                        self.phase = Phase::Preface(seen + n);
                        return pos;
                    }
                    self.phase = Phase::Frames;
                }
                Phase::Frames => {
                    if self.passing > 0 {
                        let n = self.passing.min(data.len() - pos);
                        self.passing -= n;
                        pos += n;
                        if self.passing > 0 {
                            return pos;
                        }
                    }
                    if self.block.is_some() {
                        return pos;
                    }
                    match FrameHeader::parse(&data[pos..]) {
                        Some(header) if header.ty != HEADERS && header.ty != CONTINUATION => {
                            pos += FRAME_HEADER_LEN;
                            self.passing = header.len;
                        }
                        _ => return pos,
                    }
                }
            }
        }
    }

    /// Moves what it can of `held` (bytes not yet handed on) to `out`: bytes
    /// that pass through, or one complete HEADERS/CONTINUATION frame,
    /// rewritten.
    fn take_frame(&mut self, held: &mut BytesMut, out: &mut BytesMut) -> Result<Step, RewriteError> {
        let pass = self.scan(held);
        if pass > 0 {
            out.unsplit(held.split_to(pass));
            return Ok(Step::Progress);
        }
        let Some(header) = FrameHeader::parse(held) else {
            return Ok(Step::NeedMore(FRAME_HEADER_LEN.saturating_sub(held.len()).max(1)));
        };
        let total = FRAME_HEADER_LEN + header.len;
        if held.len() < total {
            return Ok(Step::NeedMore(total - held.len()));
        }
        let frame = held.split_to(total);
        if held.is_empty() && held.capacity() > MAX_HELD_READ {
            *held = BytesMut::new();
        }
        self.header_frame(header, &frame, out)?;
        Ok(Step::Progress)
    }

    /// Handles one complete frame that [`Rewriter::scan`] held back.
    fn header_frame(
        &mut self,
        header: FrameHeader,
        frame: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), RewriteError> {
        let payload = &frame[FRAME_HEADER_LEN..];
        match (self.block.take(), header.ty) {
            (Some(head), CONTINUATION) if header.stream == head.stream => {
                if self.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                    return Err(RewriteError::BlockTooLarge { stream: head.stream });
                }
                self.fragment.extend_from_slice(payload);
                if header.flags & END_HEADERS == 0 {
                    self.block = Some(head);
                    return Ok(());
                }
                let fragment = std::mem::take(&mut self.fragment);
                let finished = self.finish(&head, &fragment, out);
                self.fragment = release_if_large(fragment);
                finished
            }
            (Some(head), ty) => {
                Err(RewriteError::ExpectedContinuation { expected: head.stream, ty, got: header.stream })
            }
            (None, HEADERS) => {
                let (head, fragment) = HeadersHead::parse(&header, payload)?;
                if header.flags & END_HEADERS != 0 {
                    return self.finish(&head, fragment, out);
                }
                self.fragment.clear();
                self.fragment.extend_from_slice(fragment);
                self.block = Some(head);
                Ok(())
            }
            (None, CONTINUATION) => Err(RewriteError::StrayContinuation { stream: header.stream }),
            (None, _) => {
                // Not held back by `scan`; pass it on as it is.
                out.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// Decodes a complete header block, replaces an invalid `:authority` and
    /// appends the re-encoded HEADERS (+ CONTINUATION) frames to `out`.
    fn finish(&mut self, head: &HeadersHead, block: &[u8], out: &mut BytesMut) -> Result<(), RewriteError> {
        let stream = head.stream;
        let Rewriter { decoder, never_indexed, plain, huffman, encoded, logged, .. } = self;
        let block =
            if prepare_block(stream, block, never_indexed, plain, huffman)? { &plain[..] } else { block };
        encoded.clear();
        let mut fields = 0;
        let mut list_size = 0usize;
        let mut replaced: Option<Vec<u8>> = None;
        decoder
            .decode_with_cb(block, |name, value| {
                let never = never_indexed.get(fields).copied().unwrap_or(false);
                fields += 1;
                list_size = list_size.saturating_add(name.len() + value.len() + 32);
                if list_size > MAX_HEADER_BLOCK {
                    return;
                }
                if *name == *b":authority" && http::uri::Authority::try_from(&*value).is_err() {
                    if replaced.is_none() {
                        replaced = Some(value.to_vec());
                    }
                    encode_field(encoded, never, &name, REPLACEMENT_AUTHORITY);
                } else {
                    encode_field(encoded, never, &name, &value);
                }
            })
            .map_err(|source| RewriteError::Hpack { stream, source })?;
        if list_size > MAX_HEADER_BLOCK {
            return Err(RewriteError::HeaderListTooLarge { stream });
        }
        if fields != never_indexed.len() {
            return Err(RewriteError::HpackLayout { stream, what: "the field count is inconsistent" });
        }
        if let Some(original) = replaced
            && !*logged
        {
            *logged = true;
            tracing::debug!(
                stream,
                authority = %String::from_utf8_lossy(&original),
                "the client sent an HTTP/2 :authority the server would reject, replacing it with localhost \
                 (logged once per connection)"
            );
        }
        put_header_frames(out, head, encoded);
        *encoded = release_if_large(std::mem::take(encoded));
        *plain = release_if_large(std::mem::take(plain));
        Ok(())
    }
}

/// Drops a buffer that a rare big header block grew, so that a long-lived
/// connection does not keep it.
fn release_if_large<T>(mut buf: Vec<T>) -> Vec<T> {
    if buf.capacity() > MAX_HELD_READ {
        return Vec::new();
    }
    buf.clear();
    buf
}

/// Appends `block` as one HEADERS frame and as many CONTINUATION frames as
/// needed to stay within [`MAX_EMITTED_PAYLOAD`].
fn put_header_frames(out: &mut BytesMut, head: &HeadersHead, block: &[u8]) {
    let prefix = if head.priority.is_some() { PRIORITY_LEN } else { 0 };
    let first_len = block.len().min(MAX_EMITTED_PAYLOAD - prefix);
    let (first, mut rest) = block.split_at(first_len);
    let frames = 1 + rest.len().div_ceil(MAX_EMITTED_PAYLOAD);
    out.reserve(frames * FRAME_HEADER_LEN + prefix + block.len());

    let mut flags = 0;
    if head.end_stream {
        flags |= END_STREAM;
    }
    if head.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    put_frame_header(out, prefix + first.len(), HEADERS, flags, head.stream);
    if let Some(priority) = &head.priority {
        out.put_slice(priority);
    }
    out.put_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_EMITTED_PAYLOAD));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        put_frame_header(out, chunk.len(), CONTINUATION, flags, head.stream);
        out.put_slice(chunk);
    }
}

/// Appends a field as a literal with a literal name that does not touch the
/// dynamic table (RFC 7541 §6.2.2, §6.2.3), without Huffman coding.
fn encode_field(out: &mut Vec<u8>, never_indexed: bool, name: &[u8], value: &[u8]) {
    out.push(if never_indexed { 0x10 } else { 0x00 });
    put_string(out, name);
    put_string(out, value);
}

/// Appends an HPACK integer with a `prefix`-bit prefix (RFC 7541 §5.1).
fn encode_integer(out: &mut Vec<u8>, first_bits: u8, prefix: u32, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first_bits | value as u8);
        return;
    }
    out.push(first_bits | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads an HPACK integer with a `prefix`-bit prefix; like h2 and
/// loona-hpack, at most 4 continuation bytes.
fn decode_integer(buf: &[u8], prefix: u32) -> Result<(usize, &[u8]), &'static str> {
    let (&first, mut rest) = buf.split_first().ok_or("truncated integer")?;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok((value, rest));
    }
    for shift in [0, 7, 14, 21] {
        let (&b, tail) = rest.split_first().ok_or("truncated integer")?;
        rest = tail;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((value, rest));
        }
    }
    Err("integer too long")
}

/// Splits a string literal (RFC 7541 §5.2) off `buf`: whether it is
/// Huffman-coded, its octets, the rest.
fn split_string(buf: &[u8]) -> Result<(bool, &[u8], &[u8]), &'static str> {
    let huffman = buf.first().is_some_and(|b| b & 0x80 != 0);
    let (len, rest) = decode_integer(buf, 7)?;
    let octets = rest.get(..len).ok_or("truncated string")?;
    Ok((huffman, octets, &rest[len..]))
}

fn put_string(out: &mut Vec<u8>, octets: &[u8]) {
    encode_integer(out, 0, 7, octets.len());
    out.extend_from_slice(octets);
}

/// Decodes Huffman-coded strings for one connection.
///
/// loona-hpack builds a new decoding table (~20 µs) for every Huffman-coded
/// string it meets, so blocks reach its decoder with their strings already
/// decoded here, with one table per connection. Recent results are kept:
/// gRPC clients repeat the same strings (h2's client never indexes `:path`).
#[derive(Default)]
struct Huffman {
    decoder: Option<loona_hpack::huffman::HuffmanDecoder>,
    /// (coded, decoded), replaced round-robin.
    recent: Vec<(Vec<u8>, Vec<u8>)>,
    next: usize,
}

impl Huffman {
    const RECENT: usize = 16;
    const RECENT_MAX_LEN: usize = 256;

    /// Appends the decoded `coded` to `out` as a plain string literal.
    fn put_decoded(
        &mut self,
        coded: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), loona_hpack::huffman::HuffmanDecoderError> {
        if let Some((_, decoded)) = self.recent.iter().find(|(c, _)| c == coded) {
            put_string(out, decoded);
            return Ok(());
        }
        let decoded =
            self.decoder.get_or_insert_with(loona_hpack::huffman::HuffmanDecoder::new).decode(coded)?;
        put_string(out, &decoded);
        if coded.len() <= Self::RECENT_MAX_LEN {
            let entry = (coded.to_vec(), decoded);
            if self.recent.len() < Self::RECENT {
                self.recent.push(entry);
            } else {
                self.recent[self.next] = entry;
                self.next = (self.next + 1) % Self::RECENT;
            }
        }
        Ok(())
    }
}

/// Walks the representations of a header block (RFC 7541 §6): records per
/// field whether it is never-indexed, checks that dynamic table size updates
/// come before the first field (as h2 does) and, if the block has
/// Huffman-coded strings, writes it with them decoded to `plain` and returns
/// true.
fn prepare_block(
    stream: u32,
    block: &[u8],
    never_indexed: &mut Vec<bool>,
    plain: &mut Vec<u8>,
    huffman: &mut Huffman,
) -> Result<bool, RewriteError> {
    let layout = |what| RewriteError::HpackLayout { stream, what };
    never_indexed.clear();
    plain.clear();
    let mut copied = 0;
    let mut rewritten = false;
    let mut rest = block;
    while let Some(&first) = rest.first() {
        let (prefix, literal, never) = if first & 0x80 != 0 {
            (7, false, false)
        } else if first & 0x40 != 0 {
            (6, true, false)
        } else if first & 0x20 != 0 {
            if !never_indexed.is_empty() {
                return Err(layout("a dynamic table size update follows a header field"));
            }
            rest = decode_integer(rest, 5).map_err(layout)?.1;
            continue;
        } else {
            (4, true, first & 0x10 != 0)
        };
        let (index, tail) = decode_integer(rest, prefix).map_err(layout)?;
        rest = tail;
        if literal {
            // A literal name (index 0) comes before the value.
            let strings = if index == 0 { 2 } else { 1 };
            for _ in 0..strings {
                let start = block.len() - rest.len();
                let (coded, octets, tail) = split_string(rest).map_err(layout)?;
                rest = tail;
                if coded {
                    plain.extend_from_slice(&block[copied..start]);
                    huffman
                        .put_decoded(octets, plain)
                        .map_err(|source| RewriteError::Huffman { stream, source })?;
                    copied = block.len() - rest.len();
                    rewritten = true;
                    if plain.len() > 2 * MAX_HEADER_BLOCK {
                        return Err(RewriteError::HeaderListTooLarge { stream });
                    }
                }
            }
        }
        never_indexed.push(never);
    }
    if rewritten {
        plain.extend_from_slice(&block[copied..]);
    }
    Ok(rewritten)
}

/// Wraps the server side of a connection and rewrites the client's HTTP/2
/// header blocks so that h2 accepts their `:authority` (see the module docs).
pub(crate) struct NormalizeAuthority<T> {
    io: T,
    rewriter: Rewriter,
    /// Client bytes read but not yet handed on (from a held-back frame on).
    held: BytesMut,
    /// Bytes ready to be handed on.
    out: BytesMut,
}

impl<T> NormalizeAuthority<T> {
    /// Wraps `io`.
    pub(crate) fn new(io: T) -> Self {
        NormalizeAuthority { io, rewriter: Rewriter::new(), held: BytesMut::new(), out: BytesMut::new() }
    }
}

impl<T: AsyncRead + Unpin> NormalizeAuthority<T> {
    /// Reads at least `need` (bounded) more bytes into `held`; 0 is EOF.
    fn read_held(&mut self, cx: &mut Context<'_>, need: usize) -> Poll<io::Result<usize>> {
        let start = self.held.len();
        self.held.resize(start + need.clamp(MIN_HELD_READ, MAX_HELD_READ), 0);
        let mut buf = ReadBuf::new(&mut self.held[start..]);
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut buf);
        let got = buf.filled().len();
        self.held.truncate(start + got);
        polled.map_ok(|()| got)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for NormalizeAuthority<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if !this.held.is_empty() {
                match this.rewriter.take_frame(&mut this.held, &mut this.out)? {
                    Step::Progress => {}
                    Step::NeedMore(need) => {
                        if ready!(this.read_held(cx, need))? == 0 {
                            return Poll::Ready(Err(RewriteError::Truncated.into()));
                        }
                    }
                }
                continue;
            }
            if this.rewriter.phase == Phase::Raw {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            // Nothing held back: read straight into the caller's buffer and
            // keep what passes through there.
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
            let read = &buf.filled()[before..];
            if read.is_empty() {
                if this.rewriter.block.is_some() {
                    return Poll::Ready(Err(RewriteError::Truncated.into()));
                }
                return Poll::Ready(Ok(()));
            }
            let pass = this.rewriter.scan(read);
            if pass < read.len() {
                this.held.extend_from_slice(&read[pass..]);
                buf.set_filled(before + pass);
            }
            if pass > 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for NormalizeAuthority<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rand::{Rng as _, SeedableRng as _};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// What grpc-go 1.82.1 (as in Kubernetes v1.37.2), dialing like the
    /// kubelet's plugin watcher, sent for GetInfo + NotifyRegistrationStatus
    /// (see tests/data/README.md).
    const VECTOR: &[u8] = include_bytes!("../../tests/data/grpc-go-1.82.1-kubelet-registration.c2s.bin");
    const SOCKET_AUTHORITY: &[u8] =
        b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fcdi-32fc.dra-e2e.test-reg.sock";

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

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
        let mut adapter = NormalizeAuthority::new(Chunked::new(input, sizes));
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

    /// A literal field that does not touch the dynamic table, as the adapter
    /// emits them.
    fn literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_field(&mut out, false, name, value);
        out
    }

    /// A literal field with incremental indexing (RFC 7541 §6.2.1).
    fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40];
        encode_integer(&mut out, 0, 7, name.len());
        out.extend_from_slice(name);
        encode_integer(&mut out, 0, 7, value.len());
        out.extend_from_slice(value);
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
            let header = FrameHeader::parse(rest).expect("a whole frame header");
            let end = FRAME_HEADER_LEN + header.len;
            out.push(Frame {
                ty: header.ty,
                flags: header.flags,
                stream: header.stream,
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
                    let header =
                        FrameHeader { len: f.payload.len(), ty: f.ty, flags: f.flags, stream: f.stream };
                    let (_, fragment) = HeadersHead::parse(&header, &f.payload).unwrap();
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

    /// Asserts that every field representation of `block` is a literal that
    /// leaves the dynamic table alone, without Huffman coding.
    fn assert_plain_literals(block: &[u8]) {
        let mut rest = block;
        while let Some(&first) = rest.first() {
            assert!(first == 0x00 || first == 0x10, "not a plain literal: {first:#x}");
            let (name_len, tail) = decode_integer(&rest[1..], 7).unwrap();
            assert_eq!(rest[1] & 0x80, 0, "Huffman-coded name");
            let tail = &tail[name_len..];
            assert_eq!(tail[0] & 0x80, 0, "Huffman-coded value");
            let (value_len, tail) = decode_integer(tail, 7).unwrap();
            rest = &tail[value_len..];
        }
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
        let mut never = Vec::new();
        encode_field(&mut never, true, b"authorization", b"secret");
        let fields = [literal(b":authority", SOCKET_AUTHORITY), never.clone()].concat();
        let out = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &fields)])).await.unwrap();
        let expected = [literal(b":authority", b"localhost"), never].concat();
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
        let mut adapter = NormalizeAuthority::new(server);
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
            let io: Box<dyn crate::plugin::Connection> =
                if adapt { Box::new(NormalizeAuthority::new(server)) } else { Box::new(server) };
            let mut connection = h2::server::handshake(io).await.unwrap();
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
    fn huffman_strings_decode_like_loona_hpack_with_the_recent_ones_kept() {
        // Valid Huffman codes: random octets that decode.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut reference = loona_hpack::huffman::HuffmanDecoder::new();
        let mut codes: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        while codes.len() < 40 {
            let len = rng.random_range(0..12);
            let coded: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if let Ok(decoded) = reference.decode(&coded) {
                codes.push((coded, decoded));
            }
        }
        // Too long to be kept: 480 five-bit '0' codes.
        codes.push((vec![0; 300], vec![b'0'; 480]));

        let mut huffman = Huffman::default();
        for _ in 0..500 {
            let (coded, decoded) = &codes[rng.random_range(0..codes.len())];
            let mut out = Vec::new();
            match huffman.put_decoded(coded, &mut out) {
                Ok(()) => {
                    let mut expected = Vec::new();
                    put_string(&mut expected, decoded);
                    assert_eq!(out, expected, "{coded:x?}");
                }
                Err(e) => assert!(reference.decode(coded).is_err(), "{coded:x?}: {e}"),
            }
            assert!(huffman.recent.len() <= Huffman::RECENT);
        }
        // Invalid codes are errors, also when repeated.
        for _ in 0..2 {
            assert!(huffman.put_decoded(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()).is_err());
        }
    }

    #[test]
    fn integers_round_trip() {
        for prefix in [4, 5, 6, 7] {
            for value in
                [0, 1, 14, 15, 16, 30, 31, 62, 63, 64, 126, 127, 128, 1337, 16_384, 1 << 20, 268_435_455]
            {
                let mut out = Vec::new();
                encode_integer(&mut out, 0, prefix, value);
                assert_eq!(decode_integer(&out, prefix).unwrap(), (value, &[][..]), "{value} /{prefix}");
            }
        }
    }
}
