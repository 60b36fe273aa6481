//! A DNS server for tests (UDP, A records only): answers the names it is told, with a TTL of
//! one second, and NXDOMAIN for the rest; AAAA questions get an empty answer.

use std::collections::HashMap;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::{Arc, Mutex};

pub struct DnsServer {
    pub port: u16,
    records: Arc<Mutex<HashMap<String, Vec<Ipv4Addr>>>>,
}

impl DnsServer {
    pub fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind the DNS server");
        let port = socket.local_addr().unwrap().port();
        let records: Arc<Mutex<HashMap<String, Vec<Ipv4Addr>>>> = Arc::default();
        let table = Arc::clone(&records);
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                if let Some(reply) = answer(&buf[..n], &table.lock().unwrap()) {
                    let _ = socket.send_to(&reply, from);
                }
            }
        });
        DnsServer { port, records }
    }

    /// From now on `name` resolves to `addrs`.
    pub fn set(&self, name: &str, addrs: &[Ipv4Addr]) {
        self.records
            .lock()
            .unwrap()
            .insert(name.to_ascii_lowercase(), addrs.to_vec());
    }
}

fn answer(query: &[u8], records: &HashMap<String, Vec<Ipv4Addr>>) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    // The question: labels, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    let question = &query[12..i + 4];
    let name = labels.join(".");
    let found = records.get(&name);
    let addrs: &[Ipv4Addr] = match (found, qtype) {
        (Some(a), 1) => a,
        _ => &[],
    };
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(&query[..2]); // id
    let rcode = if found.is_none() { 3 } else { 0 };
    reply.extend_from_slice(&[0x81, 0x80 | rcode]); // response, recursion desired/available
    reply.extend_from_slice(&[0, 1]); // questions
    reply.extend_from_slice(&(addrs.len() as u16).to_be_bytes()); // answers
    reply.extend_from_slice(&[0, 0, 0, 0]); // authority, additional
    reply.extend_from_slice(question);
    for addr in addrs {
        reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]); // name (pointer), A, IN
        reply.extend_from_slice(&1u32.to_be_bytes()); // TTL
        reply.extend_from_slice(&[0, 4]);
        reply.extend_from_slice(&addr.octets());
    }
    Some(reply)
}
