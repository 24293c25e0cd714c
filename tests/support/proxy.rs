//! An API server outage, on either side: a TCP proxy on loopback in front
//! of the test's API server (the sandbox served over HTTP, or the real
//! control plane, whose TLS passes through untouched), and a client for
//! the operator that goes through it. `cut` drops every connection and
//! refuses new ones, as an API server that went away; `stall` holds every
//! connection without passing a byte, as a network that drops packets;
//! `restore` lets them through again. Other clients of the test talk to the API server directly.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use runbook_sandbox::serve::Served;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::cluster::{Cluster, real_cluster};

/// What the proxy does with connections.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Cut,
    Stalled,
}

pub struct Proxy {
    pub addr: SocketAddr,
    open: Arc<watch::Sender<State>>,
    task: tokio::task::JoinHandle<()>,
    _served: Option<Served>,
    upstream_scheme: &'static str,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// A proxy in front of the test's API server, open.
    pub async fn start(c: &Cluster) -> Self {
        let (upstream, served, scheme) = match &c.sandbox {
            Some(sandbox) => {
                let served = sandbox.serve(0).await.expect("serving the sandbox");
                (served.addr, Some(served), "http")
            }
            None => {
                let config = kube_config().await;
                let host = config.cluster_url.host().unwrap_or("127.0.0.1").to_string();
                let port = config.cluster_url.port_u16().unwrap_or(443);
                let addr = tokio::net::lookup_host((host.as_str(), port))
                    .await
                    .expect("resolving the API server")
                    .next()
                    .expect("an address for the API server");
                (addr, None, "https")
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, _) = watch::channel(State::Open);
        let open = Arc::new(open);
        let o = open.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut state = o.subscribe();
                let now = *state.borrow();
                match now {
                    State::Cut => {
                        drop(inbound); // the API server is away
                        continue;
                    }
                    State::Stalled => {
                        // Accepted, never answered, until the stall ends.
                        tokio::spawn(async move {
                            let _ = state.wait_for(|s| *s != State::Stalled).await;
                            drop(inbound);
                        });
                        continue;
                    }
                    State::Open => {}
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = state.wait_for(|s| *s != State::Open) => {}
                    }
                    // Stalled: held, silent, until the stall ends.
                    let _ = state.wait_for(|s| *s != State::Stalled).await;
                });
            }
        });
        Self {
            addr,
            open,
            task,
            _served: served,
            upstream_scheme: scheme,
        }
    }

    /// Drop every connection and refuse new ones.
    pub fn cut(&self) {
        self.open.send_replace(State::Cut);
    }

    /// Hold every connection, open and new, without passing a byte.
    pub fn stall(&self) {
        self.open.send_replace(State::Stalled);
    }

    /// Let connections through again.
    pub fn restore(&self) {
        self.open.send_replace(State::Open);
    }

    /// A client whose every request goes through the proxy.
    pub async fn client(&self) -> Client {
        let mut config = match real_cluster() {
            Some(_) => kube_config().await,
            None => kube::Config::new(format!("http://{}", self.addr).parse().unwrap()),
        };
        config.cluster_url = format!("{}://{}", self.upstream_scheme, self.addr)
            .parse()
            .unwrap();
        Client::try_from(config).expect("a client through the proxy")
    }
}

async fn kube_config() -> kube::Config {
    let path = real_cluster().expect("a real cluster");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("reading the kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("the kubeconfig")
}
