//! Accept loop that serves the router and lets a handler drop its own
//! connection, which `axum::serve` cannot do (needed for reset faults).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// Put in each request's extensions; notifying it drops the connection.
#[derive(Debug, Clone)]
pub struct ConnKill(pub Arc<Notify>);

/// Serves until `stop` fires or is dropped; then every connection is dropped.
pub async fn serve(listener: TcpListener, router: Router, mut stop: oneshot::Receiver<()>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                // Accept errors (e.g. too many files) are transient for a test server.
                if let Ok((stream, _)) = accepted {
                    conns.spawn(serve_conn(stream, router.clone()));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_conn(stream: TcpStream, router: Router) {
    let _ = stream.set_nodelay(true);
    let kill = Arc::new(Notify::new());
    let tag = ConnKill(kill.clone());
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(tag.clone());
        router.clone().oneshot(req.map(Body::new))
    });
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        // Dropping `conn` closes the socket with no response written.
        _ = kill.notified() => {}
    }
}
