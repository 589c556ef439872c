//! Which HTTP/2 streams of a served connection are still open, read off the bytes that pass,
//! so that a stopping plugin can end a connection as soon as every stream its client opened has
//! been answered on the wire.
//!
//! A graceful HTTP/2 stop sends GOAWAY and a PING and waits for the PING's answer before it
//! closes the connection. The kubelet (grpc-go) does not answer: it closes a connection that gets
//! a GOAWAY while no stream is open. Over a Unix socket the server reads that close at once;
//! through a proxy pod's port-forward it arrives only when the container runtime gives up the
//! forwarded connection (containerd waits a second for the other direction), so every stop
//! waited out its whole grace.
//!
//! A stream is open from the client's HEADERS that start it until the server has written its
//! end (END_STREAM on DATA or HEADERS) or either side has reset it (RST_STREAM). Counting on the
//! wire, not around the handlers, also covers a request h2 has read but not yet handed to a
//! handler, and an answer still held back by flow control after its handler ended.

use std::collections::BTreeSet;

use super::authority::{END_STREAM, FRAME_HEADER_LEN as HEADER_LEN, HEADERS, PREFACE};

const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;

/// The open streams of one connection.
#[derive(Debug)]
pub(crate) struct OpenStreams {
    from_client: FrameHeaders,
    from_server: FrameHeaders,
    open: BTreeSet<u32>,
    /// The highest stream the client started: a HEADERS frame on a lower one is its trailers.
    last_started: u32,
}

impl Default for OpenStreams {
    fn default() -> Self {
        OpenStreams {
            from_client: FrameHeaders::after(PREFACE.len()),
            from_server: FrameHeaders::after(0),
            open: BTreeSet::new(),
            last_started: 0,
        }
    }
}

impl OpenStreams {
    /// Takes note of bytes the server read from the client.
    pub(crate) fn client_sent(&mut self, bytes: &[u8]) {
        let (open, last) = (&mut self.open, &mut self.last_started);
        self.from_client.scan(bytes, |frame| match frame.kind {
            HEADERS if frame.stream > *last => {
                *last = frame.stream;
                open.insert(frame.stream);
            }
            RST_STREAM => {
                open.remove(&frame.stream);
            }
            _ => {}
        });
    }

    /// Takes note of bytes the server wrote to the client.
    pub(crate) fn server_sent(&mut self, bytes: &[u8]) {
        let open = &mut self.open;
        self.from_server.scan(bytes, |frame| match frame.kind {
            DATA | HEADERS if frame.flags & END_STREAM != 0 => {
                open.remove(&frame.stream);
            }
            RST_STREAM => {
                open.remove(&frame.stream);
            }
            _ => {}
        });
    }

    /// Whether every stream the client started has been ended.
    pub(crate) fn none_open(&self) -> bool {
        self.open.is_empty()
    }
}

/// One frame header.
#[derive(Clone, Copy, Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
}

/// Finds the frame headers in one direction's bytes, however they are split.
#[derive(Debug)]
struct FrameHeaders {
    /// Bytes still to pass over: the preface, or the current frame's payload.
    skip: usize,
    header: [u8; HEADER_LEN],
    have: usize,
}

impl FrameHeaders {
    fn after(skip: usize) -> Self {
        FrameHeaders { skip, header: [0; HEADER_LEN], have: 0 }
    }

    fn scan(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(Frame)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == HEADER_LEN {
                let h = self.header;
                self.have = 0;
                self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                on_frame(Frame { kind: h[3], flags: h[4], stream });
            }
        }
    }
}

/// An HTTP/2 frame: header and payload (for tests here and in `serving`).
#[cfg(test)]
pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A client's preface and the HEADERS that start `stream` (for tests).
#[cfg(test)]
pub(crate) fn client_start(stream: u32) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    // HPACK: :method GET, :scheme http, :path / (static table entries).
    out.extend(frame(HEADERS, 0x4, stream, &[0x82, 0x86, 0x84]));
    out
}

/// The server's DATA ending `stream` (for tests).
#[cfg(test)]
pub(crate) fn server_end(stream: u32) -> Vec<u8> {
    frame(DATA, END_STREAM, stream, b"answer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_open_from_the_clients_headers_until_the_server_ends_it() {
        let mut streams = OpenStreams::default();
        assert!(streams.none_open());
        streams.client_sent(&client_start(1));
        assert!(!streams.none_open());
        // The answer's headers and a DATA frame without END_STREAM: still open (e.g. the rest
        // is held back by flow control).
        streams.server_sent(&frame(HEADERS, 0x4, 1, b"hpack"));
        streams.server_sent(&frame(DATA, 0, 1, b"part"));
        assert!(!streams.none_open());
        // Trailers end it.
        streams.server_sent(&frame(HEADERS, 0x4 | END_STREAM, 1, b"trailers"));
        assert!(streams.none_open());
        // Client trailers on an earlier stream start nothing; a new stream does.
        streams.client_sent(&frame(HEADERS, END_STREAM, 1, b""));
        assert!(streams.none_open());
        streams.client_sent(&frame(HEADERS, 0x4, 3, b"hpack"));
        assert!(!streams.none_open());
        streams.client_sent(&frame(RST_STREAM, 0, 3, &[0, 0, 0, 8]));
        assert!(streams.none_open(), "the client reset it");
        streams.client_sent(&frame(HEADERS, 0x4, 5, b"hpack"));
        streams.server_sent(&frame(RST_STREAM, 0, 5, &[0, 0, 0, 7]));
        assert!(streams.none_open(), "the server refused it");
    }

    #[test]
    fn frames_split_anywhere_are_found() {
        let mut client = client_start(1);
        client.extend(frame(HEADERS, 0x4, 3, &[0; 300]));
        let mut server = frame(0x4, 0, 0, &[0; 18]); // SETTINGS
        server.extend(server_end(1));
        server.extend(frame(DATA, 0, 3, &[END_STREAM; 40])); // payload bytes are not headers
        for chunk in [1, 2, 5, 9, 10, 1000] {
            let mut streams = OpenStreams::default();
            client.chunks(chunk).for_each(|c| streams.client_sent(c));
            server.chunks(chunk).for_each(|c| streams.server_sent(c));
            assert_eq!(streams.open.iter().copied().collect::<Vec<_>>(), [3], "chunks of {chunk}");
        }
    }
}
