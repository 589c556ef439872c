//! What the kubelet's grpc-go client really sends: it dials the registration
//! socket with a passthrough target, so its `:authority` is the
//! percent-encoded socket path, which h2's server alone resets with
//! PROTOCOL_ERROR. The plugin must answer it on every kind of listener,
//! registration and DRA alike (`interop.rs` makes the same point with live
//! grpc-go and C-core clients).
//!
//! - The captured bytes of a kubelet-like registration (GetInfo +
//!   NotifyRegistrationStatus on one connection, see `data/README.md`) are
//!   replayed over a Unix socket and over connection streams.
//! - The kubelet-like grpc-go client in `kubelet-plugin/tests/clients/go-client/` registers for real; this
//!   test needs `go` on PATH.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{collections::BTreeMap, sync::Arc};

use crate::common::*;
use futures::StreamExt as _;
use harness::{
    calls::Method,
    grpc::registration::PluginInfo,
    plugin::{KubeletPlugin, Listener, MemoryClaims, PluginConfig, PluginListeners},
};
use prost::Message as _;
use rstest::rstest;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::UnixStream,
    process::Command,
};

/// Client→server bytes of grpc-go 1.82.1 registering like the kubelet.
const VECTOR: &[u8] =
    include_bytes!("../../../kubelet-plugin/tests/data/grpc-go-1.82.1-kubelet-registration.c2s.bin");

/// What the server sent on one stream.
#[derive(Debug, Default)]
struct Reply {
    /// Header and trailer fields, in order.
    fields: Vec<(String, String)>,
    data: Vec<u8>,
    reset: Option<u32>,
    ended: bool,
}

impl Reply {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Reads server frames, decoding header blocks with one HPACK decoder.
#[derive(Default)]
struct ServerFrames {
    buf: Vec<u8>,
    decoder: loona_hpack::Decoder<'static>,
    block: Option<(u32, bool, Vec<u8>)>,
    replies: BTreeMap<u32, Reply>,
}

impl ServerFrames {
    fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        loop {
            if self.buf.len() < 9 {
                return;
            }
            let len =
                usize::from(self.buf[0]) << 16 | usize::from(self.buf[1]) << 8 | usize::from(self.buf[2]);
            if self.buf.len() < 9 + len {
                return;
            }
            let (ty, flags) = (self.buf[3], self.buf[4]);
            let stream = u32::from_be_bytes(self.buf[5..9].try_into().unwrap()) & 0x7fff_ffff;
            let payload: Vec<u8> = self.buf.drain(..9 + len).skip(9).collect();
            self.frame(ty, flags, stream, payload);
        }
    }

    fn frame(&mut self, ty: u8, flags: u8, stream: u32, payload: Vec<u8>) {
        const END_STREAM: u8 = 0x1;
        const END_HEADERS: u8 = 0x4;
        match ty {
            // DATA (the server does not pad).
            0x0 => {
                let reply = self.replies.entry(stream).or_default();
                reply.data.extend(payload);
                reply.ended |= flags & END_STREAM != 0;
            }
            // HEADERS (no padding or priority from the server) and CONTINUATION.
            0x1 | 0x9 => {
                let (_, _, block) = self.block.get_or_insert((stream, flags & END_STREAM != 0, Vec::new()));
                block.extend(payload);
                if flags & END_HEADERS != 0 {
                    let (stream, end_stream, block) = self.block.take().unwrap();
                    let fields = self.decoder.decode(&block).unwrap();
                    let reply = self.replies.entry(stream).or_default();
                    reply.fields.extend(
                        fields
                            .into_iter()
                            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())),
                    );
                    reply.ended |= end_stream;
                }
            }
            // RST_STREAM.
            0x3 => {
                let reply = self.replies.entry(stream).or_default();
                reply.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                reply.ended = true;
            }
            _ => {}
        }
    }

    fn ended(&self, stream: u32) -> bool {
        self.replies.get(&stream).is_some_and(|r| r.ended)
    }
}

/// Sends the captured client bytes and reads until both calls are answered.
async fn replay(mut io: impl AsyncRead + AsyncWrite + Unpin) -> BTreeMap<u32, Reply> {
    io.write_all(VECTOR).await.unwrap();
    let mut frames = ServerFrames::default();
    let mut buf = vec![0; 16 * 1024];
    within("the replies to the replayed calls", async {
        while !(frames.ended(1) && frames.ended(3)) {
            let n = io.read(&mut buf).await.unwrap();
            assert!(n > 0, "the server closed the connection; replies so far: {:?}", frames.replies);
            frames.feed(&buf[..n]);
        }
    })
    .await;
    frames.replies
}

/// Asserts that both replayed calls succeeded and GetInfo described `plugin`.
async fn assert_registered(replies: &BTreeMap<u32, Reply>, plugin: &KubeletPlugin, endpoint: &str) {
    for (stream, method) in [(1, "GetInfo"), (3, "NotifyRegistrationStatus")] {
        let reply = &replies[&stream];
        assert_eq!(reply.reset, None, "{method} was reset (PROTOCOL_ERROR is 1): {reply:?}");
        assert_eq!(reply.field(":status"), Some("200"), "{method}: {reply:?}");
        assert_eq!(reply.field("grpc-status"), Some("0"), "{method}: {reply:?}");
    }
    // One length-prefixed, uncompressed gRPC message.
    let data = &replies[&1].data;
    assert_eq!(data[0], 0);
    assert_eq!(u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize, data.len() - 5);
    let info = PluginInfo::decode(&data[5..]).unwrap();
    assert_eq!(
        (info.r#type.as_str(), info.name.as_str(), info.endpoint.as_str()),
        ("DRAPlugin", DRIVER, endpoint)
    );

    within("registration", plugin.wait_registered(TIMEOUT)).await.unwrap();
    assert_eq!(plugin.calls().count(Method::GetInfo), 1);
    assert_eq!(plugin.calls().count(Method::NotifyRegistrationStatus), 1);
}

#[derive(Debug, Clone, Copy)]
enum Via {
    UnixSocket,
    Channel,
    Connections,
}

#[rstest]
#[case::unix_socket(Via::UnixSocket)]
#[case::channel(Via::Channel)]
#[case::connections(Via::Connections)]
#[tokio::test]
async fn replayed_kubelet_registration_is_answered(#[case] via: Via) {
    let p = paths();
    let (client, server) = tokio::io::duplex(64 * 1024);
    // Kept until the end: with all senders gone the server stops accepting.
    let (sender, channel) = Listener::channel(1);
    let registration = match via {
        Via::UnixSocket => Listener::unix(&p.reg_socket),
        Via::Channel => {
            sender.send(server).await.unwrap();
            channel
        }
        Via::Connections => Listener::connections(
            futures::stream::iter([Ok::<_, std::io::Error>(server)]).chain(futures::stream::pending()),
        ),
    };
    let plugin = KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir))
        .claim_source(Arc::new(MemoryClaims::new()))
        .start(PluginListeners { registration, dra: Listener::unix(&p.dra_socket) })
        .await
        .unwrap();
    let endpoint = p.dra_socket.display().to_string();

    let replies = match via {
        Via::UnixSocket => replay(UnixStream::connect(&p.reg_socket).await.unwrap()).await,
        Via::Channel | Via::Connections => replay(client).await,
    };
    assert_registered(&replies, &plugin, &endpoint).await;
    plugin.stop().await;
}

/// The DRA listener answers the percent-encoded `:authority` too
/// (UNIMPLEMENTED: the DRA server has no registration service), as grpc-go's
/// server does, whatever the kubelet's version.
#[tokio::test]
async fn dra_listener_answers_a_percent_encoded_authority() {
    let p = paths();
    let (sender, dra) = Listener::channel(1);
    let (client, server) = tokio::io::duplex(64 * 1024);
    sender.send(server).await.unwrap();
    let plugin =
        KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir).dra_endpoint("/dra.sock"))
            .claim_source(Arc::new(MemoryClaims::new()))
            .start(PluginListeners { registration: Listener::unix(&p.reg_socket), dra })
            .await
            .unwrap();

    let replies = replay(client).await;
    for stream in [1, 3] {
        let reply = &replies[&stream];
        assert_eq!(reply.reset, None, "stream {stream}: {reply:?}");
        assert_eq!(reply.field(":status"), Some("200"), "stream {stream}: {reply:?}");
        assert_eq!(reply.field("grpc-status"), Some("12"), "stream {stream}: {reply:?}");
    }
    plugin.stop().await;
    drop(sender);
}

#[tokio::test]
async fn grpc_go_client_dialing_like_the_kubelet_registers() {
    let client = crate::clients::go_client().await;

    let t = TestPlugin::start(Arc::new(MemoryClaims::new()), Arc::new(CountingFiles::default()), |c| c).await;
    // An absolute path: grpc-go sends it percent-encoded as :authority.
    assert!(t.reg_socket.is_absolute());
    let run = Command::new(&client).arg(&t.reg_socket).kill_on_drop(true).output();
    let out = within("the grpc-go client", run).await.unwrap();
    assert!(
        out.status.success(),
        "the grpc-go client failed to register ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(info["name"], DRIVER);
    assert_eq!(info["endpoint"], t.dra_socket.display().to_string());
    assert_eq!(info["supported_versions"][0], "v1.DRAPlugin");

    within("registration", t.plugin.wait_registered(TIMEOUT)).await.unwrap();
    assert_eq!(t.plugin.calls().count(Method::GetInfo), 1);
    assert_eq!(t.plugin.calls().count(Method::NotifyRegistrationStatus), 1);
    t.plugin.stop().await;
}
