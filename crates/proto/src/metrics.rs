//! Prometheus text exposition (format 0.0.4), built in memory: no I/O. The binaries serve it
//! on `/metrics` (`--metrics ADDR`).

use std::fmt::Write;

/// A page of metrics; every name gets the `ferry_` prefix.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty page.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn metric(&mut self, kind: &str, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let _ = writeln!(self.text, "# HELP ferry_{name} {help}");
        let _ = writeln!(self.text, "# TYPE ferry_{name} {kind}");
        self.sample(name, labels, value);
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.text, "ferry_{name}");
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.text, "{k}=\"{v}\"");
            }
            self.text.push('}');
        }
        if value.fract() == 0.0 && value.abs() < 1e15 {
            let _ = writeln!(self.text, " {}", value as i64);
        } else {
            let _ = writeln!(self.text, " {value}");
        }
    }

    /// A counter (only goes up).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.metric("counter", name, help, &[], value as f64);
        self
    }

    /// A gauge (goes up and down).
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.metric("gauge", name, help, &[], value);
        self
    }

    /// A gauge with labels, e.g. the codec in use as `compression_in_use{codec="zstd",
    /// choice="auto"} 1`.
    pub fn gauge_labelled(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        value: f64,
    ) -> &mut Self {
        self.metric("gauge", name, help, labels, value);
        self
    }

    /// A counter with one sample per label value, e.g. bytes by `kind="wire"|"decoded"`.
    pub fn counter_by(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        samples: &[(&str, u64)],
    ) -> &mut Self {
        let _ = writeln!(self.text, "# HELP ferry_{name} {help}");
        let _ = writeln!(self.text, "# TYPE ferry_{name} counter");
        for (v, n) in samples {
            self.sample(name, &[(label, v)], *n as f64);
        }
        self
    }

    /// The page.
    pub fn finish(self) -> String {
        self.text
    }
}

/// The HTTP response for a request whose first line is `request_line`: the page for
/// `GET /metrics`, 404 otherwise.
pub fn http_response(request_line: &str, page: impl FnOnce() -> String) -> Vec<u8> {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) =
        if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", page())
        } else {
            (
                "404 Not Found",
                "text/plain; charset=utf-8",
                "only /metrics is served here\n".to_string(),
            )
        };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_format() {
        let mut e = Exposition::new();
        e.counter("reads_total", "Reads.", 3)
            .gauge("ratio", "A ratio.", 2.5)
            .counter_by(
                "bytes_total",
                "Bytes.",
                "kind",
                &[("wire", 10), ("decoded", 20)],
            );
        let t = e.finish();
        assert!(t.contains("# TYPE ferry_reads_total counter\nferry_reads_total 3\n"));
        assert!(t.contains("ferry_ratio 2.5\n"));
        assert!(t.contains("ferry_bytes_total{kind=\"wire\"} 10\n"));
        let r = String::from_utf8(http_response("GET /metrics HTTP/1.1", || t.clone())).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with(&t));
        let r = String::from_utf8(http_response("GET / HTTP/1.1", String::new)).unwrap();
        assert!(r.starts_with("HTTP/1.1 404"));
    }
}
