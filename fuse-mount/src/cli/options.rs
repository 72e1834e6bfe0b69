//! sshfs-style `-o opt,opt=val,…` for `ferry mount`, as mount(8) and /etc/fstab pass
//! options (through the `mount.fuse.ferry` helper): each becomes the long flag of the same
//! name before clap sees the command line; mount(8)'s generic options are ignored.

use super::args::Cli;

/// Why a `-o` list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// `-o` at the end of the command line.
    #[error("-o needs a list of options, e.g. -o allow_other,streams=16")]
    MissingList,
    /// Not the name of a `ferry mount` flag (nor an ignored generic option).
    #[error("-o {0}: not a ferry mount option (see `ferry mount --help`; every --flag works as -o flag or -o flag=value)")]
    Unknown(String),
    /// A flag that takes a value, given without one.
    #[error("-o {0} needs a value: -o {0}=VALUE")]
    NeedsValue(String),
    /// A switch given a value.
    #[error("-o {0} takes no value: write -o {0}")]
    TakesNoValue(String),
}

/// Options mount(8) and fstab pass that mean nothing to ferry (or that ferry always does):
/// accepted and ignored.
const IGNORED_MOUNT_OPTIONS: &[&str] = &[
    "_netdev",
    "nofail",
    "noauto",
    "auto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "defaults",
    "ro",
    "rw",
    "nodev",
    "nosuid",
    "dev",
    "suid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "sync",
    "async",
    "dirsync",
    "loud",
    "silent",
    "nomand",
    "delay_connect",
];

/// sshfs-style `-o opt,opt=val,…` for `ferry mount`: each option becomes the long flag of
/// the same name (`cache_dir=/x` → `--cache-dir /x`, `allow_other` → `--allow-other`);
/// mount(8)'s generic options (`_netdev`, `noauto`, `x-systemd.*`, `comment=…`, …) are
/// ignored (`rw` too, which mount(8) always passes: the mount is read-only whatever it says).
///
/// # Errors
/// An option that is not a `ferry mount` flag, with a one-line explanation.
pub fn expand_mount_options(
    argv: Vec<std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, OptionError> {
    use clap::CommandFactory;
    if argv.get(1).and_then(|a| a.to_str()) != Some("mount") {
        return Ok(argv);
    }
    let cmd = Cli::command();
    // The `mount` subcommand is defined in `args`; without it there is nothing to expand.
    let Some(mount) = cmd.find_subcommand("mount") else {
        return Ok(argv);
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut flags = Vec::new();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let list = match arg.to_str() {
            Some("-o") => match it.next() {
                Some(v) => v.to_string_lossy().into_owned(),
                None => return Err(OptionError::MissingList),
            },
            Some(a) if a.starts_with("-o") && a.len() > 2 => a[2..].to_string(),
            _ => {
                out.push(arg);
                continue;
            }
        };
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            if IGNORED_MOUNT_OPTIONS.contains(&key) || key.starts_with("x-") || key == "comment" {
                continue;
            }
            let long = key.replace('_', "-");
            let Some(def) = mount
                .get_arguments()
                .find(|a| a.get_long() == Some(long.as_str()))
            else {
                return Err(OptionError::Unknown(key.to_string()));
            };
            let takes_value = def.get_action().takes_values();
            match (takes_value, value) {
                (true, Some(v)) => {
                    flags.push(format!("--{long}").into());
                    flags.push(v.into());
                }
                (true, None) => return Err(OptionError::NeedsValue(key.to_string())),
                (false, None) => flags.push(format!("--{long}").into()),
                (false, Some(_)) => return Err(OptionError::TakesNoValue(key.to_string())),
            }
        }
    }
    out.extend(flags);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand_mount_options;

    fn expand(args: &[&str]) -> Result<Vec<String>, String> {
        let argv = args.iter().map(std::ffi::OsString::from).collect();
        expand_mount_options(argv)
            .map(|v| {
                v.into_iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn dash_o_options_become_flags() {
        type Case<'a> = (&'a [&'a str], Result<&'a [&'a str], &'a str>);
        let table: &[Case] = &[
            (
                &[
                    "ferry",
                    "mount",
                    "h:/p",
                    "/m",
                    "-o",
                    "allow_other,streams=16",
                ],
                Ok(&[
                    "ferry",
                    "mount",
                    "h:/p",
                    "/m",
                    "--allow-other",
                    "--streams",
                    "16",
                ]),
            ),
            (
                &[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "-ocache_dir=/nvme/x,mirror,bwlimit=100M",
                ],
                Ok(&[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "--cache-dir",
                    "/nvme/x",
                    "--mirror",
                    "--bwlimit",
                    "100M",
                ]),
            ),
            (
                &[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "-o",
                    "ro,_netdev,nofail,noauto,x-systemd.automount,comment=x,defaults,dev,suid",
                ],
                Ok(&["ferry", "mount", "h", "/m"]),
            ),
            (
                &[
                    "ferry",
                    "mount",
                    "-o",
                    "tls_fingerprint=SHA256:ab=,token_file=/t",
                    "h",
                    "/m",
                ],
                Ok(&[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "--tls-fingerprint",
                    "SHA256:ab=",
                    "--token-file",
                    "/t",
                ]),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "rw"],
                Ok(&["ferry", "mount", "h", "/m"]),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "frobnicate"],
                Err("not a ferry mount option"),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "streams"],
                Err("needs a value"),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "mirror=yes"],
                Err("takes no value"),
            ),
            (&["ferry", "mount", "h", "/m", "-o"], Err("needs a list")),
            (
                &["ferry", "mirror", "-o", "x"],
                Ok(&["ferry", "mirror", "-o", "x"]),
            ),
        ];
        for (args, want) in table {
            match (expand(args), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, *w, "{args:?}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{args:?}: {e}"),
                (got, w) => panic!("{args:?}: got {got:?}, want {w:?}"),
            }
        }
    }
}
