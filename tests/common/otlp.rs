//! A small OTLP/HTTP receiver: accepts `POST /v1/traces` (JSON), keeps every body, answers
//! 200 — or 503 when told to fail, like a collector that is down. Keep-alive, as exporters
//! use it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct OtlpReceiver {
    pub port: u16,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
    failing: Arc<AtomicBool>,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let port = listener.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let failing = Arc::new(AtomicBool::new(false));
        let (b, f) = (Arc::clone(&bodies), Arc::clone(&failing));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (b, f) = (Arc::clone(&b), Arc::clone(&f));
                std::thread::spawn(move || serve(stream, &b, &f));
            }
        });
        OtlpReceiver {
            port,
            bodies,
            failing,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    pub fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Every span received so far, flattened out of the resource / scope structure.
    pub fn spans(&self) -> Vec<serde_json::Value> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|body| {
                body["resourceSpans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .flat_map(|rs| rs["scopeSpans"].as_array().cloned().unwrap_or_default())
            .flat_map(|ss| ss["spans"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Every body received, as text.
    pub fn raw(&self) -> String {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn bodies(&self) -> Vec<serde_json::Value> {
        self.bodies.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, bodies: &Mutex<Vec<serde_json::Value>>, failing: &AtomicBool) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answer: &[u8] = if failing.load(Ordering::SeqCst) {
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
        } else {
            if request_line.starts_with("POST /v1/traces") {
                if let Ok(v) = serde_json::from_slice(&body) {
                    bodies.lock().unwrap().push(v);
                }
            }
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        };
        if writer.write_all(answer).is_err() {
            return;
        }
    }
}
