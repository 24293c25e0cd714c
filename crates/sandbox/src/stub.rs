//! A stub HTTP/1.1 server on loopback, for what tests and benchmarks stand
//! up beside the sandbox: a Prometheus, an exporter, a metric source.
//! Each connection's request head goes to a handler, whose answer is sent
//! with `Connection: close`.

use std::future::Future;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a stub answers: the status line's rest (`200 OK`, or one with
/// headers after it, `302 Found\r\nLocation: ...`), the content type and
/// the body.
pub struct Answer {
    pub status: String,
    pub content_type: &'static str,
    pub body: String,
}

impl Answer {
    pub fn ok(content_type: &'static str, body: impl Into<String>) -> Self {
        Self {
            status: "200 OK".into(),
            content_type,
            body: body.into(),
        }
    }
}

/// Serve on a free loopback port: each request's head (request line and
/// headers, as text) goes to `handle`. The port, and the task to abort.
pub async fn serve<F, Fut>(handle: F) -> std::io::Result<(u16, tokio::task::JoinHandle<()>)>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let a = handle(String::from_utf8_lossy(&got).into_owned()).await;
                let head = format!(
                    "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    a.status,
                    a.content_type,
                    a.body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(a.body.as_bytes()).await;
            });
        }
    });
    Ok((port, task))
}
