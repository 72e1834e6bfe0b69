//! [`AbortOnDrop`]: a spawned task whose lifetime is bound to a value, so a helper task (a
//! status writer, a metrics server) cannot outlive the run or the server that started it,
//! also when that run is itself dropped mid-way.

/// Aborts the task when dropped. Construct it around the handle of a spawned task:
/// `AbortOnDrop(tokio::spawn(..))`.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Locks `m`, ignoring poisoning: for state every critical section leaves consistent, so a
/// thread that panicked while holding it does not take the rest of the process with it.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::AbortOnDrop;

    #[tokio::test]
    async fn the_task_ends_with_its_owner() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let guard = AbortOnDrop(tokio::spawn(async move {
            // Holds `tx` until aborted: the receiver sees the sender dropped only then.
            let _tx = tx;
            std::future::pending::<()>().await;
        }));
        drop(guard);
        // The aborted task drops its future, and with it the sender.
        assert!(rx.await.is_err());
    }
}
