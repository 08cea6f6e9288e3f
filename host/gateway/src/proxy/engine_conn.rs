//! Connections to engines: HTTP/1 over TCP, kept per host between calls,
//! each driven by the call that holds it.
//!
//! hyper's pooled client runs every connection as a task of its own, so a
//! call hands its request to that task and the task hands the answer back
//! (a wake-up and a scheduling each way, plus the pool's checkout): at 64
//! connections that was ~13 µs of the gateway's ~90 µs per call, and ~40 µs
//! of added latency at one (benches/gateway.rs). Here a call takes an idle
//! connection (or opens one), polls it alongside its own request until the
//! answer's head is in, and the answer's body keeps polling it while the
//! body is read (whole or streamed); once the body ends, the connection goes
//! back idle. A body dropped before its end drops the connection, which is
//! how an engine learns that its client left (vLLM and the embedded engine
//! abort the sequence).

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::header::{CONTENT_TYPE, HOST};
use axum::http::uri::PathAndQuery;
use axum::http::{HeaderValue, Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How long a connection may sit idle before it is closed.
const IDLE_FOR: Duration = Duration::from_secs(90);

/// Most idle connections kept per host.
const IDLE_PER_HOST: usize = 1024;

/// One connection: the request side and the connection's I/O, which makes
/// progress only while polled.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    io: http1::Connection<TokioIo<TcpStream>, Full<Bytes>>,
}

/// An idle connection and since when. Boxed: a connection is ~1 KiB of
/// hyper state, moved at each step of a call (taken, sent on, handed to
/// the answer's body, put back), and a box moves as a pointer.
type Idle = (Box<Conn>, Instant);

/// Idle connections by `host:port` (port 80 when the URL has none).
#[derive(Clone, Default)]
pub struct EngineConns {
    idle: Arc<Mutex<HashMap<String, Vec<Idle>>>>,
}

impl EngineConns {
    /// Sends `body` to `url` (`http://` only) with `method`; the answer's
    /// head, its body still to be read.
    pub async fn request(
        &self,
        method: Method,
        url: &str,
        body: Bytes,
    ) -> Result<Response<Body>, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("engine URL `{url}`: {e}"))?;
        let (authority, host) = match (uri.scheme_str(), uri.authority(), uri.host()) {
            (Some("http"), Some(authority), Some(host)) => (
                HeaderValue::from_str(authority.as_str())
                    .map_err(|e| format!("engine URL `{url}`: {e}"))?,
                format!("{host}:{}", uri.port_u16().unwrap_or(80)),
            ),
            _ => {
                return Err(format!(
                    "engine URL `{url}`: engines are served over http://"
                ));
            }
        };
        // The request names the path alone (origin form), taken from the
        // parsed URL rather than parsed again; each step sets a field in
        // place (a builder moves the whole request head at each).
        let mut parts = uri.into_parts();
        parts.scheme = None;
        parts.authority = None;
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
        }
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() =
            Uri::from_parts(parts).map_err(|e| format!("engine URL `{url}`: {e}"))?;
        let headers = request.headers_mut();
        headers.insert(HOST, authority);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        loop {
            let (conn, reused) = match self.take_idle(&host) {
                Some(conn) => (conn, true),
                None => (connect(&host).await?, false),
            };
            match conn.send(request).await {
                Ok((head, conn)) => {
                    let (parts, body) = head.into_parts();
                    let body = Driven {
                        body,
                        conn,
                        host,
                        pool: self.clone(),
                    };
                    return Ok(Response::from_parts(parts, Body::new(body)));
                }
                // The engine closed an idle connection before it took the
                // request (it never saw it): another connection.
                Err(Failed::Unsent(again, _)) if reused => request = *again,
                Err(Failed::Unsent(_, message) | Failed::Sent(message)) => return Err(message),
            }
        }
    }

    /// An idle connection to `host` that is still open, if any.
    fn take_idle(&self, host: &str) -> Option<Box<Conn>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.get_mut(host)?;
        while let Some((mut conn, since)) = conns.pop() {
            if since.elapsed() < IDLE_FOR && conn.is_open() {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, host: String, conn: Box<Conn>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.entry(host).or_default();
        // Pushed here and taken from the back, so oldest first: the expired
        // ones are a prefix.
        let expired = conns.partition_point(|(_, since)| since.elapsed() >= IDLE_FOR);
        conns.drain(..expired);
        if conns.len() < IDLE_PER_HOST {
            conns.push((conn, Instant::now()));
        }
    }
}

async fn connect(host: &str) -> Result<Box<Conn>, String> {
    let stream = TcpStream::connect(host)
        .await
        .map_err(|e| format!("connecting to {host}: {e}"))?;
    // Requests and answers are written whole: no need to wait for more.
    let _ = stream.set_nodelay(true);
    let (send, io) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("connecting to {host}: {e}"))?;
    Ok(Box::new(Conn { send, io }))
}

/// Why a request got no answer head.
enum Failed {
    /// The connection could not take it; the request is given back.
    Unsent(Box<Request<Full<Bytes>>>, String),
    /// It went out (or may have): not to be sent again here.
    Sent(String),
}

impl Conn {
    /// Whether the connection can take a request: polled once, without a
    /// waker of any use (nobody waits on an idle connection), it ends if
    /// the engine closed it.
    fn is_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        if Pin::new(&mut self.io).poll(&mut cx).is_ready() {
            return false;
        }
        matches!(self.send.poll_ready(&mut cx), Poll::Ready(Ok(())))
    }

    /// Sends `request`, polling the connection until the answer's head is
    /// in; the connection comes back with it unless it ended meanwhile (an
    /// engine that closes after each answer: the body is read all the same).
    async fn send(
        mut self: Box<Self>,
        request: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Option<Box<Conn>>), Failed> {
        let mut io_ended = false;
        let head = {
            let Conn { send, io } = &mut *self;
            let mut answer = pin!(send.try_send_request(request));
            poll_fn(|cx| {
                if let Poll::Ready(r) = answer.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if io_ended {
                    // hyper answers a request its connection dropped; if
                    // not, this ends it rather than wait forever.
                    return Poll::Ready(None);
                }
                if Pin::new(&mut *io).poll(cx).is_ready() {
                    io_ended = true;
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            })
            .await
        };
        match head {
            Some(Ok(head)) => Ok((head, (!io_ended).then_some(self))),
            Some(Err(mut e)) => {
                let message = format!("engine request: {}", super::upstream::chain(e.error()));
                match e.take_message() {
                    Some(request) => Err(Failed::Unsent(Box::new(request), message)),
                    None => Err(Failed::Sent(message)),
                }
            }
            None => Err(Failed::Sent(
                "the engine closed the connection before answering".into(),
            )),
        }
    }
}

/// An answer's body that drives its connection while it is read, and puts
/// the connection back idle at its end.
struct Driven {
    body: Incoming,
    conn: Option<Box<Conn>>,
    host: String,
    pool: EngineConns,
}

impl hyper::body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => {
                if let Some(mut conn) = this.conn.take() {
                    // Let it see the body is done, so it can take the next
                    // request; a connection that ended is not kept.
                    if !Pin::new(&mut conn.io).poll(cx).is_ready() {
                        this.pool.put_idle(std::mem::take(&mut this.host), conn);
                    }
                }
            }
            Poll::Pending => {
                // The body's bytes come in only while the connection is
                // polled; if it ended, the body ends (or fails) next.
                if let Some(conn) = this.conn.as_mut()
                    && Pin::new(&mut conn.io).poll(cx).is_ready()
                {
                    this.conn = None;
                    cx.waker().wake_by_ref();
                }
            }
            Poll::Ready(Some(_)) => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An engine that answers `ok` to each request and counts the
    /// connections it accepted; with `close`, it closes each connection
    /// after its first answer.
    async fn engine(close: bool) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/v1/x", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    // One read holds a whole small request on loopback.
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(answer).await.is_err() || close {
                            break;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    async fn call(conns: &EngineConns, url: &str) -> Result<Bytes, String> {
        let response = conns.request(Method::POST, url, Bytes::from("{}")).await?;
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn calls_one_after_another_share_a_connection() {
        let (url, accepted) = engine(false).await;
        let conns = EngineConns::default();
        for _ in 0..3 {
            assert_eq!(call(&conns, &url).await.expect("call"), "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_engine_closed_is_replaced() {
        let (url, accepted) = engine(true).await;
        let conns = EngineConns::default();
        for _ in 0..3 {
            assert_eq!(call(&conns, &url).await.expect("call"), "ok");
            // The engine's close reaches this end before the next call.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (url, accepted) = engine(false).await;
        let conns = EngineConns::default();
        let response = conns
            .request(Method::POST, &url, Bytes::from("{}"))
            .await
            .expect("head");
        drop(response);
        assert_eq!(call(&conns, &url).await.expect("call"), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_url_without_a_port_is_port_80() {
        let conns = EngineConns::default();
        // Nothing listens on port 80 here: the error names where it went.
        let err = call(&conns, "http://127.0.0.1/v1/x")
            .await
            .expect_err("port 80");
        assert!(err.contains("127.0.0.1:80"), "{err}");
    }

    #[tokio::test]
    async fn only_http_urls_are_served() {
        let conns = EngineConns::default();
        let err = call(&conns, "https://engine:8000/v1/x")
            .await
            .expect_err("https");
        assert!(err.contains("http://"), "{err}");
    }
}
