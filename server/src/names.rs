//! Names of user and group ids on the server ([`ferry_proto::Request::IdNames`]), so a copy
//! can map owners by name as tar and rsync do. Blocking (the system's user database: files,
//! or NSS): the connection handler runs it on the blocking pool.

use bytes::Bytes;
use ferry_proto::{Id, IdName};
use nix::unistd::{Gid, Group, Uid, User};

/// The name of each id (empty when the server has none for it), in order.
pub(crate) fn names(ids: &[Id]) -> Vec<IdName> {
    ids.iter()
        .map(|&id| {
            let name = match id {
                Id::User(u) => User::from_uid(Uid::from_raw(u))
                    .ok()
                    .flatten()
                    .map(|u| u.name),
                Id::Group(g) => Group::from_gid(Gid::from_raw(g))
                    .ok()
                    .flatten()
                    .map(|g| g.name),
            };
            let name = name
                .filter(|n| n.len() <= 255)
                .map(Bytes::from)
                .unwrap_or_default();
            IdName { id, name }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_its_name_and_an_unused_id_none() {
        let got = names(&[Id::User(0), Id::Group(0), Id::User(3_999_999_999)]);
        assert_eq!(got[0].name, "root");
        assert_eq!(got[1].name, "root");
        assert!(got[2].name.is_empty());
    }
}
