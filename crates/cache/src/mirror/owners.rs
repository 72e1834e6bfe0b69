//! Owners of the copy: as root, every file, directory and symlink gets the owner and group
//! the server's has, mapped by name as tar and rsync do (the server names its ids,
//! [`ferry_client::Client::id_names`]; a name unknown here, or an id without a name there,
//! keeps its number), or by number (`--numeric-ids`), or fixed (`--chown USER:GROUP`).
//! Not as root: owners are left alone (only root may give files away), as rsync does.
//!
//! The names are learned once per id, with each listing ([`OwnerMap::learn`]: one request
//! for the ids not seen yet, none once every owner of the tree is known).

use std::collections::HashMap;
use std::sync::Mutex;

use ferry_client::Client;
use ferry_proto::{Attr, Id};
use nix::unistd::{Group, User};

/// How a mirror sets owners (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Owners {
    /// By name when running as root; left alone otherwise.
    #[default]
    Auto,
    /// The server's numbers, when running as root (`--numeric-ids`).
    Numeric,
    /// These owner and/or group for everything; the other, if not given, as `Auto`
    /// (`--chown USER:GROUP`).
    Chown {
        /// The owner, if given.
        uid: Option<u32>,
        /// The group, if given.
        gid: Option<u32>,
    },
    /// Never set.
    Off,
}

/// What the mirror does with owners in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    ByName,
    Numeric,
    Chown(Option<u32>, Option<u32>),
}

/// Server ids to local ids, for a run (see the module docs).
#[derive(Debug)]
pub(super) struct OwnerMap {
    mode: Mode,
    /// Server id → local id, by name.
    local: Mutex<HashMap<Id, u32>>,
    /// The server could not name ids (told once).
    unnamed: std::sync::atomic::AtomicBool,
}

impl OwnerMap {
    pub(super) fn new(cfg: Owners) -> OwnerMap {
        let root = nix::unistd::geteuid().is_root();
        let mode = match cfg {
            Owners::Off => Mode::Off,
            Owners::Chown { uid, gid } => Mode::Chown(uid, gid),
            _ if !root => Mode::Off,
            Owners::Numeric => Mode::Numeric,
            Owners::Auto => Mode::ByName,
        };
        OwnerMap {
            mode,
            local: Mutex::new(HashMap::new()),
            unnamed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn by_name(&self) -> bool {
        matches!(
            self.mode,
            Mode::ByName | Mode::Chown(None, _) | Mode::Chown(_, None)
        )
    }

    /// Learns the local ids of the owners of `attrs` not seen yet: their names from the
    /// server (one request), then the local ids of those names.
    pub(super) async fn learn<'a>(&self, client: &Client, attrs: impl Iterator<Item = &'a Attr>) {
        if !self.by_name() {
            return;
        }
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
        let names = match client.id_names(&want).await {
            Ok(n) => n,
            Err(e) => {
                if !self
                    .unnamed
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!("owners are copied by number: {e}");
                }
                let mut known = self.local.lock().unwrap_or_else(|e| e.into_inner());
                for id in want {
                    known.insert(id, number(id));
                }
                return;
            }
        };
        let mut found = Vec::with_capacity(names.len());
        for n in names {
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
            found.push((n.id, here.unwrap_or(number(n.id))));
        }
        self.local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(found);
    }

    /// The local owner and group for an object the server has with `attr`'s, or `None`
    /// when owners are not set in this run.
    pub(super) fn local(&self, attr: &Attr) -> Option<(u32, u32)> {
        let named = |id: Id| {
            self.local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .copied()
                .unwrap_or(number(id))
        };
        match self.mode {
            Mode::Off => None,
            Mode::Numeric => Some((attr.uid, attr.gid)),
            Mode::ByName => Some((named(Id::User(attr.uid)), named(Id::Group(attr.gid)))),
            Mode::Chown(u, g) => Some((
                u.unwrap_or_else(|| named(Id::User(attr.uid))),
                g.unwrap_or_else(|| named(Id::Group(attr.gid))),
            )),
        }
    }
}

fn number(id: Id) -> u32 {
    match id {
        Id::User(u) | Id::Group(u) => u,
    }
}
