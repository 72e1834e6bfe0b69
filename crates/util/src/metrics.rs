//! The `/metrics` HTTP loop of `--metrics ADDR` (ferryd, `ferry mount`, `ferry mirror`).
//!
//! Only the socket part lives here: the page comes from the caller and the response bytes
//! from `ferry_proto::metrics::http_response` (pure, tested there). Invariants: at most
//! [`MAX_SCRAPERS`] connections are served at once, each gets [`REQUEST_TIMEOUT`] to send
//! its request line (at most [`MAX_REQUEST_LINE`] bytes are read), and every connection
//! gets one response and is closed, so a slow or hostile scraper holds no more than one
//! small buffer for a bounded time.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once; more wait in the listener's accept queue.
pub const MAX_SCRAPERS: usize = 16;
/// Time a scraper has to send its whole request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read while looking for the end of the request line.
pub const MAX_REQUEST_LINE: usize = 4096;

/// Produces the Prometheus page, called once per `GET /metrics`.
pub type PageFn = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `page()` as Prometheus text on `listener` (`GET /metrics`; anything else is a
/// 404) until the task is dropped or aborted.
pub async fn serve_metrics(listener: TcpListener, page: PageFn) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPERS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            // EMFILE and friends: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let page = page.clone();
        tokio::spawn(async move {
            let _permit = permit;
            answer(stream, || page()).await;
        });
    }
}

/// Reads one request line from `s` (within [`REQUEST_TIMEOUT`]), writes the response and
/// closes. A request line that does not arrive in time gets no answer.
async fn answer(mut s: impl AsyncRead + AsyncWrite + Unpin, page: impl FnOnce() -> String) {
    let mut buf = vec![0u8; MAX_REQUEST_LINE];
    let mut n = 0;
    let read_line = async {
        while n < buf.len() && !buf[..n].contains(&b'\n') {
            match s.read(&mut buf[n..]).await {
                Ok(k) if k > 0 => n += k,
                _ => return false,
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(REQUEST_TIMEOUT, read_line).await,
        Ok(true)
    ) {
        return;
    }
    let text = String::from_utf8_lossy(&buf[..n]);
    let first = text.lines().next().unwrap_or("");
    let resp = ferry_proto::metrics::http_response(first, page);
    let _ = s.write_all(&resp).await;
    let _ = s.shutdown().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;
    use crate::AbortOnDrop;

    async fn get(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_page_on_metrics_and_404_elsewhere() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = calls.clone();
        let _server = AbortOnDrop(tokio::spawn(serve_metrics(
            l,
            Arc::new(move || {
                let n = c.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                format!("ferry_scrapes_total {n}\n")
            }),
        )));
        let r = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\nferry_scrapes_total 1\n"), "{r}");
        // The request line may arrive in pieces.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /met").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.write_all(b"rics HTTP/1.1\r\n\r\n").await.unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).await.unwrap();
        assert!(r.ends_with("ferry_scrapes_total 2\n"), "{r}");
        let r = get(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_scraper_gets_no_answer_after_the_timeout() {
        let (client, server) = tokio::io::duplex(1024);
        let served = tokio::spawn(answer(server, || unreachable!("no request line")));
        tokio::time::sleep(REQUEST_TIMEOUT + Duration::from_secs(1)).await;
        assert!(served.is_finished());
        drop(client);
    }

    #[tokio::test]
    async fn a_closed_connection_gets_no_answer() {
        let (client, server) = tokio::io::duplex(1024);
        drop(client);
        answer(server, || unreachable!("no request line")).await;
    }
}
