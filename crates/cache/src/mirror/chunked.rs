//! One attempt at copying a file of more than one chunk (or a complete small file being
//! resumed): its missing chunks all in flight together within the chunk memory budget,
//! each written with `pwrite` on the background threads (within the write queue's budget)
//! and handed to the syncer; then verification and metadata.
//!
//! Invariant: the bytes an attempt counted as done are taken back from the progress when
//! the attempt does not end in [`FileOutcome::Done`], so the next attempt counts anew.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use ferry_proto::Attr;

use super::fetch::{fetch_chunk, ChunkError};
use super::file::{open_local, FileOutcome};
use super::metadata::set_metadata;
use super::small::copy_small_file;
use super::verify;
use super::{remote_path, Ctx, UNIT};
use crate::background;
use ferry_client::SmallFile;

pub(super) async fn copy_file_once(
    ctx: &Arc<Ctx>,
    rel: &Bytes,
    attr: &Attr,
    listed: Option<SmallFile>,
) -> std::io::Result<FileOutcome> {
    let cs = ctx.client.session().chunk_size;
    let version = attr.version();
    if attr.size > 0 && attr.size <= u64::from(cs) {
        // A small file already complete (verified or not) takes the general path, which
        // resumes it without fetching it again.
        let complete = ctx
            .cache
            .state(rel)
            .is_some_and(|s| s.version == version && s.complete());
        if !complete {
            return copy_small_file(ctx, rel, attr, listed).await;
        }
    }
    let (file, generation, resumed) = {
        let cache = ctx.cache.clone();
        let (r, a) = (rel.clone(), *attr);
        background::run(move || open_local(&cache, &r, &a, cs)).await??
    };
    let file = Arc::new(file);
    let st = ctx.cache.state(rel).filter(|s| s.generation == generation);
    let already = st.as_ref().map_or(0, |s| s.present_bytes());
    ctx.progress
        .bytes_done
        .fetch_add(already, Ordering::Relaxed);
    let mut done_here = already;
    if resumed
        && st
            .as_ref()
            .is_some_and(|s| s.complete() && s.verified.is_some())
    {
        // Complete and verified by an earlier run: only the metadata may need setting.
        let (local, a) = (ctx.cache.local_path(rel), *attr);
        background::run(move || set_metadata(&local, &a, true)).await??;
        return Ok(FileOutcome::Done);
    }
    let missing: Vec<u64> = match &st {
        Some(s) => s.missing().collect(),
        None => Vec::new(),
    };
    let remote = remote_path(&ctx.root, rel);
    let mut tasks = tokio::task::JoinSet::new();
    let mut early = Vec::new();
    for index in missing {
        let offset = index * u64::from(cs);
        let len = (attr.size - offset).min(u64::from(cs)) as usize;
        let units = (len.div_ceil(UNIT).max(1) as u32).min(ctx.total_units);
        let Ok(permit) = ctx.chunk_units.clone().acquire_many_owned(units).await else {
            break;
        };
        // Recorded meanwhile by someone else (a reader of the mount this mirror runs in).
        if ctx
            .cache
            .state(rel)
            .is_some_and(|s| s.generation == generation && s.has(index))
        {
            done_here += len as u64;
            ctx.progress
                .bytes_done
                .fetch_add(len as u64, Ordering::Relaxed);
            continue;
        }
        let c = ctx.clone();
        let (remote, rel, file) = (remote.clone(), rel.clone(), file.clone());
        tasks.spawn(async move {
            let r = fetch_chunk(&c, &remote, offset, len as u32, version).await;
            let r = match r {
                Ok((data, file_hash)) => {
                    let n = data.len() as u64;
                    let f = file.clone();
                    let w = write_queued(&c, data.len(), move || {
                        ferry_util::direct::write_all_at(&f, &data, offset)
                    })
                    .await;
                    match w {
                        Ok(()) => {
                            c.sync.written(rel, version, generation, index, file);
                            c.progress.bytes_done.fetch_add(n, Ordering::Relaxed);
                            Ok((n, file_hash))
                        }
                        Err(e) => Err(ChunkError::Io(e)),
                    }
                }
                Err(e) => Err(e),
            };
            drop(permit);
            r
        });
        // Stop early when a chunk already found the file changed or failing (its result is
        // kept and handled with the others).
        if let Some(r) = tasks.try_join_next() {
            let failed = !matches!(r, Ok(Ok(_)));
            early.push(r);
            if failed {
                break;
            }
        }
    }
    let mut outcome: Option<std::io::Result<FileOutcome>> = None;
    // The server's BLAKE3 of the whole file, when one read returned all of it.
    let mut whole_file_hash = None;
    let mut early = early.into_iter();
    loop {
        let r = match early.next() {
            Some(r) => r,
            None => match tasks.join_next().await {
                Some(r) => r,
                None => break,
            },
        };
        match r {
            Ok(Ok((n, h))) => {
                done_here += n;
                whole_file_hash = whole_file_hash.or(h);
            }
            Ok(Err(ChunkError::Changed)) => {
                outcome.get_or_insert(Ok(FileOutcome::Changed(None)));
            }
            Ok(Err(ChunkError::Vanished)) => {
                outcome.get_or_insert(Ok(FileOutcome::Vanished));
            }
            Ok(Err(ChunkError::Remote(e))) => {
                outcome.get_or_insert(Err(std::io::Error::other(e.to_string())));
            }
            Ok(Err(ChunkError::Io(e))) => {
                outcome.get_or_insert(Err(std::io::Error::new(
                    e.kind(),
                    format!("writing the local copy: {e}"),
                )));
            }
            Err(e) => {
                outcome.get_or_insert(Err(std::io::Error::other(e)));
            }
        }
    }
    if let Some(o) = outcome {
        // What this attempt counted as done is taken back; the next attempt counts anew.
        ctx.progress
            .bytes_done
            .fetch_sub(done_here, Ordering::Relaxed);
        return o;
    }
    // Every chunk is written (and on its way to being recorded).
    if ctx.cfg.verify {
        let verdict = verify::written(ctx, rel, &remote, attr, generation, whole_file_hash);
        if let Some(o) = verdict.await.with_taken_back(ctx, done_here) {
            return o;
        }
    }
    let (local, a) = (ctx.cache.local_path(rel), *attr);
    background::run(move || set_metadata(&local, &a, true)).await??;
    Ok(FileOutcome::Done)
}

/// Runs `write` (of `len` bytes of a fetched chunk) on the background threads once the
/// write queue has room for it; its room is released when the write returned.
pub(super) async fn write_queued<T: Send + 'static>(
    ctx: &Ctx,
    len: usize,
    write: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let units = (len.div_ceil(UNIT).max(1) as u32).min(ctx.total_write_units);
    let _room = ctx
        .write_units
        .acquire_many(units)
        .await
        .map_err(std::io::Error::other)?;
    background::run(write).await?
}
