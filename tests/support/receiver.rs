//! HTTP receivers on 127.0.0.1 for alert delivery tests: one records what
//! it is sent, one fails a number of times first, one never answers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Answer 200.
    Accept,
    /// Answer 500 to the first `n` requests, then 200.
    FailFirst(usize),
    /// Answer 500 always.
    Fail,
    /// Read the request and never answer.
    Hang,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub body: serde_json::Value,
}

pub struct Receiver {
    pub port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    seen: Arc<AtomicUsize>,
}

impl Receiver {
    pub fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(AtomicUsize::new(0));
        let (r, s) = (requests.clone(), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (r, s) = (r.clone(), s.clone());
                std::thread::spawn(move || serve(stream, behaviour, r, s));
            }
        });
        Self {
            port,
            requests,
            seen,
        }
    }

    /// A URL on this receiver with `path` (which may carry a token).
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Requests read so far (answered or not).
    pub fn count(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    behaviour: Behaviour,
    requests: Arc<Mutex<Vec<Request>>>,
    seen: Arc<AtomicUsize>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let n = seen.fetch_add(1, Ordering::SeqCst);
        requests.lock().unwrap().push(Request {
            path,
            body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        });
        let code = match behaviour {
            Behaviour::Accept => 200,
            Behaviour::FailFirst(k) if n < k => 500,
            Behaviour::FailFirst(_) => 200,
            Behaviour::Fail => 500,
            Behaviour::Hang => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                return;
            }
        };
        let reason = if code == 200 {
            "OK"
        } else {
            "Internal Server Error"
        };
        let reply = format!("HTTP/1.1 {code} {reason}\r\ncontent-length: 0\r\n\r\n");
        if stream.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}
