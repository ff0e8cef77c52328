//! The server name (SNI) of a TLS ClientHello, read from the first bytes a
//! client sends, which the proxy peeks without terminating TLS.
//!
//! Sans-IO: the caller passes whatever bytes it has so far and is told to
//! wait for more, or what it found. The hello may span several TCP segments
//! and several TLS records (a post-quantum key share makes it about 2 KB);
//! at most [`MAX_HELLO`] bytes are ever considered.

use causeway_config::{valid_name, NameRules};

/// The most bytes of a client's first flight the proxy will hold to find
/// the name. A ClientHello of 16 KB is already far beyond real clients.
pub const MAX_HELLO: usize = 16 * 1024;

const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// The bytes so far are a valid prefix; read more.
    NeedMore,
    /// A ClientHello naming this server (lowercased, no trailing dot).
    Sni(String),
    /// A whole ClientHello without a server name.
    NoSni,
    /// Not TLS, or a malformed or oversized hello: route to the default.
    NotTls(NotTls),
}

/// Why the first bytes are not a readable ClientHello; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotTls {
    NotHandshake,
    NotClientHello,
    Malformed,
    TooLarge,
    BadName,
}

impl NotTls {
    pub fn label(self) -> &'static str {
        match self {
            NotTls::NotHandshake => "not_tls",
            NotTls::NotClientHello => "not_client_hello",
            NotTls::Malformed => "malformed",
            NotTls::TooLarge => "too_large",
            NotTls::BadName => "bad_name",
        }
    }
}

/// Reads bytes as a cursor that fails softly: running out means "need more"
/// for the caller to decide, never a panic.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.buf.get(self.at)?;
        self.at += 1;
        Some(v)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }

    fn u24(&mut self) -> Option<usize> {
        Some(usize::from(self.u8()?) << 16 | usize::from(self.u8()?) << 8 | usize::from(self.u8()?))
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
}

/// Looks for the server name in `buf`, the client's first bytes so far.
pub fn peek(buf: &[u8]) -> Peek {
    // Gather the handshake bytes out of the TLS records, as far as they go.
    let mut handshake: Vec<u8> = Vec::new();
    let mut records = Reader { buf, at: 0 };
    let mut complete_records = 0;
    loop {
        let start = records.at;
        let Some(content_type) = records.u8() else {
            break;
        };
        if content_type != CONTENT_HANDSHAKE {
            return if complete_records == 0 {
                Peek::NotTls(NotTls::NotHandshake)
            } else {
                Peek::NotTls(NotTls::Malformed)
            };
        }
        let Some(major) = records.u8() else { break };
        if major != 3 {
            return Peek::NotTls(NotTls::NotHandshake);
        }
        let (Some(_minor), Some(len)) = (records.u8(), records.u16()) else {
            break;
        };
        let len = usize::from(len);
        if len == 0 {
            return Peek::NotTls(NotTls::Malformed);
        }
        match records.take(len) {
            Some(fragment) => {
                handshake.extend_from_slice(fragment);
                complete_records += 1;
            }
            None => {
                // A partial record: use what it holds so far.
                handshake.extend_from_slice(&buf[(start + 5).min(buf.len())..]);
                break;
            }
        }
        if let Some(found) = read_hello(&handshake) {
            return found;
        }
        if records.at >= buf.len() {
            break;
        }
    }
    if buf.len() >= MAX_HELLO {
        return Peek::NotTls(NotTls::TooLarge);
    }
    match read_hello(&handshake) {
        Some(found) => found,
        None => Peek::NeedMore,
    }
}

/// Reads a ClientHello from handshake bytes: `None` when they end too soon.
fn read_hello(h: &[u8]) -> Option<Peek> {
    let mut r = Reader { buf: h, at: 0 };
    let kind = r.u8()?;
    if kind != HANDSHAKE_CLIENT_HELLO {
        return Some(Peek::NotTls(NotTls::NotClientHello));
    }
    let len = r.u24()?;
    if len > MAX_HELLO {
        return Some(Peek::NotTls(NotTls::TooLarge));
    }
    let body = r.take(len)?;
    Some(read_body(body))
}

/// A whole ClientHello body: anything short now is malformed.
fn read_body(body: &[u8]) -> Peek {
    let malformed = Peek::NotTls(NotTls::Malformed);
    let mut r = Reader { buf: body, at: 0 };
    // legacy_version, random
    if r.take(2 + 32).is_none() {
        return malformed;
    }
    let Some(session_len) = r.u8() else {
        return malformed;
    };
    let Some(cipher_len) = r.take(usize::from(session_len)).and_then(|_| r.u16()) else {
        return malformed;
    };
    let Some(compression_len) = r.take(usize::from(cipher_len)).and_then(|_| r.u8()) else {
        return malformed;
    };
    if r.take(usize::from(compression_len)).is_none() {
        return malformed;
    }
    if r.at == body.len() {
        // No extensions at all (an old client): no name.
        return Peek::NoSni;
    }
    let Some(ext_len) = r.u16() else {
        return malformed;
    };
    let Some(extensions) = r.take(usize::from(ext_len)) else {
        return malformed;
    };
    let mut e = Reader {
        buf: extensions,
        at: 0,
    };
    while e.at < extensions.len() {
        let (Some(kind), Some(len)) = (e.u16(), e.u16()) else {
            return malformed;
        };
        let Some(data) = e.take(usize::from(len)) else {
            return malformed;
        };
        if kind == EXTENSION_SERVER_NAME {
            return read_server_name(data);
        }
    }
    Peek::NoSni
}

fn read_server_name(data: &[u8]) -> Peek {
    let mut r = Reader { buf: data, at: 0 };
    let Some(list_len) = r.u16() else {
        return Peek::NotTls(NotTls::Malformed);
    };
    let Some(list) = r.take(usize::from(list_len)) else {
        return Peek::NotTls(NotTls::Malformed);
    };
    let mut l = Reader { buf: list, at: 0 };
    while l.at < list.len() {
        let (Some(kind), Some(len)) = (l.u8(), l.u16()) else {
            return Peek::NotTls(NotTls::Malformed);
        };
        let Some(name) = l.take(usize::from(len)) else {
            return Peek::NotTls(NotTls::Malformed);
        };
        if kind == NAME_TYPE_HOST {
            return match host_name(name) {
                Some(n) => Peek::Sni(n),
                None => Peek::NotTls(NotTls::BadName),
            };
        }
    }
    Peek::NoSni
}

/// A DNS host name as RFC 6066 requires it (ASCII, no trailing dot),
/// lowercased; anything else is refused rather than routed.
fn host_name(raw: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(raw).ok()?.trim_end_matches('.');
    valid_name(name, NameRules::DNS).then(|| name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A real ClientHello from rustls, as a client sends it.
    fn client_hello(name: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn a_real_client_hello_names_its_server() {
        let hello = client_hello("Oauth.HC1.example.com");
        assert_eq!(peek(&hello), Peek::Sni("oauth.hc1.example.com".into()));
    }

    #[test]
    fn a_hello_split_into_any_two_segments_is_read_once_whole() {
        let hello = client_hello("api.hc1.example.com");
        for cut in 0..hello.len() {
            assert_eq!(peek(&hello[..cut]), Peek::NeedMore, "cut at {cut}");
        }
        assert_eq!(peek(&hello), Peek::Sni("api.hc1.example.com".into()));
    }

    /// Re-frames a hello's handshake bytes into records of `size` bytes, as
    /// a client with small records (or a middlebox) would send it.
    fn reframe(hello: &[u8], size: usize) -> Vec<u8> {
        let handshake = &hello[5..];
        let mut out = Vec::new();
        for chunk in handshake.chunks(size) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn a_hello_spread_over_several_records_is_read() {
        let hello = reframe(&client_hello("ignition.hc1.example.com"), 100);
        assert!(hello.len() > 200);
        for cut in 0..hello.len() {
            assert_eq!(peek(&hello[..cut]), Peek::NeedMore, "cut at {cut}");
        }
        assert_eq!(peek(&hello), Peek::Sni("ignition.hc1.example.com".into()));
    }

    /// Pads a hello with an extension of `pad` bytes (RFC 7685), as big
    /// post-quantum key shares make it grow.
    fn padded(name: &str, pad: usize) -> Vec<u8> {
        let hello = client_hello(name);
        let mut hs = hello[5..].to_vec();
        let mut r = Reader {
            buf: &hs,
            at: 4 + 2 + 32,
        };
        let sid = usize::from(r.u8().unwrap());
        r.at += sid;
        let cs = usize::from(r.u16().unwrap());
        r.at += cs;
        let comp = usize::from(r.u8().unwrap());
        r.at += comp;
        let ext_len_at = r.at;
        let ext_len = usize::from(r.u16().unwrap());
        let mut ext = vec![0x00, 0x15];
        ext.extend_from_slice(&(pad as u16).to_be_bytes());
        ext.extend(std::iter::repeat_n(0u8, pad));
        hs.extend_from_slice(&ext);
        hs[ext_len_at..ext_len_at + 2]
            .copy_from_slice(&((ext_len + ext.len()) as u16).to_be_bytes());
        let body_len = hs.len() - 4;
        hs[1..4].copy_from_slice(&[
            (body_len >> 16) as u8,
            (body_len >> 8) as u8,
            body_len as u8,
        ]);
        reframe(&[[0u8; 5].as_slice(), &hs].concat(), 16 * 1024)
    }

    #[test]
    fn a_hello_padded_to_2_kb_is_read() {
        let hello = padded("konnectivity.hc1.example.com", 1800);
        assert!(hello.len() > 2000);
        assert_eq!(
            peek(&hello),
            Peek::Sni("konnectivity.hc1.example.com".into())
        );
        assert_eq!(peek(&hello[..1500]), Peek::NeedMore);
    }

    #[test]
    fn non_tls_bytes_are_recognised_at_once() {
        assert_eq!(
            peek(b"GET / HTTP/1.1\r\n"),
            Peek::NotTls(NotTls::NotHandshake)
        );
        assert_eq!(peek(b"SSH-2.0-OpenSSH"), Peek::NotTls(NotTls::NotHandshake));
        assert_eq!(peek(&[22, 2, 0]), Peek::NotTls(NotTls::NotHandshake));
        assert_eq!(peek(&[]), Peek::NeedMore);
    }

    #[test]
    fn an_oversized_hello_is_refused() {
        let mut hello = vec![22, 3, 1, 0x40, 0x00, 1, 0, 0x80, 0x00];
        hello.resize(MAX_HELLO + 10, 0);
        assert_eq!(peek(&hello), Peek::NotTls(NotTls::TooLarge));
    }

    #[test]
    fn a_hello_without_sni_says_so() {
        // rustls sends no SNI for an IP address.
        let hello = client_hello("192.168.100.2");
        assert_eq!(peek(&hello), Peek::NoSni);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000)) {
            let _ = peek(&bytes);
        }

        #[test]
        fn mutated_hellos_never_panic(flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 1..8)) {
            let mut hello = client_hello("api.hc1.example.com");
            for (at, v) in flips {
                if let Some(b) = hello.get_mut(at) { *b = v; }
            }
            let _ = peek(&hello);
        }
    }
}
