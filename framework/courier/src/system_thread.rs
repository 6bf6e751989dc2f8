//! An actor tree on its own thread and actix System, so a process (or a test) can run a relay
//! and consumers beside other work and stop one abruptly — every connection, stream and
//! in-flight message dropped, as `kill -9` would, minus the process exit.

use std::future::Future;
use std::thread::JoinHandle;

/// The thread could not be started, or its start-up ended without an answer.
#[derive(Debug, thiserror::Error)]
#[error("thread {thread} failed to start: {reason}")]
pub struct ThreadStartError {
    pub thread: String,
    pub reason: String,
}

/// A running System on its own thread; stopped (and joined) by [`SystemThread::stop`] or drop.
pub struct SystemThread {
    system: actix::System,
    thread: Option<JoinHandle<()>>,
}

impl SystemThread {
    /// Runs `start` on a new thread's System and returns once it finished: with its value and
    /// the running System, or with its error (the thread then ends).
    pub fn spawn<T, E, F, Fut>(name: &str, start: F) -> Result<(Self, T), E>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>>,
        T: Send + 'static,
        E: From<ThreadStartError> + Send + 'static,
    {
        let failed = |reason: String| ThreadStartError {
            thread: name.into(),
            reason,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let system = actix::System::new();
                let started = system.block_on(start());
                let ok = started.is_ok();
                let _ = ready_tx.send(started.map(|value| (actix::System::current(), value)));
                if ok {
                    let _ = system.run();
                }
            })
            .map_err(|e| failed(e.to_string()))?;
        let (system, value) = ready_rx
            .recv()
            .map_err(|_| failed("it exited during start-up".into()))??;
        Ok((
            Self {
                system,
                thread: Some(thread),
            },
            value,
        ))
    }

    /// Stops the System at once and waits for the thread.
    pub fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.system.stop();
            let _ = thread.join();
        }
    }
}

impl Drop for SystemThread {
    fn drop(&mut self) {
        self.stop();
    }
}
