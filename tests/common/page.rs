//! A page on an origin of its own (a loopback port): what a browser test loads to act as
//! another site.

use std::io::{Read, Write};

/// Serves `page` (HTML) to every request on a free loopback port, for as long as the test
/// process runs; the port.
pub fn serve(page: String) -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", super::free_port())).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    port
}
