//! A file that fits in one chunk, in one read and one blocking step on the background
//! threads (create, write, metadata, BLAKE3 of the bytes written): a tree of small files is
//! bound by per-file work, not bytes.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use ferry_client::SmallFile;
use ferry_proto::Attr;

use super::chunked::write_queued;
use super::fetch::{fetch_chunk, ChunkError};
use super::file::FileOutcome;
use super::metadata::{set_new_file_metadata, stamp_of};
use super::verify;
use super::{remote_path, Ctx, UNIT};

/// A file that fits in one chunk: one read, then one blocking step that creates, writes and
/// sets the metadata of the local file (a tree of small files is bound by per-file work:
/// the file is created with its mode, not sized before its one write, and its owner and
/// mode set only where creation did not give them). Its
/// hash is computed in the same step over the bytes written, still in memory, and compared
/// with the server's hash of the same version (carried by the read when the server has
/// READ_HASH, else asked for).
///
/// `listed`: the file's contents when they came with its directory's listing (then nothing
/// is fetched; the listing's BLAKE3 is the server's hash of this version).
pub(super) async fn copy_small_file(
    ctx: &Arc<Ctx>,
    rel: &Bytes,
    attr: &Attr,
    listed: Option<SmallFile>,
) -> std::io::Result<FileOutcome> {
    let cs = ctx.client.session().chunk_size;
    let version = attr.version();
    let remote = remote_path(&ctx.root, rel);
    let units = ((attr.size as usize).div_ceil(UNIT).max(1) as u32).min(ctx.total_units);
    let permit = ctx
        .chunk_units
        .clone()
        .acquire_many_owned(units)
        .await
        .map_err(std::io::Error::other)?;
    let fetched = match listed.filter(|l| l.data.len() as u64 == attr.size) {
        Some(l) => {
            // Counted and paced as the read it stands for.
            if let Some(lim) = &ctx.limiter {
                lim.take(l.wire_len as u64).await;
            }
            ctx.progress.chunks_fetched.fetch_add(1, Ordering::Relaxed);
            ctx.progress
                .bytes_fetched
                .fetch_add(attr.size, Ordering::Relaxed);
            Ok((l.data, Some(l.blake3)))
        }
        None => fetch_chunk(ctx, &remote, 0, attr.size as u32, version).await,
    };
    let (data, file_hash) = match fetched {
        Ok(r) => r,
        Err(ChunkError::Changed) => return Ok(FileOutcome::Changed(None)),
        Err(ChunkError::Vanished) => return Ok(FileOutcome::Vanished),
        Err(ChunkError::Remote(e)) => return Err(std::io::Error::other(e.to_string())),
        Err(ChunkError::Io(e)) => return Err(e),
    };
    let verify = ctx.cfg.verify;
    let owner = ctx.owners.local(attr);
    let xa = super::xattrs::XattrMap::of(ctx, rel).await;
    let local = ctx.cache.local_path(rel);
    let (file, generation, mine, stamp) = {
        let (cache, r, a, d) = (ctx.cache.clone(), rel.clone(), *attr, data);
        write_queued(
            ctx,
            d.len(),
            move || -> std::io::Result<(File, u64, [u8; 32], ferry_proto::Version)> {
                let (mut f, generation) =
                    cache.restart_whole_file(&r, a.version(), cs, u32::from(a.perm))?;
                // No reader's store lands after the times are set (it would change them):
                // lifted once the write is recorded.
                cache.seal(&r, generation);
                std::io::Write::write_all(&mut f, &d)?;
                let m = set_new_file_metadata(&f, &a, owner, || {
                    xa.as_ref()
                        .map_or(Ok(()), |x| super::xattrs::apply_fd(&f, &local, x))
                })?;
                let stamp = stamp_of(&m);
                let mine = if verify {
                    *blake3::hash(&d).as_bytes()
                } else {
                    [0; 32]
                };
                Ok((f, generation, mine, stamp))
            },
        )
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("writing the local copy: {e}")))?
    };
    drop(permit);
    ctx.sync
        .written(rel.clone(), version, generation, 0, Arc::new(file));
    ctx.progress
        .bytes_done
        .fetch_add(attr.size, Ordering::Relaxed);
    let verdict = if ctx.cfg.verify {
        let verdict = verify::in_memory(ctx, rel, remote, version, generation, mine, file_hash);
        let taken_back = verdict.await.with_taken_back(ctx, attr.size);
        if taken_back.is_none() {
            ctx.sync.stamped(rel.clone(), generation, stamp);
        }
        taken_back
    } else {
        None
    };
    ctx.sync.lift_seal(rel.clone(), generation);
    verdict.unwrap_or(Ok(FileOutcome::Done))
}
