//! The HTTP/1.1 server loop: hyper's connection builder with the configured connection
//! timeouts, graceful shutdown, and an I/O wrapper per connection that closes idle
//! connections and gives hyper's own automatic error answers (400 for an unparsable
//! request head or `Content-Length`, 414, 431) the JSON error envelope.

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// Connection timeouts (`[server]` header_read_timeout, idle_timeout; the body timeout
/// is applied where bodies are read, see [`crate::AppState::body_read_timeout`]).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionTimeouts {
    /// Longest wait for a complete request head.
    pub header_read: Duration,
    /// Longest a connection may send nothing while no request on it is being answered.
    pub idle: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the open
/// connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    timeouts: ConnectionTimeouts,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: log, back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let answering = Arc::new(AtomicUsize::new(0));
        let io = TokioIo::new(Connection::new(stream, timeouts.idle, answering.clone()));
        let app = app.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let guard = Answering::enter(&answering);
            let app = app.clone();
            async move {
                let response = app.oneshot(req.map(Body::new)).await;
                drop(guard);
                response
            }
        });
        let connection = graceful.watch(builder.serve_connection(io, service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Counts a request being answered on its connection while alive.
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn enter(count: &Arc<AtomicUsize>) -> Answering {
        count.fetch_add(1, Ordering::SeqCst);
        Answering(count.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One accepted connection: closes itself after `idle` without a byte read or written
/// while no request is being answered, and rewrites hyper's body-less automatic error
/// answers into enveloped ones.
struct Connection {
    inner: TcpStream,
    idle: Duration,
    idle_deadline: Pin<Box<Sleep>>,
    answering: Arc<AtomicUsize>,
    /// A rewritten answer still to be written, and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl Connection {
    fn new(inner: TcpStream, idle: Duration, answering: Arc<AtomicUsize>) -> Connection {
        Connection {
            inner,
            idle,
            idle_deadline: Box::pin(tokio::time::sleep(idle)),
            answering,
            pending: None,
        }
    }

    fn touch(&mut self) {
        let deadline = Instant::now() + self.idle;
        self.idle_deadline.as_mut().reset(deadline);
    }

    /// Writes what is left of a rewritten answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written >= bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.touch();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                if this.answering.load(Ordering::SeqCst) == 0
                    && this.idle_deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection was idle for too long",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        this.touch();
        if let Some(answer) = enveloped_automatic_answer(buf) {
            this.pending = Some((answer, 0));
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// hyper answers a request head it cannot parse by itself, with a status and no body
/// (`Content-Length: 0`, no `Content-Type`); every answer of the router has a body. Such
/// an answer, written in one piece (the wrapper does not offer vectored writes, so hyper
/// flattens each message), is replaced by the same status with the error envelope.
fn enveloped_automatic_answer(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let (code, message) = match rest.get(..3)? {
        b"400" => (
            "malformed_request",
            "the request is not valid HTTP/1.1: its request line, a header or its Content-Length cannot be parsed",
        ),
        b"414" => ("uri_too_long", "the request target is too long"),
        b"431" => (
            "request_header_fields_too_large",
            "the request's headers are too large or too many",
        ),
        _ => return None,
    };
    // The whole message must be this head: no body follows it.
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if end != buf.len() {
        return None;
    }
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines: Vec<&str> = head.split("\r\n").filter(|l| !l.is_empty()).collect();
    let status_line = lines.remove(0);
    let mut kept = Vec::new();
    for line in lines {
        let name = line.split(':').next().unwrap_or_default().trim();
        if name.eq_ignore_ascii_case("content-type")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            if line.split(':').nth(1).map(str::trim) != Some("0") {
                return None;
            }
            continue;
        }
        if name.eq_ignore_ascii_case("connection") {
            continue;
        }
        kept.push(line);
    }
    let body = serde_json::json!({"error": {"code": code, "message": message}}).to_string();
    let mut out = format!("{status_line}\r\n");
    for line in kept {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::enveloped_automatic_answer;

    #[test]
    fn automatic_answers_get_the_envelope() {
        let out = enveloped_automatic_answer(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n",
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "request_header_fields_too_large");
    }

    #[test]
    fn answers_with_bodies_are_left_alone() {
        assert!(
            enveloped_automatic_answer(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
            )
            .is_none()
        );
        assert!(
            enveloped_automatic_answer(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
            )
            .is_none()
        );
        assert!(
            enveloped_automatic_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none()
        );
    }
}
