//! A TCP listener bound to an address and, optionally, to one interface
//! (`SO_BINDTODEVICE`): how the admin server and the lease stream keep to
//! the management network or the peer link when they are given one.

use std::net::{SocketAddr, TcpListener};

/// Binds `addr` (reusing an address in TIME_WAIT, so a restart binds at
/// once) on `interface` if given, and listens with `backlog`. Blocking;
/// the caller sets non-blocking mode for an async runtime.
pub fn tcp(
    addr: SocketAddr,
    interface: Option<&str>,
    backlog: i32,
) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if let Some(name) = interface {
        socket.bind_device(Some(name.as_bytes()))?;
    }
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_on_port_zero_accepts() -> std::io::Result<()> {
        let listener = tcp(SocketAddr::from(([127, 0, 0, 1], 0)), None, 8)?;
        let bound = listener.local_addr()?;
        let _client = std::net::TcpStream::connect(bound)?;
        let (_conn, from) = listener.accept()?;
        assert!(from.ip().is_loopback());
        Ok(())
    }
}
