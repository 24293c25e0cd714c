//! Serving the sandbox over HTTP on 127.0.0.1, with a kubeconfig for it.

use std::net::SocketAddr;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Sandbox;

/// A running server; dropping it (or calling `stop`) shuts it down.
pub struct Served {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// A kubeconfig that points kubectl and kube clients here.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        kubeconfig(self.addr, namespace)
    }
}

pub fn kubeconfig(addr: SocketAddr, namespace: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: runbook-sandbox
  cluster:
    server: http://{addr}
contexts:
- name: runbook-sandbox
  context:
    cluster: runbook-sandbox
    user: runbook-sandbox
    namespace: {namespace}
current-context: runbook-sandbox
users:
- name: runbook-sandbox
  user: {{}}
"
    )
}

impl Sandbox {
    /// Serve on 127.0.0.1 at `port` (0 picks a free one).
    pub async fn serve(&self, port: u16) -> std::io::Result<Served> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let sandbox = self.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let svc = hyper::service::service_fn({
                            let sandbox = sandbox.clone();
                            move |req: hyper::Request<hyper::body::Incoming>| {
                                let mut svc = sandbox.service();
                                async move { tower::Service::call(&mut svc, req).await }
                            }
                        });
                        let mut conn_stopped = stopped.clone();
                        tokio::spawn(async move {
                            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                            tokio::pin!(conn);
                            tokio::select! {
                                _ = conn.as_mut() => {}
                                _ = conn_stopped.changed() => conn.as_mut().graceful_shutdown(),
                            }
                        });
                    }
                    _ = stopped.changed() => break,
                }
            }
        });
        Ok(Served { addr, stop, task })
    }
}
