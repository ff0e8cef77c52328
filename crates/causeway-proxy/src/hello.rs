//! The server name (SNI) of a TLS ClientHello, read from the first bytes a
//! client sends, which the proxy peeks without terminating TLS.
//!
//! Sans-IO: the caller passes whatever bytes it has so far and is told to
//! wait for more, or what it found; a [`HelloReader`] remembers what it
//! has read, so each new read costs only its new bytes. The hello may span
//! several TCP segments and several TLS records (a post-quantum key share
//! makes it about 2 KB); at most [`MAX_HELLO`] bytes are ever considered.

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

#[cfg(test)]
thread_local! {
    /// Bytes the parser has looked at or copied on this thread, so a test
    /// can tell linear work from quadratic.
    static EXAMINED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[inline]
fn examined(_n: usize) {
    #[cfg(test)]
    EXAMINED.with(|e| e.set(e.get() + _n));
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.buf.get(self.at)?;
        examined(1);
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
        examined(n);
        self.at += n;
        Some(s)
    }
}

/// Reads a ClientHello as it arrives, for a caller that reads the client's
/// socket and hands over every time the whole of what came so far.
///
/// Each TLS record is taken in once, when it is whole, and the hello is
/// parsed once, when the length its header gives has arrived: so every
/// feed costs the new bytes, not all of them again. A hello sent a byte
/// per segment would otherwise cost work quadratic in its size (a 16 KB
/// one, 128 MB of scanning).
#[derive(Debug, Default)]
pub struct HelloReader {
    /// Where the first record not yet taken in starts.
    at: usize,
    /// The handshake bytes of the records taken in.
    handshake: Vec<u8>,
    /// Records taken in.
    records: usize,
    /// The fragment length of the record at `at`, once its header is in.
    record_len: Option<usize>,
    /// The hello's whole length, header included, once its header is in.
    needed: Option<usize>,
    /// The length of the buffer last fed.
    fed: usize,
}

impl HelloReader {
    /// Looks for the server name in `buf`, the client's first bytes so
    /// far: what the last call was given followed by what came since.
    /// Once the answer is not [`Peek::NeedMore`], feeding more is not
    /// meaningful.
    pub fn feed(&mut self, buf: &[u8]) -> Peek {
        if buf.len() < self.fed {
            // Not the buffer fed before: start over rather than trust
            // positions into it.
            *self = HelloReader::default();
        }
        self.fed = buf.len();
        // Take in the records completed since the last call.
        let partial = loop {
            let rest = buf.get(self.at..).unwrap_or_default();
            let len = match self.record_len {
                Some(len) => len,
                None => match record_header(rest, self.records) {
                    Err(why) => return Peek::NotTls(why),
                    Ok(None) => break &[][..],
                    Ok(Some(len)) => *self.record_len.insert(len),
                },
            };
            // Only the fragment's length is compared here: its bytes are
            // read when it is copied whole, or at the full parse.
            let fragment = rest.get(RECORD_HEADER..).unwrap_or_default();
            let Some(whole) = fragment.get(..len) else {
                break fragment;
            };
            examined(whole.len());
            self.handshake.extend_from_slice(whole);
            self.records += 1;
            self.at += RECORD_HEADER + len;
            self.record_len = None;
            if let Some(found) = self.hello(&[]) {
                return found;
            }
        };
        if buf.len() >= MAX_HELLO {
            return Peek::NotTls(NotTls::TooLarge);
        }
        self.hello(partial).unwrap_or(Peek::NeedMore)
    }

    /// The hello in the handshake bytes taken in followed by `partial`
    /// (the part of the next record that has arrived): `None` while they
    /// are too few. Until the hello's header is whole only its bytes are
    /// read; after, only lengths are compared, until the one full parse.
    fn hello(&mut self, partial: &[u8]) -> Option<Peek> {
        let have = self.handshake.len() + partial.len();
        let needed = match self.needed {
            Some(n) => n,
            None => {
                let mut header = [0u8; 4];
                let mut got = 0;
                for (slot, b) in header.iter_mut().zip(self.handshake.iter().chain(partial)) {
                    *slot = *b;
                    got += 1;
                }
                examined(got);
                let mut r = Reader {
                    buf: &header[..got],
                    at: 0,
                };
                if r.u8()? != HANDSHAKE_CLIENT_HELLO {
                    return Some(Peek::NotTls(NotTls::NotClientHello));
                }
                let len = r.u24()?;
                if len > MAX_HELLO {
                    return Some(Peek::NotTls(NotTls::TooLarge));
                }
                *self.needed.insert(4 + len)
            }
        };
        if have < needed {
            return None;
        }
        if self.handshake.len() >= needed {
            return read_hello(&self.handshake);
        }
        examined(partial.len());
        read_hello(&[self.handshake.as_slice(), partial].concat())
    }
}

/// Looks for the server name in `buf`, the client's first bytes so far, in
/// one go; a caller that reads more and asks again uses a [`HelloReader`].
pub fn peek(buf: &[u8]) -> Peek {
    HelloReader::default().feed(buf)
}

const RECORD_HEADER: usize = 5;

/// The fragment length from the header of the record at the start of
/// `rest`, the `index`th of the flight: `None` while the header is not all
/// here, though what is here is checked at once.
fn record_header(rest: &[u8], index: usize) -> Result<Option<usize>, NotTls> {
    let mut r = Reader { buf: rest, at: 0 };
    let Some(content_type) = r.u8() else {
        return Ok(None);
    };
    if content_type != CONTENT_HANDSHAKE {
        return Err(if index == 0 {
            NotTls::NotHandshake
        } else {
            NotTls::Malformed
        });
    }
    let Some(major) = r.u8() else {
        return Ok(None);
    };
    if major != 3 {
        return Err(NotTls::NotHandshake);
    }
    let (Some(_minor), Some(len)) = (r.u8(), r.u16()) else {
        return Ok(None);
    };
    if len == 0 {
        return Err(NotTls::Malformed);
    }
    Ok(Some(usize::from(len)))
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

    /// Bytes examined by the parser on this thread while `f` runs.
    fn examined_by(f: impl FnOnce()) -> usize {
        let before = EXAMINED.with(|e| e.get());
        f();
        EXAMINED.with(|e| e.get()) - before
    }

    /// A hello arriving one byte per segment, as a slow or hostile client
    /// may send it: each read must cost the parser its new bytes, not the
    /// whole buffer again, or a 16 KB hello costs 128 MB of scanning.
    #[test]
    fn a_hello_fed_one_byte_at_a_time_is_scanned_in_linear_time() {
        for hello in [
            client_hello("api.hc1.example.com"),
            reframe(&client_hello("api.hc1.example.com"), 50),
            padded("konnectivity.hc1.example.com", 8000),
        ] {
            let mut reader = HelloReader::default();
            let mut found = Peek::NeedMore;
            let work = examined_by(|| {
                for end in 1..=hello.len() {
                    found = reader.feed(&hello[..end]);
                    if found != Peek::NeedMore {
                        assert_eq!(end, hello.len(), "found before the last byte");
                    }
                }
            });
            assert!(matches!(found, Peek::Sni(_)), "{found:?}");
            // Copying each record once and the one full parse (whose
            // nested lengths count some bytes more than once) come to about
            // three times the length; a parse at every byte, to its square.
            assert!(
                work <= 5 * hello.len(),
                "a {} byte hello fed one byte at a time cost {work} bytes of scanning",
                hello.len()
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000)) {
            let _ = peek(&bytes);
        }

        /// Fed in pieces, the reader answers at every step as a fresh
        /// read of all the bytes so far would, until it has its answer.
        #[test]
        fn feeding_in_pieces_agrees_with_reading_at_once(
            flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 0..4),
            cuts in proptest::collection::vec(1usize..40, 1..60),
            record in 1usize..300,
        ) {
            let mut hello = reframe(&client_hello("api.hc1.example.com"), record);
            for (at, v) in flips {
                if let Some(b) = hello.get_mut(at) { *b = v; }
            }
            let mut reader = HelloReader::default();
            let mut end = 0;
            for cut in cuts.iter().cycle() {
                end = (end + cut).min(hello.len());
                let got = reader.feed(&hello[..end]);
                proptest::prop_assert_eq!(&got, &peek(&hello[..end]), "at {}", end);
                if got != Peek::NeedMore || end == hello.len() {
                    break;
                }
            }
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
