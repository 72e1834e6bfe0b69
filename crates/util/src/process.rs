//! Process set-up shared by the binaries (`ferryd`, `ferry`): allocator tuning, how an error
//! is printed ([`error_line`]), and (with the `cli` feature) how a usage error is reported.

/// Caps glibc's malloc arenas. By default every thread that allocates may get an arena of
/// its own (up to 8 per core), and each keeps freed 1 MiB chunk buffers for reuse, which
/// showed as tens of MiB of extra resident memory under load.
///
/// Call it first thing in `main`, before any other thread exists.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// An error and its causes as the one line the binaries print: `what: why: …`. A cause the
/// line already tells is left out: many errors name their cause in their own message
/// (`cannot connect to H: Connection refused`) and also return it as their source, which a
/// plain walk of the chain (`{:#}`) would print twice; a cause that only wraps such a text
/// (rustls's `unexpected error: …` around ferry's own) counts as told too.
pub fn error_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        let inner = text.split_once(": ").map_or("", |(_, inner)| inner);
        let told = line.contains(&text) || (inner.len() >= 12 && line.contains(inner));
        if !told {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// Help and version print as usual; a usage error becomes one line on stderr (what is
/// wrong, the usage, where to look) instead of clap's block, and the process exits with
/// status 2. `program` prefixes the line (`ferry: …`).
#[cfg(feature = "cli")]
pub fn one_line_usage_error(program: &str, e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    eprintln!("{}", usage_error_line(program, &e.render().to_string()));
    std::process::exit(2);
}

/// The one line [`one_line_usage_error`] prints for clap's rendered usage error `text`:
/// `PROGRAM: WHAT (usage: USAGE); see --help`.
pub fn usage_error_line(program: &str, text: &str) -> String {
    let mut what = Vec::new();
    let mut usage = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(u.to_string());
        } else if !line.starts_with("For more information") && !line.starts_with("tip:") {
            what.push(line.trim_start_matches("error: ").to_string());
        }
    }
    format!(
        "{program}: {}{}; see --help",
        what.join(" "),
        usage.map_or_else(String::new, |u| format!(" (usage: {u})"))
    )
}

#[cfg(test)]
mod tests {
    use super::usage_error_line;

    #[test]
    fn a_clap_error_becomes_one_line() {
        let cmd = clap::Command::new("tool")
            .arg(clap::Arg::new("dir").required(true))
            .arg(
                clap::Arg::new("n")
                    .long("n")
                    .value_parser(clap::value_parser!(u32)),
            );
        // (arguments, start of the line, whether clap shows the usage)
        for (args, want, usage) in [
            (
                &["tool"][..],
                "tool: the following required arguments were not provided: <dir>",
                true,
            ),
            (
                &["tool", "d", "--n", "x"][..],
                "tool: invalid value 'x' for '--n <n>': invalid digit found in string",
                false,
            ),
            (
                &["tool", "d", "--what"][..],
                "tool: unexpected argument '--what' found",
                true,
            ),
        ] {
            let e = cmd.clone().try_get_matches_from(args).unwrap_err();
            let line = usage_error_line("tool", &e.render().to_string());
            assert!(line.starts_with(want), "{args:?}: {line}");
            assert_eq!(line.contains(" (usage: tool "), usage, "{line}");
            assert!(line.ends_with("; see --help"), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }
}

#[cfg(test)]
mod arena_tests {
    #[test]
    fn limiting_arenas_leaves_allocation_working() {
        super::limit_malloc_arenas();
        let v: Vec<u8> = vec![1; 1 << 20];
        assert_eq!(v.iter().map(|&b| u64::from(b)).sum::<u64>(), 1 << 20);
    }
}

#[cfg(test)]
mod error_line_tests {
    use super::error_line;

    #[derive(Debug, thiserror::Error)]
    enum E {
        #[error("cannot connect to h: {source}")]
        Connect { source: std::io::Error },
        #[error("handshake failed: {explained}")]
        Tls {
            explained: String,
            #[source]
            source: std::io::Error,
        },
        #[error("remote path /x")]
        Remote {
            #[source]
            source: std::io::Error,
        },
    }

    #[test]
    fn a_cause_the_message_names_is_printed_once_and_one_it_does_not_is_appended() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            error_line(&E::Connect { source: refused() }),
            "cannot connect to h: refused"
        );
        assert_eq!(
            error_line(&E::Remote { source: refused() }),
            "remote path /x: refused"
        );
        let pinned = "the certificate is not the one pinned";
        let rustls = std::io::Error::other(format!("unexpected error: {pinned}"));
        assert_eq!(
            error_line(&E::Tls {
                explained: pinned.into(),
                source: rustls
            }),
            format!("handshake failed: {pinned}")
        );
        let wrapped = anyhow::Error::from(E::Connect { source: refused() }).context("mount");
        assert_eq!(
            error_line(wrapped.as_ref()),
            "mount: cannot connect to h: refused"
        );
    }
}
