//! `ferry`: mount a ferryd export (`ferry mount`), mirror one into a local directory
//! (`ferry mirror`), report on a mirror (`ferry status`).
//!
//! The binary parses arguments ([`cli::args`]), turns them into the library's plain config
//! structs ([`cli::config`]) and runs the command; everything that draws on the terminal
//! lives here, in [`cli`], not in the library.

mod cli;

use cli::args::{Cli, Command};

fn main() {
    ferry_util::limit_malloc_arenas();
    raise_nofile_limit();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv = match cli::options::expand_mount_options(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferry: {e}");
            std::process::exit(1);
        }
    };
    let cli = match <Cli as clap::Parser>::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => ferry_util::one_line_usage_error("ferry", e),
    };
    let r = match cli.command {
        Command::Mount(args) => cli::daemon::mount(args),
        Command::Mirror(args) => cli::mirror::mirror(args),
        Command::Status(args) => {
            cli::status::status(&args.path, args.state_dir.as_deref(), args.json, args.watch)
        }
    };
    if let Err(e) = r {
        eprintln!("ferry: {}", ferry_util::error_line(e.as_ref()));
        std::process::exit(1);
    }
}

/// Raises the open-file limit to its hard maximum: a mirror keeps hundreds of files open at
/// once (and the syncer holds the ones written until they are durable).
fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}
