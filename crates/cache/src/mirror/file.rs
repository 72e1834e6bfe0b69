//! One regular file to completion: the attempts (a file that changes on the server starts
//! over at its new version, up to three times; a hash mismatch copies it again once), and
//! the local file each attempt writes into.
//!
//! Invariant: the local file is reused only when its state records the same remote version
//! and chunk size and its size is right, and it is opened together with its generation, so
//! a chunk written is never recorded for another start of the file.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use ferry_client::ClientError;
use ferry_proto::{Attr, FileKind, Status};
use tracing::info;

use super::chunked::copy_file_once;
use super::{remote_path, Ctx};
use crate::state::CacheDir;

#[derive(Debug)]
pub(super) enum FileOutcome {
    Done,
    /// The file changed on the server; its new attributes when known.
    Changed(Option<Attr>),
    /// The hash did not match: copy again from nothing.
    Mismatch,
    /// The file is gone from the server.
    Vanished,
}

/// Copies one regular file to completion (or records why not).
pub(super) async fn copy_file(
    ctx: &Arc<Ctx>,
    rel: Bytes,
    mut attr: Attr,
    mut listed: Option<ferry_client::SmallFile>,
) {
    let name = format!("/{}", String::from_utf8_lossy(&rel));
    // Started only when it fits on the disk beside the files in flight (else reported,
    // nothing written).
    let _room = match ctx.space.reserve(space_needed(ctx, &rel, &attr)).await {
        Ok(r) => r,
        Err(no) => {
            ctx.progress.error(format!(
                "{name}: not copied: it needs {} and {} is free on {} (free some space and run again)",
                ferry_util::human::human_bytes(no.need),
                ferry_util::human::human_bytes(no.avail),
                ctx.cache.root().display()
            ));
            return;
        }
    };
    let mut counted_total = attr.size;
    for attempt in 0..4 {
        if attempt > 0 && attr.size != counted_total {
            // Totals follow the file's new size.
            ctx.progress
                .bytes_total
                .fetch_add(attr.size, Ordering::Relaxed);
            ctx.progress
                .bytes_total
                .fetch_sub(counted_total, Ordering::Relaxed);
            counted_total = attr.size;
        }
        match copy_file_once(ctx, &rel, &attr, listed.take()).await {
            Ok(FileOutcome::Done) => {
                ctx.progress.files_done.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(FileOutcome::Vanished) => {
                info!("{name} vanished from the server during the mirror");
                ctx.progress.files_total.fetch_sub(1, Ordering::Relaxed);
                ctx.progress
                    .bytes_total
                    .fetch_sub(counted_total, Ordering::Relaxed);
                ctx.sync.flush().await;
                ctx.cache.forget(&rel);
                let local = ctx.cache.local_path(&rel);
                let _ = crate::background::run(move || std::fs::remove_file(local)).await;
                return;
            }
            Ok(FileOutcome::Changed(new)) => {
                ctx.progress.files_changed.fetch_add(1, Ordering::Relaxed);
                info!("{name} changed on the server during the copy: copying the new version");
                attr = match new {
                    Some(a) => a,
                    None => match ctx.client.stat(remote_path(&ctx.root, &rel)).await {
                        Ok(a) if a.kind == FileKind::File => a,
                        Ok(_) => {
                            ctx.progress
                                .error(format!("{name} is no longer a regular file on the server"));
                            return;
                        }
                        Err(ClientError::Remote {
                            status: Status::NotFound,
                            ..
                        }) => {
                            ctx.progress.files_total.fetch_sub(1, Ordering::Relaxed);
                            ctx.progress
                                .bytes_total
                                .fetch_sub(counted_total, Ordering::Relaxed);
                            return;
                        }
                        Err(e) => {
                            ctx.progress.error(format!("{name}: {e}"));
                            return;
                        }
                    },
                };
            }
            Ok(FileOutcome::Mismatch) => {
                ctx.progress.hash_mismatches.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "{name}: the copy's BLAKE3 differs from the server's: fetching it again"
                );
                // Pending records of the bad copy land before it is reset.
                ctx.sync.flush().await;
                ctx.cache.forget(&rel);
            }
            Err(e) => {
                ctx.progress.error(format!("{name}: {e}"));
                return;
            }
        }
    }
    ctx.progress.error(format!(
        "{name}: kept changing or failing verification; giving up for this run"
    ));
}

/// The bytes copying `rel` at `attr` will allocate: what the server's file allocates (at
/// most its size rounded up to a block; a sparse file needs its data only), less the chunks
/// the copy holds of that version already (a resume).
fn space_needed(ctx: &Ctx, rel: &Bytes, attr: &Attr) -> u64 {
    let block = 4096;
    let alloc = attr
        .size
        .div_ceil(block)
        .saturating_mul(block)
        .min(attr.blocks.saturating_mul(512).max(attr.size.min(block)));
    let held = ctx
        .cache
        .state(rel)
        .filter(|s| s.version == attr.version())
        .map_or(0, |s| s.present_bytes());
    alloc.saturating_sub(held)
}

/// Opens the local file for `rel` at `attr`'s version: reuses it when the state says it
/// holds (parts of) that version and its size is right, else creates it empty at the
/// right size (sparse). Returns the file, its generation and whether the existing state
/// applies.
pub(super) fn open_local(
    cache: &CacheDir,
    rel: &Bytes,
    attr: &Attr,
    chunk_size: u32,
) -> std::io::Result<(File, u64, bool)> {
    let local = cache.local_path(rel);
    let version = attr.version();
    let st = cache.state(rel);
    if let Ok(m) = std::fs::symlink_metadata(&local) {
        if m.is_dir() {
            return Err(std::io::Error::other(
                "a local directory is where the server has a file; move it away",
            ));
        }
        if m.is_file()
            && m.len() == attr.size
            && st
                .as_ref()
                .is_some_and(|s| s.version == version && s.chunk_size == chunk_size)
        {
            // The same state after the open: the file is the inode the state describes.
            if let Some((f, now)) = cache.open_current(rel, true)? {
                if now.version == version && now.chunk_size == chunk_size {
                    return Ok((f, now.generation, true));
                }
            }
        }
    }
    let (f, generation) = cache.restart_file(rel, version, chunk_size)?;
    Ok((f, generation, false))
}
