//! Logging of the `ferry` commands: the filter (`-v`, `-q`, `RUST_LOG`), the destination
//! (stderr or `--log-file`), and panics of any thread logged there too.

use std::path::PathBuf;

/// Starts logging at `verbose` (-v count; `quiet` is the filter without -v) to `file` or
/// stderr, and logs panics.
///
/// # Errors
/// `file` cannot be opened for appending.
pub fn init_logging_at(verbose: u8, file: Option<&PathBuf>, quiet: &str) -> anyhow::Result<()> {
    let default = match verbose {
        0 => quiet,
        1 => "debug",
        _ => "trace",
    };
    // The TLS verifier of S3 endpoints logs each failure itself; ferry's own one line says it.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{default},rustls_platform_verifier=off"))
    });
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open --log-file {}: {e}", path.display()))?;
            b.with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .init();
        }
        None => {
            use std::io::IsTerminal;
            b.with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr)
                .init();
        }
    }
    // A panic in a FUSE or runtime thread ends the mount; in daemon mode stderr goes
    // nowhere, so it is logged where the operator looks.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!("panic: {info}");
        default_hook(info);
    }));
    Ok(())
}
