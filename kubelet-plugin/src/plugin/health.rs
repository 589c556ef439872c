//! Device health reporting (`DRAResourceHealth` v1alpha1 and v1).
//!
//! Tests set a device's health through [`HealthState::set`]; every open
//! `NodeWatchResources` stream then sends the complete list of devices
//! (sorted by pool, then device). A stream also sends the list right after it
//! opens and, if configured, again at a fixed interval, because the kubelet
//! considers reports stale after its health timeout.

use std::{
    collections::BTreeMap,
    pin::Pin,
    time::{Duration, SystemTime},
};

use futures::Stream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::grpc::{health_v1, health_v1alpha1};

/// Health of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Health {
    /// Not known (also what the kubelet assumes for stale reports).
    Unknown,
    /// Working.
    Healthy,
    /// Broken.
    Unhealthy,
}

/// The reported state of one device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceHealth {
    /// Pool name.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Health.
    pub health: Health,
    /// Free-form message (the kubelet truncates beyond 1024 characters).
    pub message: String,
}

type Devices = BTreeMap<(String, String), DeviceHealth>;

/// The device health a plugin reports. Cheap to clone; clones share state.
#[derive(Clone, Debug)]
pub struct HealthState {
    devices: watch::Sender<Devices>,
}

impl Default for HealthState {
    fn default() -> Self {
        HealthState { devices: watch::Sender::new(Devices::new()) }
    }
}

impl HealthState {
    /// No devices.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the health and message of a device (adding it if new) and sends a
    /// new snapshot on every open stream.
    pub fn set(&self, pool: &str, device: &str, health: Health, message: impl Into<String>) {
        let entry = DeviceHealth {
            pool: pool.to_string(),
            device: device.to_string(),
            health,
            message: message.into(),
        };
        tracing::debug!(?entry, "device health changed");
        self.devices.send_modify(|devices| {
            devices.insert((entry.pool.clone(), entry.device.clone()), entry);
        });
    }

    /// Stops reporting a device.
    pub fn remove(&self, pool: &str, device: &str) {
        self.devices
            .send_if_modified(|devices| devices.remove(&(pool.to_string(), device.to_string())).is_some());
    }

    /// All devices, sorted by pool, then device.
    pub fn snapshot(&self) -> Vec<DeviceHealth> {
        self.devices.borrow().values().cloned().collect()
    }

    fn subscribe(&self) -> watch::Receiver<Devices> {
        self.devices.subscribe()
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// A stream of snapshots: one at once, then on every change and every
/// `resend` interval, until `stop` is cancelled or the state is dropped.
fn snapshots(
    health: &HealthState,
    resend: Option<Duration>,
    stop: CancellationToken,
) -> impl Stream<Item = Vec<DeviceHealth>> + Send + 'static {
    struct S {
        rx: watch::Receiver<Devices>,
        resend: Option<tokio::time::Interval>,
        stop: CancellationToken,
        first: bool,
    }
    let state = S {
        rx: health.subscribe(),
        resend: resend.map(|period| {
            let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        }),
        stop,
        first: true,
    };
    futures::stream::unfold(state, |mut s| async move {
        if !s.first {
            let resend = async {
                match s.resend.as_mut() {
                    Some(interval) => {
                        interval.tick().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = s.stop.cancelled() => return None,
                changed = s.rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                () = resend => {}
            }
        }
        s.first = false;
        let snapshot: Vec<DeviceHealth> = s.rx.borrow_and_update().values().cloned().collect();
        Some((snapshot, s))
    })
}

type HealthStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// `DRAResourceHealth` v1 server.
#[derive(Clone, Debug)]
pub(crate) struct HealthV1 {
    pub health: HealthState,
    pub resend: Option<Duration>,
    pub stop: CancellationToken,
}

/// `DRAResourceHealth` v1alpha1 server.
#[derive(Clone, Debug)]
pub(crate) struct HealthV1alpha1(pub HealthV1);

macro_rules! to_response {
    ($api:ident, $devices:expr) => {{
        let now = now_unix();
        $api::NodeWatchResourcesResponse {
            devices: $devices
                .into_iter()
                .map(|d| $api::DeviceHealth {
                    device: Some($api::DeviceIdentifier { pool_name: d.pool, device_name: d.device }),
                    health: match d.health {
                        Health::Unknown => $api::HealthStatus::Unknown,
                        Health::Healthy => $api::HealthStatus::Healthy,
                        Health::Unhealthy => $api::HealthStatus::Unhealthy,
                    } as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: 0,
                    message: d.message,
                })
                .collect(),
        }
    }};
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for HealthV1 {
    type NodeWatchResourcesStream = HealthStream<health_v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use futures::StreamExt as _;
        let stream = snapshots(&self.health, self.resend, self.stop.clone())
            .map(|devices| Ok(to_response!(health_v1, devices)));
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for HealthV1alpha1 {
    type NodeWatchResourcesStream = HealthStream<health_v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use futures::StreamExt as _;
        let stream = snapshots(&self.0.health, self.0.resend, self.0.stop.clone())
            .map(|devices| Ok(to_response!(health_v1alpha1, devices)));
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;

    #[tokio::test]
    async fn snapshot_now_and_on_change_sorted() {
        let health = HealthState::new();
        health.set("p2", "a", Health::Healthy, "");
        health.set("p1", "b", Health::Healthy, "");
        let stop = CancellationToken::new();
        let mut stream = Box::pin(snapshots(&health, None, stop.clone()));
        let first = stream.next().await.unwrap();
        let names: Vec<_> = first.iter().map(|d| (d.pool.as_str(), d.device.as_str())).collect();
        assert_eq!(names, [("p1", "b"), ("p2", "a")]);
        health.set("p1", "b", Health::Unhealthy, "broken");
        let second = stream.next().await.unwrap();
        assert_eq!(second[0].health, Health::Unhealthy);
        assert_eq!(second[0].message, "broken");
        stop.cancel();
        assert!(stream.next().await.is_none());
    }
}
