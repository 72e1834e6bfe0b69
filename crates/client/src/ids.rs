//! Owners mapped by name, as tar and rsync do: the server names its user and group ids
//! ([`Client::id_names`]), and each name is looked up here (`getpwnam`, `getgrnam`). A
//! name unknown here, or an id without a name there, keeps its number.
//!
//! Names are learned once per id ([`NameMap::learn`]: one request for the ids not seen
//! yet, none once every owner met is known), so a tree walk pays one round trip for the
//! first listing holding a new owner, and nothing after.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ferry_proto::{Attr, Id};
use nix::unistd::{Group, User};

use crate::pool::Client;

/// Server ids to local ids, by name.
#[derive(Debug, Default)]
pub struct NameMap {
    local: Mutex<HashMap<Id, u32>>,
    /// The server could not name ids (warned once).
    unnamed: AtomicBool,
}

impl NameMap {
    /// An empty map.
    pub fn new() -> NameMap {
        NameMap::default()
    }

    /// Learns the local ids of the owners and groups of `attrs` not seen yet: their names
    /// from the server (one request), then the local ids of those names. A server that
    /// cannot name ids leaves them as numbers (warned once).
    pub async fn learn<'a>(&self, client: &Client, attrs: impl Iterator<Item = &'a Attr>) {
        let mut want: Vec<Id> = {
            let known = self.local.lock().unwrap_or_else(|e| e.into_inner());
            attrs
                .flat_map(|a| [Id::User(a.uid), Id::Group(a.gid)])
                .filter(|id| !known.contains_key(id))
                .collect()
        };
        want.sort_unstable();
        want.dedup();
        if want.is_empty() {
            return;
        }
        // An S3 source's owners are the local user's already (crate::s3): nothing to name.
        let named = if client.s3().is_some() {
            Ok(Vec::new())
        } else {
            client.id_names(&want).await
        };
        let found: Vec<(Id, u32)> = match named {
            Ok(names) if names.is_empty() => want.into_iter().map(|id| (id, number(id))).collect(),
            Ok(names) => names
                .into_iter()
                .map(|n| {
                    let name = String::from_utf8_lossy(&n.name);
                    let here = if name.is_empty() {
                        None
                    } else {
                        match n.id {
                            Id::User(_) => User::from_name(&name)
                                .ok()
                                .flatten()
                                .map(|u| u.uid.as_raw()),
                            Id::Group(_) => Group::from_name(&name)
                                .ok()
                                .flatten()
                                .map(|g| g.gid.as_raw()),
                        }
                    };
                    (n.id, here.unwrap_or(number(n.id)))
                })
                .collect(),
            Err(e) => {
                if !self.unnamed.swap(true, Ordering::Relaxed) {
                    tracing::warn!("owners are shown by number: {e}");
                }
                want.into_iter().map(|id| (id, number(id))).collect()
            }
        };
        self.local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(found);
    }

    /// The local id of server id `id` (its number when not learned or not known here).
    pub fn local(&self, id: Id) -> u32 {
        self.local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .copied()
            .unwrap_or(number(id))
    }

    /// `attr` with its owner and group mapped to local ids.
    pub fn map(&self, mut attr: Attr) -> Attr {
        attr.uid = self.local(Id::User(attr.uid));
        attr.gid = self.local(Id::Group(attr.gid));
        attr
    }
}

/// The number of `id`.
pub fn number(id: Id) -> u32 {
    match id {
        Id::User(u) | Id::Group(u) => u,
    }
}
