//! The progress output `ferry mirror` and `ferry status` share: one plain line per
//! [`Status`] for output that is not a terminal, and the progress bar styles for one that
//! is.

use ferry_cache::Status;
use ferry_util::human_bytes;

/// `8.0 MiB/s ETA 4 s files 1/4` (a `+` after the files while the tree is still listed).
pub fn rate_eta_files(s: &Status) -> String {
    let eta = s
        .eta_secs
        .map_or_else(|| "?".to_string(), |e| format!("{e:.0} s"));
    format!(
        "{}/s ETA {eta} files {}/{}{}",
        human_bytes(s.rate_bytes_per_sec as u64),
        s.files_done,
        s.files_total,
        if s.walk_done { "" } else { "+" }
    )
}

/// One plain progress line, for output that is not a terminal.
pub fn progress_line(s: &Status) -> String {
    format!(
        "{} {} of {} ({:.1} %), {}",
        s.state,
        human_bytes(s.bytes_done),
        human_bytes(s.bytes_total),
        100.0 * s.bytes_done as f64 / s.bytes_total.max(1) as f64,
        rate_eta_files(s)
    )
}

/// A progress bar of bytes drawn by `template` (indicatif's syntax), on `target`.
pub fn progress_bar(
    target: indicatif::ProgressDrawTarget,
    template: &str,
) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::with_draw_target(Some(0), target);
    b.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_cache::{Progress, State};

    #[test]
    fn a_plain_line_says_state_bytes_rate_and_files() {
        let p = Progress::default();
        p.bytes_total
            .store(4 << 20, std::sync::atomic::Ordering::Relaxed);
        p.bytes_done
            .store(1 << 20, std::sync::atomic::Ordering::Relaxed);
        p.files_total.store(4, std::sync::atomic::Ordering::Relaxed);
        p.files_done.store(1, std::sync::atomic::Ordering::Relaxed);
        let line = progress_line(&p.snapshot(State::Running, "h:1"));
        assert!(
            line.starts_with("running 1.0 MiB of 4.0 MiB (25.0 %), "),
            "{line}"
        );
        assert!(line.ends_with(" ETA ? files 1/4+"), "{line}");
    }
}
