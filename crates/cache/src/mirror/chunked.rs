//! One attempt at copying a file of more than one chunk (or a complete small file being
//! resumed): its missing chunks all in flight together within the chunk memory budget,
//! each written with `pwrite` on the background threads (within the write queue's budget)
//! and handed to the syncer; then verification and metadata. From a source that prefers
//! long reads (S3: [`ferry_client::Client::run_bytes`]) the missing chunks of one aligned
//! group go as one read, written at once and recorded chunk by chunk (`ferry mirror`; a
//! mount's background mirror keeps one read per chunk).
//!
//! Invariant: the bytes an attempt counted as done are taken back from the progress when
//! the attempt does not end in [`FileOutcome::Done`], so the next attempt counts anew.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use ferry_proto::Attr;

use super::fetch::{fetch_chunk, ChunkError};
use super::file::{open_local, FileOutcome};
use super::metadata::{local_stamp, set_metadata, stamp_of};
use super::small::copy_small_file;
use super::verify;
use super::{remote_path, Ctx, UNIT};
use crate::background;
use ferry_client::SmallFile;
use ferry_proto::extents::holds_data;
use ferry_util::sparse::{punch_hole, write_sparse};

pub(super) async fn copy_file_once(
    ctx: &Arc<Ctx>,
    rel: &Bytes,
    attr: &Attr,
    listed: Option<SmallFile>,
) -> std::io::Result<FileOutcome> {
    let cs = ctx.client.session().chunk_size;
    let version = attr.version();
    if adopt(ctx, rel, attr).await? {
        return Ok(FileOutcome::Done);
    }
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
    rebase_if_ctime_only(ctx, rel, attr).await?;
    let (file, generation, resumed) = {
        let cache = ctx.cache.clone();
        let (r, a) = (rel.clone(), *attr);
        background::run(move || open_local(&cache, &r, &a, cs)).await??
    };
    let file = Arc::new(file);
    let st = ctx.cache.state(rel).filter(|s| s.generation == generation);
    if resumed {
        if let Some(s) = st.as_ref().filter(|s| s.complete() && s.verified.is_some()) {
            // Complete and verified by an earlier run: kept as it is while the local file
            // still shows its stamp, else (or with --checksum) verified again first.
            return recheck_verified(ctx, rel, attr, s, &file).await;
        }
    }
    let already = st.as_ref().map_or(0, |s| s.present_bytes());
    ctx.progress
        .bytes_done
        .fetch_add(already, Ordering::Relaxed);
    let mut done_here = already;
    let missing: Vec<u64> = match &st {
        Some(s) => s.missing().collect(),
        None => Vec::new(),
    };
    let remote = remote_path(&ctx.root, rel);
    // A sparse file (fewer blocks allocated than its size): where it holds data, so its
    // holes are neither fetched nor written.
    let data_map = if attr.size > u64::from(cs)
        && attr.blocks.saturating_mul(512) < attr.size
        && !missing.is_empty()
    {
        match ctx.client.data_map(remote.clone()).await {
            Ok(Some((v, extents))) if v == version => Some(Arc::new(extents)),
            Ok(Some(_)) => {
                ctx.progress
                    .bytes_done
                    .fetch_sub(done_here, Ordering::Relaxed);
                return Ok(FileOutcome::Changed(None));
            }
            _ => None,
        }
    } else {
        None
    };
    // A large file's hashes are worked out while its chunks arrive (ferryd's asked for now,
    // the local copy's read back as its prefix grows), not both after the last: a fresh copy
    // of a file that is not sparse, from ferryd, by `ferry mirror` (a mount's background
    // mirror hashes only when readers let it).
    let alongside = (ctx.cfg.verify
        && already == 0
        && data_map.is_none()
        && attr.size >= verify::ALONGSIDE_MIN
        && !ferry_proto::extents::looks_sparse(attr.blocks.saturating_mul(512), attr.size)
        && ctx.client.s3().is_none()
        && !ctx.client.is_background())
    .then(|| {
        verify::Alongside::start(
            ctx,
            remote.clone(),
            ctx.cache.local_path(rel),
            attr.size,
            u64::from(cs),
        )
    });
    let tracker = alongside.as_ref().map(verify::Alongside::tracker);
    let mut tasks = tokio::task::JoinSet::new();
    let mut early = Vec::new();
    // From a source that prefers long reads (S3), the missing chunks of one aligned group
    // go as one read; else each chunk is a read of its own: from ferryd, in a sparse file,
    // and in a mount's background mirror (its reads are cut into pieces the scheduler sizes
    // for readers first, whole chunks at most, so a run would only hold its memory longer).
    let per = match (ctx.client.run_bytes(), &data_map) {
        (Some(run), None) if !ctx.client.is_background() => (run / u64::from(cs)).max(1),
        _ => 1,
    };
    let mut pending: std::collections::VecDeque<(u64, u64)> = runs_of(&missing, per).into();
    while let Some((first, count)) = pending.pop_front() {
        let offset = first * u64::from(cs);
        let len = (attr.size - offset).min(count * u64::from(cs)) as usize;
        if data_map
            .as_ref()
            .is_some_and(|m| !holds_data(m, offset, len as u64))
        {
            // All hole: nothing to fetch; the local range is made a hole too.
            let f = file.clone();
            background::run(move || punch_hole(&f, offset, len as u64)).await??;
            for index in first..first + count {
                ctx.sync
                    .written(rel.clone(), version, generation, index, file.clone());
            }
            done_here += len as u64;
            ctx.progress
                .bytes_done
                .fetch_add(len as u64, Ordering::Relaxed);
            continue;
        }
        let units = (len.div_ceil(UNIT).max(1) as u32).min(ctx.total_units);
        let Ok(permit) = ctx.chunk_units.clone().acquire_many_owned(units).await else {
            break;
        };
        // Recorded meanwhile by someone else (a reader of the mount this mirror runs in):
        // counted as done, and the rest of the run goes as the runs between them.
        let present: Vec<u64> = match ctx.cache.state(rel) {
            Some(s) if s.generation == generation => {
                (first..first + count).filter(|&i| s.has(i)).collect()
            }
            _ => Vec::new(),
        };
        if !present.is_empty() {
            drop(permit);
            for &index in &present {
                let n = (attr.size - index * u64::from(cs)).min(u64::from(cs));
                done_here += n;
                ctx.progress.bytes_done.fetch_add(n, Ordering::Relaxed);
            }
            let rest: Vec<u64> = (first..first + count)
                .filter(|i| !present.contains(i))
                .collect();
            for r in runs_of(&rest, per).into_iter().rev() {
                pending.push_front(r);
            }
            continue;
        }
        let c = ctx.clone();
        let (remote, rel, file) = (remote.clone(), rel.clone(), file.clone());
        let sparse = data_map.is_some();
        let tracker = tracker.clone();
        tasks.spawn(async move {
            let r = fetch_chunk(&c, &remote, offset, len as u32, version).await;
            let r = match r {
                Ok((data, file_hash)) => {
                    let n = data.len() as u64;
                    let f = file.clone();
                    let w = write_queued(&c, data.len(), move || {
                        if sparse {
                            write_sparse(&f, &data, offset)
                        } else {
                            ferry_util::direct::write_all_at(&f, &data, offset)
                        }
                    })
                    .await;
                    match w {
                        Ok(()) => {
                            for index in first..first + count {
                                c.sync.written(
                                    rel.clone(),
                                    version,
                                    generation,
                                    index,
                                    file.clone(),
                                );
                            }
                            c.progress.bytes_done.fetch_add(n, Ordering::Relaxed);
                            if let Some(t) = &tracker {
                                t.chunks(first, count);
                            }
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
        let verdict = verify::written(
            ctx,
            rel,
            &remote,
            attr,
            generation,
            whole_file_hash,
            alongside,
        );
        if let Some(o) = verdict.await.with_taken_back(ctx, done_here) {
            return o;
        }
    }
    set_and_stamp(ctx, rel, generation, attr).await?;
    Ok(FileOutcome::Done)
}

/// Chunks `missing` (ascending) as runs `(first, count)` of consecutive chunks, none
/// crossing a boundary of `per` chunks (aligned groups): each run is one read.
fn runs_of(missing: &[u64], per: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &i in missing {
        match out.last_mut() {
            Some((first, count)) if *first + *count == i && i / per == *first / per => {
                *count += 1;
            }
            _ => out.push((i, 1)),
        }
    }
    out
}

/// Sets the local file's mode and times as the source's, then, when it was verified,
/// records its stamp (after its verification, through the syncer): a later run trusts it
/// without reading it only while it still shows that stamp.
pub(super) async fn set_and_stamp(
    ctx: &Ctx,
    rel: &Bytes,
    generation: u64,
    attr: &Attr,
) -> std::io::Result<()> {
    let (local, a, owner) = (ctx.cache.local_path(rel), *attr, ctx.owners.local(attr));
    let xa = super::xattrs::XattrMap::of(ctx, rel).await;
    let (cache, r) = (ctx.cache.clone(), rel.clone());
    let stamp = background::run(move || {
        // No reader's store lands after the times are set (it would change them).
        cache.seal(&r, generation);
        set_metadata(&local, &a, true, owner)?;
        if let Some(x) = &xa {
            super::xattrs::apply(&local, x)?;
        }
        local_stamp(&local)
    })
    .await
    .map_err(std::io::Error::from)
    .and_then(|r| r);
    if let (Ok(stamp), true) = (&stamp, ctx.cfg.verify) {
        ctx.sync.stamped(rel.clone(), generation, *stamp);
    }
    ctx.sync.lift_seal(rel.clone(), generation);
    stamp.map(|_| ())
}

/// A file complete and verified by an earlier run (`st`, the open `file`): kept as it is,
/// metadata untouched, when the local file still shows the stamp recorded then; else, or
/// with `--checksum`, its BLAKE3 is computed again and compared with the one verified (with
/// `--checksum`: with the server's now). A match sets the metadata and stamps it again; a
/// difference (the copy was edited locally) fetches it again.
async fn recheck_verified(
    ctx: &Arc<Ctx>,
    rel: &Bytes,
    attr: &Attr,
    st: &crate::state::FileState,
    file: &Arc<std::fs::File>,
) -> std::io::Result<FileOutcome> {
    let f = file.clone();
    let m = background::run(move || f.metadata()).await??;
    if !ctx.cfg.checksum && st.stamp == Some(stamp_of(&m)) {
        // The verified bytes, untouched. Mode and times as the source's (a file completed
        // by a mount's readers has not had them set yet).
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let same = m.permissions().mode() & 0o7777 == u32::from(attr.perm)
            && (m.mtime(), m.mtime_nsec()) == (attr.mtime.sec, i64::from(attr.mtime.nsec))
            && ctx
                .owners
                .local(attr)
                .is_none_or(|(u, g)| (m.uid(), m.gid()) == (u, g));
        if !same {
            set_and_stamp(ctx, rel, st.generation, attr).await?;
        }
        ctx.progress
            .bytes_done
            .fetch_add(attr.size, Ordering::Relaxed);
        return Ok(FileOutcome::Done);
    }
    // A sparse copy is hashed without reading its holes (the kind of hash it was verified
    // with, chosen from the local file then as now).
    let sparse = crate::sparse_hash_for(&ctx.client, &m);
    // With --checksum the source's digest now; else (or when the source has none, as for an
    // S3 object uploaded in parts without a checksum) the BLAKE3 recorded when verified.
    let recorded = ferry_client::RemoteDigest {
        version: attr.version(),
        digest: Some(ferry_client::Digest::blake3(
            st.verified.unwrap_or_default(),
            sparse,
        )),
    };
    let expected = if ctx.cfg.checksum && attr.size > 0 {
        match ctx
            .client
            .remote_digest(remote_path(&ctx.root, rel), sparse)
            .await
        {
            Ok(h) if h.version == attr.version() && h.digest.is_some() => h,
            Ok(h) if h.version == attr.version() => recorded,
            Ok(_) => return Ok(FileOutcome::Changed(None)),
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "asking the server for its hash: {e}"
                )))
            }
        }
    } else {
        recorded
    };
    let local = ctx.cache.local_path(rel);
    let gate = ctx.gate.clone();
    gate.wait().await;
    let other = expected.other_kind();
    let (mine, theirs_kind) =
        background::run_long(move || crate::hash_local_with(&local, sparse, other)).await??;
    if !expected.matches(&mine, theirs_kind.as_ref()) {
        tracing::warn!(
            "/{}: the local copy is not the one verified (changed locally?): fetching it again",
            String::from_utf8_lossy(rel)
        );
        return Ok(FileOutcome::Mismatch);
    }
    ctx.progress.files_verified.fetch_add(1, Ordering::Relaxed);
    ctx.progress
        .bytes_done
        .fetch_add(attr.size, Ordering::Relaxed);
    set_and_stamp(ctx, rel, st.generation, attr).await?;
    Ok(FileOutcome::Done)
}

/// A local file the state knows nothing of (a destination renamed, or seeded by hand with
/// an older copy) with the server's size and mtime, as rsync's quick check would skip: its
/// hash is compared with the server's (the sparse hash where it leaves holes), and when they
/// match it is taken as the copy of this version — recorded complete and verified, its
/// metadata set — without a byte fetched. Returns whether it was taken. Only for files of
/// more than one chunk (smaller ones come with their directory's listing for about the cost
/// of a hash), and not with `--no-verify` (nothing would check it).
async fn adopt(ctx: &Arc<Ctx>, rel: &Bytes, attr: &Attr) -> std::io::Result<bool> {
    let cs = ctx.client.session().chunk_size;
    if !ctx.cfg.verify || attr.size <= u64::from(cs) || ctx.cache.state(rel).is_some() {
        return Ok(false);
    }
    let local = ctx.cache.local_path(rel);
    let probe = local.clone();
    let Ok(m) = background::run(move || std::fs::symlink_metadata(probe)).await? else {
        return Ok(false);
    };
    use std::os::unix::fs::MetadataExt;
    if !m.is_file()
        || m.len() != attr.size
        || (m.mtime(), m.mtime_nsec()) != (attr.mtime.sec, i64::from(attr.mtime.nsec))
    {
        return Ok(false);
    }
    let sparse = crate::sparse_hash_for(&ctx.client, &m);
    // Durable before it is recorded as present.
    let (theirs, mine) = crate::both_digests(
        &ctx.client,
        remote_path(&ctx.root, rel),
        local.clone(),
        sparse,
        ctx.gate.clone(),
        |path| std::fs::File::open(path)?.sync_all(),
    )
    .await;
    let Ok(((mine, other), ())) = mine else {
        return Ok(false);
    };
    match theirs {
        Ok(h) if h.version == attr.version() && h.confirms(&mine, other.as_ref()) => {}
        _ => return Ok(false),
    }
    let generation = ctx.cache.begin(rel, attr.version(), cs);
    let chunks = attr.size.div_ceil(u64::from(cs));
    let mut first = 0;
    while first < chunks {
        let n = (chunks - first).min(u64::from(u32::MAX));
        ctx.cache.mark_present(rel, generation, first, n as u32);
        first += n;
    }
    ctx.sync.verified(rel.clone(), generation, mine);
    set_and_stamp(ctx, rel, generation, attr).await?;
    ctx.progress.files_verified.fetch_add(1, Ordering::Relaxed);
    ctx.progress
        .bytes_done
        .fetch_add(attr.size, Ordering::Relaxed);
    tracing::debug!(
        "/{}: the local file is the server's (same hash): taken without fetching",
        String::from_utf8_lossy(rel)
    );
    Ok(true)
}

/// When the server's file differs from the verified local copy's version in its ctime only
/// (`chmod`, `chown`, a new hard link, or a journal written before versions had ctimes),
/// and the server's hash of it now is the one the copy matched, the copy is recorded as
/// holding the new version (nothing fetched); [`recheck_verified`] then checks the local
/// file itself. Otherwise nothing changes here (the copy is then fetched again).
async fn rebase_if_ctime_only(ctx: &Arc<Ctx>, rel: &Bytes, attr: &Attr) -> std::io::Result<()> {
    let version = attr.version();
    let Some(st) = ctx.cache.state(rel) else {
        return Ok(());
    };
    let Some(verified) = st.verified else {
        return Ok(());
    };
    if !st.complete() || !st.version.differs_in_ctime_only(&version) {
        return Ok(());
    }
    let sparse = std::fs::metadata(ctx.cache.local_path(rel))
        .is_ok_and(|m| crate::sparse_hash_for(&ctx.client, &m));
    let theirs = if attr.size == 0 {
        *blake3::hash(b"").as_bytes()
    } else {
        // Only a BLAKE3 compares with the one recorded (an S3 object's times never differ
        // in ctime alone).
        match ctx
            .client
            .remote_digest(remote_path(&ctx.root, rel), sparse)
            .await
        {
            Ok(ferry_client::RemoteDigest {
                version: v,
                digest: Some(d),
            }) if v == version
                && matches!(
                    d.kind,
                    ferry_client::DigestKind::Blake3 | ferry_client::DigestKind::Blake3Sparse
                ) =>
            {
                let mut h = [0u8; 32];
                h.copy_from_slice(&d.value);
                h
            }
            _ => return Ok(()),
        }
    };
    if theirs == verified {
        ctx.sync.flush().await;
        ctx.cache.rebase(rel, st.generation, version);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::runs_of;

    #[test]
    fn runs_are_consecutive_chunks_within_aligned_groups() {
        assert_eq!(runs_of(&[], 8), vec![]);
        // 0-9 missing with groups of 8: two reads, split at the group boundary.
        let all: Vec<u64> = (0..10).collect();
        assert_eq!(runs_of(&all, 8), vec![(0, 8), (8, 2)]);
        // Gaps (chunks kept by an earlier run) end a run.
        assert_eq!(
            runs_of(&[1, 2, 4, 5, 6, 7, 8, 15, 16], 8),
            vec![(1, 2), (4, 4), (8, 1), (15, 1), (16, 1)]
        );
        // Groups of one: every chunk alone (ferryd, sparse files).
        assert_eq!(runs_of(&[3, 4, 5], 1), vec![(3, 1), (4, 1), (5, 1)]);
    }
}
