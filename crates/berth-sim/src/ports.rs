//! A loopback port for a process a test starts next to the sim.

use std::sync::atomic::{AtomicU64, Ordering};

/// A port nobody listens on, for a process under test to bind next, below the kernel's
/// ephemeral range (32768 and up by default), where port 0 and outgoing connections take
/// theirs: a port taken from there and freed could become some other test's connection before
/// the process binds it, which then fails to start and leaves its test waiting for nothing.
pub fn free_port() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id())
        ^ u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos(),
        );
    for _ in 0..1000 {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(i.wrapping_mul(7_919)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000 on 127.0.0.1")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_free_port_is_below_the_ephemeral_range_and_can_be_bound() {
        let port = super::free_port();
        assert!((20_000..32_000).contains(&port), "{port}");
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
