//! Reconnecting: a supervisor task re-establishes each stream whose connection ended.
//!
//! A reader that ends reports its slot number; the supervisor starts one reconnect task
//! per slot (a flag keeps it to one), which retries with a backoff from 50 ms doubling to
//! 2 s, and says so once per outage at warn level. A new connection is adopted only if it
//! reaches a server the pool can keep using: the same chunk size and features (otherwise
//! the mount must be remounted), and either the same server instance as the other live
//! streams or — when none is left — a new instance, which counts as a server restart
//! (every read then checks its file's version). Requests waiting meanwhile are retried by
//! [`super::Client::call`] once a stream is back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::conn::start_conn;
use super::handshake::{open_stream, Opened};
use super::Inner;

/// Why a new connection was not adopted.
#[derive(Debug, thiserror::Error)]
pub(super) enum AdoptError {
    /// The server's session parameters changed.
    #[error("the server now runs with other settings (chunk size {chunk_size}, features {features:#x}; this mount has {mount_chunk_size} and {mount_features:#x}): remount")]
    Settings {
        chunk_size: u32,
        features: u64,
        mount_chunk_size: u32,
        mount_features: u64,
    },
    /// Another server process than the one the live streams reach.
    #[error("reached another server instance than the other streams (a load balancer?)")]
    OtherInstance,
}

/// Re-establishes the connections of slots whose connection ended.
pub(super) async fn supervise(inner: Weak<Inner>, mut dead: mpsc::UnboundedReceiver<usize>) {
    while let Some(slot) = dead.recv().await {
        let Some(i) = inner.upgrade() else { return };
        if i.schedule.slots()[slot]
            .reconnecting
            .swap(true, Ordering::AcqRel)
        {
            continue;
        }
        debug!("stream {slot} closed; reconnecting");
        tokio::spawn(reconnect(inner.clone(), slot));
    }
}

async fn reconnect(inner: Weak<Inner>, slot: usize) {
    let mut delay = Duration::from_millis(50);
    let mut attempts = 0u32;
    loop {
        tokio::time::sleep(delay).await;
        let Some((config, s3)) = inner.upgrade().map(|i| (i.config.clone(), i.s3.clone())) else {
            return;
        };
        if let Some(source) = s3 {
            // An S3 gateway: adopted again once it answers a probe.
            let endpoint = slot % source.endpoints();
            let r = tokio::time::timeout(config.connect_timeout, source.probe(endpoint)).await;
            let Some(i) = inner.upgrade() else { return };
            attempts += 1;
            match r {
                Ok(Ok(())) => {
                    let conn = super::s3conn::start_s3_conn(source, endpoint, slot, i.dead.clone());
                    let s = &i.schedule.slots()[slot];
                    *s.conn.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(conn);
                    s.reconnecting.store(false, Ordering::Release);
                    i.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                    info!("stream {slot} reconnected to {}", config.addr);
                    i.changed.notify_waiters();
                    return;
                }
                Ok(Err(why)) if attempts == 3 => {
                    warn!(
                        "cannot reach S3 endpoint {endpoint} of {}: {why}; still trying",
                        config.addr
                    );
                }
                Ok(Err(why)) => debug!("reconnect of stream {slot}: {why}"),
                Err(_) => debug!("reconnect of stream {slot}: no answer"),
            }
            delay = (delay * 2).min(Duration::from_secs(2));
            continue;
        }
        let r = tokio::time::timeout(config.connect_timeout, open_stream(&config)).await;
        let Some(i) = inner.upgrade() else { return };
        attempts += 1;
        let s = &i.schedule.slots()[slot];
        let why = match r {
            Ok(Ok(opened)) => match i.adopt(slot, opened) {
                Ok(()) => {
                    s.reconnecting.store(false, Ordering::Release);
                    i.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                    info!("stream {slot} reconnected to {}", config.addr);
                    i.changed.notify_waiters();
                    // Its end may have been reported while the flag was still set (and so
                    // ignored): then this task carries on.
                    if s.alive() || s.reconnecting.swap(true, Ordering::AcqRel) {
                        return;
                    }
                    "the new connection ended at once".to_string()
                }
                Err(why) => why.to_string(),
            },
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", config.connect_timeout),
        };
        // Said once per outage, not at every attempt.
        if attempts == 3 {
            warn!("cannot reconnect to {}: {why}; still trying", config.addr);
        } else {
            debug!("reconnect of stream {slot}: {why}");
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

impl Inner {
    /// Takes a newly opened connection into `slot`, if it reaches a server the pool can use.
    pub(super) fn adopt(&self, slot: usize, opened: Opened) -> Result<(), AdoptError> {
        let w = &opened.welcome;
        if w.chunk_size != self.session.chunk_size || w.features != self.session.features {
            return Err(AdoptError::Settings {
                chunk_size: w.chunk_size,
                features: w.features,
                mount_chunk_size: self.session.chunk_size,
                mount_features: self.session.features,
            });
        }
        {
            let mut instance = self.instance.lock().unwrap_or_else(|e| e.into_inner());
            if w.instance_id != *instance {
                let old_alive = self.schedule.slots().iter().any(|s| {
                    let c = s.current();
                    c.alive.load(Ordering::Relaxed) && c.instance_id == *instance
                });
                if old_alive {
                    return Err(AdoptError::OtherInstance);
                }
                *instance = w.instance_id;
                self.counters
                    .server_restarts
                    .fetch_add(1, Ordering::Relaxed);
                warn!(
                    "{} restarted (new server instance): reconnecting; every read checks the file's version",
                    self.config.addr
                );
            }
        }
        let conn = start_conn(
            opened,
            slot,
            self.dead.clone(),
            &self.config,
            self.counters.clone(),
        );
        *self.schedule.slots()[slot]
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(conn);
        Ok(())
    }
}
