//! Tests of the `:authority` rewrite and of the per-connection choice to pass a connection
//! through: byte-level, split at every read boundary, against loona-hpack's decoder, h2's server
//! and a recorded grpc-go connection.

#![allow(clippy::unwrap_used)]

use rand::{Rng as _, SeedableRng as _};
use tokio::io::{AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::*;
use crate::plugin::serving::ServedConnection;

/// What grpc-go 1.82.1 (as in Kubernetes v1.37.2), dialing like the
/// kubelet's plugin watcher, sent for GetInfo + NotifyRegistrationStatus
/// (see tests/data/README.md).
const VECTOR: &[u8] = include_bytes!("../../../tests/data/grpc-go-1.82.1-kubelet-registration.c2s.bin");
const SOCKET_AUTHORITY: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fcdi-32fc.dra-e2e.test-reg.sock";

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// `io` served as the plugin serves connections.
fn served(io: impl crate::plugin::Connection) -> ServedConnection {
    let never = tokio_util::sync::CancellationToken::new();
    ServedConnection::new(Box::new(io), &never, &never)
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
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
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
    let mut adapter = served(Chunked::new(input, sizes));
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
async fn a_valid_first_authority_passes_the_whole_connection_through() {
    // Huffman-coded, indexed, padded: handed on as sent, and so is everything after,
    // even a later block h2 would reset (gRPC clients keep one authority per channel).
    let c4 = ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf"];
    let padded = [&[3u8][..], &hex_bytes(c4[0]), &[0, 0, 0]].concat();
    let input = with_preface(&[
        frame(0x4, 0, 0, &[]),
        frame(HEADERS, END_HEADERS | PADDED, 1, &padded),
        frame(0x0, END_STREAM, 1, b"data"),
        frame(HEADERS, END_HEADERS, 3, &hex_bytes(c4[1])),
        frame(HEADERS, END_HEADERS, 5, &request_block(SOCKET_AUTHORITY)),
    ]);
    assert_eq!(rewrite_any_split(&input).await.unwrap(), input);

    // Split over CONTINUATION frames, too.
    let block = request_block(b"localhost");
    let (a, b) = block.split_at(12);
    let input = with_preface(&[
        frame(HEADERS, 0, 1, a),
        frame(CONTINUATION, END_HEADERS, 1, b),
        frame(HEADERS, END_HEADERS, 3, &request_block(SOCKET_AUTHORITY)),
    ]);
    assert_eq!(rewrite_any_split(&input).await.unwrap(), input);
}

#[tokio::test]
async fn an_invalid_first_authority_rewrites_every_later_block() {
    let input = with_preface(&[
        frame(HEADERS, END_HEADERS, 1, &request_block(SOCKET_AUTHORITY)),
        frame(HEADERS, END_HEADERS, 3, &[indexed_literal(b":authority", b"localhost"), vec![0x84]].concat()),
        frame(HEADERS, END_HEADERS, 5, &request_block(SOCKET_AUTHORITY)),
    ]);
    let out = rewrite_any_split(&input).await.unwrap();
    let blocks = header_blocks(&frames(&out));
    blocks.iter().for_each(|(_, b)| assert_plain_literals(b));
    let path = |p: &str| (b":path".to_vec(), p.as_bytes().to_vec());
    let localhost = (b":authority".to_vec(), b"localhost".to_vec());
    assert_eq!(
        decode(&blocks),
        vec![owned(&request(b"localhost")), vec![localhost, path("/")], owned(&request(b"localhost"))]
    );
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
    let input = with_preface(&[frame(HEADERS, END_STREAM | END_HEADERS | PADDED | PRIORITY, 5, &payload)]);
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
    // The first block's socket authority makes the connection a rewritten one
    // (never-indexed literals leave the dynamic table alone).
    let opening = [literal(b":authority", SOCKET_AUTHORITY), literal(b":path", b"/0")].concat();
    let mut input_frames = vec![frame(HEADERS, END_HEADERS, 1, &opening)];
    input_frames.extend(
        c4.iter()
            .zip([3, 5, 7])
            .map(|(hex, stream)| frame(HEADERS, END_HEADERS | END_STREAM, stream, &hex_bytes(hex))),
    );
    // A socket authority put into the dynamic table, then used by index
    // only (index 62 is the newest entry).
    let first = [indexed_literal(b":authority", SOCKET_AUTHORITY), literal(b":path", b"/a")].concat();
    input_frames.push(frame(HEADERS, END_HEADERS, 9, &first));
    input_frames.push(frame(HEADERS, END_HEADERS, 11, &[0xbe, 0x84]));
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
            as_fields(&[(":authority", "localhost"), (":path", "/0")]),
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
    let insert = frame(
        HEADERS,
        END_HEADERS,
        1,
        &[literal(b":authority", SOCKET_AUTHORITY), indexed_literal(b"x-a", b"1")].concat(),
    );
    // Shrinking the table to 0 evicts the entry: a later reference fails.
    let evict = frame(HEADERS, END_HEADERS, 3, &[0x20, 0xbe]);
    let err = rewrite(&with_preface(&[insert.clone(), evict])).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("stream 3"), "{err}");

    // Resizing within the limit keeps the entry.
    let keep = frame(HEADERS, END_HEADERS, 3, &[0x3f, 0xe1, 0x1f, 0xbe]);
    let out = rewrite_any_split(&with_preface(&[insert.clone(), keep])).await.unwrap();
    assert_eq!(decode(&header_blocks(&frames(&out)))[1], vec![(b"x-a".to_vec(), b"1".to_vec())]);
    assert_eq!(decode(&header_blocks(&frames(&out)))[0][1], (b"x-a".to_vec(), b"1".to_vec()));

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
    let fields = [literal(b":authority", SOCKET_AUTHORITY), never, indexed_literal(b"x-a", b"1")].concat();
    let out = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &fields)])).await.unwrap();
    let expected =
        [literal(b":authority", b"localhost"), literal(b"authorization", b"secret"), literal(b"x-a", b"1")]
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
    let mut adapter = served(server);
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
        let io: crate::plugin::BoxedConnection =
            if adapt { Box::new(served(server)) } else { Box::new(server) };
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
fn literal_lengths_decode_like_loona_hpack() {
    for len in [0, 1, 126, 127, 128, 254, 255, 1337, 16_384, 1 << 20] {
        let value = vec![b'v'; len];
        let block = literal(b"x-len", &value);
        let fields = loona_hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(fields, vec![(b"x-len".to_vec(), value)], "{len}");
    }
}
