//! Guest stdout/stderr capture that keeps only the most recent bytes.
//!
//! wasmtime's `MemoryOutputPipe` traps the guest once its capacity is used
//! up; a long-lived instance that logs a little on every call would then
//! fail after enough calls. This pipe never traps and keeps the tail.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Output stream that remembers the last `capacity` bytes written to it.
#[derive(Clone)]
pub(crate) struct TailPipe {
    buffer: Arc<Mutex<VecDeque<u8>>>,
    capacity: usize,
}

impl TailPipe {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            buffer: Arc::new(Mutex::new(VecDeque::with_capacity(capacity.min(4096)))),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<u8>> {
        // A panic while holding this lock cannot leave the bytes inconsistent.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, bytes: &[u8]) {
        let mut buffer = self.lock();
        let bytes = &bytes[bytes.len().saturating_sub(self.capacity)..];
        let overflow = (buffer.len() + bytes.len()).saturating_sub(self.capacity);
        buffer.drain(..overflow);
        buffer.extend(bytes);
    }

    /// Forgets what was written so far (called before each guest call).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// What was written since the last `clear`, lossily decoded.
    pub(crate) fn contents(&self) -> String {
        let buffer = self.lock();
        let (a, b) = buffer.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl OutputStream for TailPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(self.capacity.max(1))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TailPipe {
    async fn ready(&mut self) {}
}

impl AsyncWrite for TailPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for TailPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tail_and_never_fails() {
        let mut pipe = TailPipe::new(8);
        pipe.write(bytes::Bytes::from_static(b"hello ")).unwrap();
        pipe.write(bytes::Bytes::from_static(b"world")).unwrap();
        assert_eq!(pipe.contents(), "lo world");
        pipe.write(bytes::Bytes::from_static(b"0123456789abc"))
            .unwrap();
        assert_eq!(pipe.contents(), "56789abc");
        pipe.clear();
        assert_eq!(pipe.contents(), "");
    }
}
