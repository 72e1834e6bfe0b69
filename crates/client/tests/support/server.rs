//! An in-process ferryd for the pool's tests, included by each test file with
//! `#[path = "support/server.rs"] mod server;`.

// Each test crate uses only some of these.
#![allow(dead_code)]

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Serves `dir` on `listener` until the returned sender is dropped or fired.
pub fn serve_on(
    listener: TcpListener,
    dir: &std::path::Path,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let config = ferry_server::ServerConfig {
        export: dir.to_path_buf(),
        ..Default::default()
    };
    let task = tokio::spawn(async move {
        ferry_server::run(listener, config, async {
            let _ = rx.await;
        })
        .await
        .expect("in-process ferryd failed");
    });
    (tx, task)
}

/// Serves `dir` on a fresh loopback port until the returned sender is dropped or fired;
/// returns the address to connect to.
pub async fn serve(dir: &std::path::Path) -> (String, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address").to_string();
    let (tx, _task) = serve_on(listener, dir);
    (addr, tx)
}
