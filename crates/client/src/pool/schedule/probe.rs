//! The prober: round-trip samples while background work is in flight.
//!
//! A quiet link gives no samples, and background reads are too big to be samples
//! themselves; so while background requests are in flight, a Ping goes on the
//! least-loaded stream every clamp(2 × base, 1 ms, 100 ms) (one at a time), and its round
//! trip feeds the delay controller. ferryd answers Pings at demand priority, so a probe
//! sees the queue a demand read would see. At start, a few Pings on the idle link give the
//! base round trip before the mirror loads the link. Every `cpu::INTERVAL` while background
//! work is in flight and a reader read recently it also samples how long the process's
//! foreground threads waited for a CPU, for the CPU pace (`cpu.rs`).
//!
//! With an S3 source a probe is a HEAD of the bucket, which the store serves like any request:
//! probes are then at least 10 ms apart.
//!
//! Invariant: the task holds the pool only weakly between probes, so it ends when the
//! pool is dropped; a probe never takes the place of a request (it is sent only when its
//! stream has a free request slot) and never counts as reader activity.

use std::sync::Weak;
use std::time::Duration;

use ferry_proto::Request;
use tokio::sync::oneshot;

use super::super::conn::Outgoing;
use super::super::Inner;

/// Pings sent at start, one after the other, on the idle link.
const START_PINGS: usize = 3;
/// The shortest pause between probes of an S3 source.
const S3_PROBE_FLOOR: Duration = Duration::from_millis(10);
/// While no background work is in flight, how often the prober checks whether the pool
/// is still there.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Runs the prober of a pool until the pool is dropped.
pub(in crate::pool) async fn run(inner: Weak<Inner>) {
    let mut cpu_sampled: Option<tokio::time::Instant> = None;
    let mut waits = super::cpu::WaitSampler::default();
    for _ in 0..START_PINGS {
        if probe(&inner).await.is_none() {
            break;
        }
    }
    loop {
        let Some(i) = inner.upgrade() else { return };
        if i.schedule.window.in_flight() == 0 {
            let busy = i.schedule.window.busy.clone();
            drop(i);
            // Woken when background work starts (a wake-up given meanwhile is kept).
            let _ = tokio::time::timeout(IDLE_CHECK, busy.notified()).await;
            continue;
        }
        let interval = i.schedule.probe_interval();
        // A probe of an S3 store is an HTTP request the store serves (a HEAD of the bucket):
        // at most one per S3_PROBE_FLOOR.
        let interval = if i.s3.is_some() {
            interval.max(S3_PROBE_FLOOR)
        } else {
            interval
        };
        if cpu_sampled.is_none_or(|t| t.elapsed() >= super::cpu::INTERVAL)
            && i.schedule.wants_cpu_samples()
        {
            cpu_sampled = Some(tokio::time::Instant::now());
            if let Some(waited) = waits.sample() {
                i.schedule.on_cpu_sample(waited);
            }
        }
        drop(i);
        tokio::time::sleep(interval).await;
        if probe(&inner).await.is_none() {
            // No stream connected, or none with a free slot: try again after a while.
            tokio::time::sleep(interval.max(Duration::from_millis(10))).await;
        }
    }
}

/// Sends one Ping on the least-loaded stream and feeds its round trip to the controller.
/// `None` when the pool is gone or no Ping could be sent or answered.
async fn probe(inner: &Weak<Inner>) -> Option<()> {
    let rtt = aside(inner, Request::Ping, true).await?.rtt?;
    inner
        .upgrade()?
        .schedule
        .on_sample(super::Sample::Probe, rtt);
    Some(())
}

/// Sends `request` on the least-loaded stream beside the scheduler: it is no reader's
/// request, so it neither makes readers active nor counts as demand in flight (which would
/// defer background work), and it takes a request slot only if one is free. `None` when
/// the pool is gone, no slot is free or no answer came.
pub(in crate::pool) async fn aside(
    inner: &Weak<Inner>,
    request: Request,
    timed: bool,
) -> Option<crate::pool::conn::Answer> {
    let conn = {
        let i = inner.upgrade()?;
        let (_, conn) = i.schedule.pick().ok()?;
        conn
    };
    let _permit = conn.inflight.clone().try_acquire_owned().ok()?;
    let (reply, answer) = oneshot::channel();
    conn.tx
        .send(Outgoing {
            request,
            reply,
            timed,
        })
        .await
        .ok()?;
    answer.await.ok()?.ok()
}
