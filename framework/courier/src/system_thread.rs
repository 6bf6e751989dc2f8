//! An actor tree on its own thread and actix System, so a process (or a test) can run a relay
//! and consumers beside other work and stop one abruptly — every connection, stream and
//! in-flight message dropped, as `kill -9` would, minus the process exit.
//!
//! A tree whose Pub/Sub clients carry its load (the relay's publishers) gets a
//! [`ClientRuntime`] beside it: the clients' encoding, HTTP/2 and retry bookkeeping then run on
//! their own worker threads instead of competing with every actor on the System's one thread.
//! It stops with the tree, so a stopped tree sends nothing more.

use std::future::Future;
use std::thread::JoinHandle;
use tokio::runtime::{Handle, Runtime};

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
    /// Stopped after the System, so no client outlives the actors that used it.
    clients: Option<ClientRuntime>,
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
        Self::spawn_inner(name, None, start)
    }

    /// Like [`SystemThread::spawn`], with a [`ClientRuntime`] whose handle `start` receives:
    /// build the tree's Pub/Sub clients on it.
    pub fn spawn_with_clients<T, E, F, Fut>(name: &str, start: F) -> Result<(Self, T), E>
    where
        F: FnOnce(Handle) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>>,
        T: Send + 'static,
        E: From<ThreadStartError> + Send + 'static,
    {
        let clients = ClientRuntime::new(name)?;
        let handle = clients.handle();
        Self::spawn_inner(name, Some(clients), move || start(handle))
    }

    fn spawn_inner<T, E, F, Fut>(
        name: &str,
        clients: Option<ClientRuntime>,
        start: F,
    ) -> Result<(Self, T), E>
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
                clients,
            },
            value,
        ))
    }

    /// Stops the System at once and waits for the thread, then stops the clients' runtime.
    pub fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.system.stop();
            let _ = thread.join();
        }
        if let Some(mut clients) = self.clients.take() {
            clients.stop();
        }
    }
}

impl Drop for SystemThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A multi-thread tokio runtime for an actor tree's Pub/Sub clients (see the module doc).
/// Stopping it drops its tasks without waiting for them, from any context.
pub struct ClientRuntime {
    runtime: Option<Runtime>,
    handle: Handle,
}

impl ClientRuntime {
    /// One worker per core, at most four: the clients' work is CPU-light per message but
    /// comes in bursts of thousands.
    pub fn new(name: &str) -> Result<Self, ThreadStartError> {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(format!("{name}-clients"))
            .enable_all()
            .build()
            .map_err(|e| ThreadStartError {
                thread: format!("{name}-clients"),
                reason: e.to_string(),
            })?;
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// Where to spawn; after `stop`, what is spawned here fails at once.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn stopping_the_tree_stops_its_client_runtime() {
        let (mut tree, clients) =
            SystemThread::spawn_with_clients("test-tree", |clients| async move {
                Ok::<_, ThreadStartError>(clients)
            })
            .expect("tree starts");
        let (alive, ended) = tokio::sync::oneshot::channel::<()>();
        clients.spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        });
        tree.stop();
        // The task is dropped with the runtime, which closes the channel.
        tokio::time::timeout(Duration::from_secs(10), ended)
            .await
            .expect("the client task ended with the tree")
            .expect_err("the task was dropped, not completed");
        let late = clients.spawn(async {}).await;
        assert!(late.is_err(), "a stopped runtime runs nothing new");
    }
}
