//! Owners of the copy: as root, every file, directory and symlink gets the owner and group
//! the server's has, mapped by name as tar and rsync do ([`NameMap`]: a name unknown here,
//! or an id without a name there, keeps its number), or by number (`--numeric-ids`), or fixed (`--chown USER:GROUP`).
//! Not as root: owners are left alone (only root may give files away), as rsync does.
//!
//! The names are learned with each listing ([`OwnerMap::learn`]).

use ferry_client::ids::NameMap;
use ferry_client::Client;
use ferry_proto::{Attr, Id};

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
    names: NameMap,
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
            names: NameMap::new(),
        }
    }

    fn by_name(&self) -> bool {
        matches!(
            self.mode,
            Mode::ByName | Mode::Chown(None, _) | Mode::Chown(_, None)
        )
    }

    /// Learns the local ids of the owners of `attrs` not seen yet ([`NameMap::learn`]).
    pub(super) async fn learn<'a>(&self, client: &Client, attrs: impl Iterator<Item = &'a Attr>) {
        if self.by_name() {
            self.names.learn(client, attrs).await;
        }
    }

    /// The local owner and group for an object the server has with `attr`'s, or `None`
    /// when owners are not set in this run.
    pub(super) fn local(&self, attr: &Attr) -> Option<(u32, u32)> {
        let named = |id: Id| self.names.local(id);
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
