//! Never dial yourself: a backend address that is one of crossbar's own listen
//! addresses (a wildcard listener matches every local address on its port),
//! `0.0.0.0`/`::`, or port 0 would make crossbar connect to itself, and each such
//! connection would open another. `crossbar check` refuses one in the file,
//! `crossbar doctor` one that DNS gives, and discovery leaves one out of an answer.
use std::net::{IpAddr, SocketAddr};

use super::checker::Checker;
use super::ServiceConfig;

/// Why a backend address is crossbar itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OwnAddress {
    /// Port 0 is no port anything listens on.
    #[error("port 0 is not a port a backend listens on")]
    PortZero,
    /// `0.0.0.0` or `::` names no host; connecting to it reaches this machine.
    #[error("{0} is the wildcard address: connecting to it reaches this machine itself")]
    Unspecified(IpAddr),
    /// One of crossbar's own listen addresses.
    #[error("it is crossbar's own listen address {0}: crossbar would connect to itself, each connection opening another")]
    Listener(SocketAddr),
}

/// Whether `ip` is an address of this machine: one a socket can be bound to
/// (without IP_FREEBIND). Every 127/8 and ::1 is.
pub fn is_local_address(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Why `backend` would be crossbar itself, given the addresses it listens on
/// (`listens`; a wildcard one on the same port matches every address `is_local`
/// says is this machine's); `None` when it is another host.
pub fn own_address(
    backend: SocketAddr,
    listens: &[SocketAddr],
    is_local: impl Fn(IpAddr) -> bool,
) -> Option<OwnAddress> {
    let ip = backend.ip().to_canonical();
    if backend.port() == 0 {
        return Some(OwnAddress::PortZero);
    }
    if ip.is_unspecified() {
        return Some(OwnAddress::Unspecified(ip));
    }
    listens
        .iter()
        .filter(|l| l.port() == backend.port())
        .find(|l| {
            let at = l.ip().to_canonical();
            at == ip || (at.is_unspecified() && is_local(ip))
        })
        .map(|l| OwnAddress::Listener(*l))
}

/// Every listen address of `services` (port 0 ones included: they match nothing
/// until bound, see the running server's own list).
pub fn listen_addresses(services: &[ServiceConfig]) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = services
        .iter()
        .flat_map(|s| s.listen.iter().map(|l| l.addr))
        .collect();
    out.sort();
    out.dedup();
    out
}

impl Checker<'_> {
    /// Refuse every configured backend that is crossbar itself (validation is pure:
    /// a wildcard listener matches the loopback addresses here; `crossbar doctor`
    /// and discovery ask the machine for the rest).
    pub(super) fn own_addresses(&mut self, services: &[ServiceConfig]) {
        let listens = listen_addresses(services);
        for svc in services {
            for (i, b) in svc.backends.iter().enumerate() {
                let Some(sa) = b.address.as_socket_addr() else {
                    continue;
                };
                if let Some(why) = own_address(sa, &listens, |ip| ip.is_loopback()) {
                    let p = format!("services.{}.backends[{i}].address", svc.name);
                    self.err(&p, format!("`{}`: {why}", b.address));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_backend_is_crossbar_itself_at_its_listen_address_the_wildcard_or_port_0() {
        let listens = [sa("127.0.44.1:23000"), sa("0.0.0.0:8140"), sa("[::]:8141")];
        let local = |ip: IpAddr| ip.is_loopback() || ip == "10.0.0.5".parse::<IpAddr>().unwrap();
        let own = |b: &str| own_address(sa(b), &listens, local);
        assert_eq!(
            own("127.0.44.1:23000"),
            Some(OwnAddress::Listener(listens[0]))
        );
        assert_eq!(own("10.0.0.5:8140"), Some(OwnAddress::Listener(listens[1])));
        assert_eq!(
            own("127.0.0.1:8141"),
            Some(OwnAddress::Listener(listens[2]))
        );
        assert_eq!(
            own("[::ffff:10.0.0.5]:8140"),
            Some(OwnAddress::Listener(listens[1]))
        );
        assert!(matches!(
            own("0.0.0.0:23000"),
            Some(OwnAddress::Unspecified(_))
        ));
        assert!(matches!(own("[::]:9"), Some(OwnAddress::Unspecified(_))));
        assert_eq!(own("10.0.0.9:0"), Some(OwnAddress::PortZero));
        assert_eq!(own("10.0.0.9:8140"), None, "another host");
        assert_eq!(own("127.0.44.1:23001"), None, "another port");
        assert_eq!(own("127.0.44.2:23000"), None, "another address");
    }

    #[test]
    fn loopback_is_local_and_a_documentation_address_is_not() {
        assert!(is_local_address("127.0.0.1".parse().unwrap()));
        assert!(is_local_address("127.9.9.9".parse().unwrap()));
        assert!(!is_local_address("192.0.2.1".parse().unwrap()));
    }
}
