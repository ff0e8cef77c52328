//! PKCS#10 requests written field by field, for tests: the shapes no
//! honest library writes (two `extensionRequest` attributes, an attribute
//! with two values, an extension asked for twice, an attribute of another
//! kind), signed with a real key so that only the shape is wrong.
//!
//! Built only for tests (`cfg(test)` or the `test-support` feature): a
//! key that does not load or sign is a broken fixture, so it panics.

#![allow(clippy::expect_used)]

use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, RsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING, RSA_PKCS1_SHA256};

/// A DER tag, length and value.
pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(0x30, &parts.concat())
}

fn set(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(0x31, &parts.concat())
}

/// An OBJECT IDENTIFIER from its dotted arcs.
pub fn oid(arcs: &[u64]) -> Vec<u8> {
    let mut body = vec![(arcs[0] * 40 + arcs[1]) as u8];
    for &arc in &arcs[2..] {
        let mut stack = vec![(arc & 0x7f) as u8];
        let mut rest = arc >> 7;
        while rest > 0 {
            stack.push(0x80 | (rest & 0x7f) as u8);
            rest >>= 7;
        }
        stack.reverse();
        body.extend(stack);
    }
    tlv(0x06, &body)
}

/// One X.509 extension: its OID and the DER of its value.
pub fn extension(arcs: &[u64], value: &[u8]) -> Vec<u8> {
    seq(&[oid(arcs), tlv(0x04, value)])
}

/// subjectAltName with DNS names and IP addresses (4 or 16 bytes each).
pub fn subject_alt_name(dns: &[&str], ips: &[&[u8]]) -> Vec<u8> {
    let mut names: Vec<Vec<u8>> = dns.iter().map(|d| tlv(0x82, d.as_bytes())).collect();
    names.extend(ips.iter().map(|ip| tlv(0x87, ip)));
    extension(&[2, 5, 29, 17], &seq(&names))
}

/// keyUsage: digital signature and key encipherment.
pub fn key_usage() -> Vec<u8> {
    extension(&[2, 5, 29, 15], &tlv(0x03, &[0x05, 0xa0]))
}

/// An extensionRequest attribute whose SET holds `values`, each a list of
/// extensions.
pub fn extension_request(values: &[&[Vec<u8>]]) -> Vec<u8> {
    let values: Vec<Vec<u8>> = values.iter().map(|exts| seq(exts)).collect();
    seq(&[oid(&[1, 2, 840, 113549, 1, 9, 14]), set(&values)])
}

/// A challengePassword attribute.
pub fn challenge_password(password: &str) -> Vec<u8> {
    seq(&[
        oid(&[1, 2, 840, 113549, 1, 9, 7]),
        set(&[tlv(0x0c, password.as_bytes())]),
    ])
}

/// A signing key: the kinds kubelets use.
pub enum Key {
    /// From a PKCS#8 DER.
    Rsa(Vec<u8>),
    EcdsaP256(Vec<u8>),
}

/// A PEM `CERTIFICATE REQUEST` for `CN=<cn>, O=system:nodes` with exactly
/// the attributes given (each a full Attribute SEQUENCE), signed by `key`,
/// whose SubjectPublicKeyInfo is `spki`.
pub fn request(cn: &str, spki: &[u8], attributes: &[Vec<u8>], key: &Key) -> Vec<u8> {
    let rdn = |arcs: &[u64], value: &str| set(&[seq(&[oid(arcs), tlv(0x0c, value.as_bytes())])]);
    let subject = seq(&[rdn(&[2, 5, 4, 10], "system:nodes"), rdn(&[2, 5, 4, 3], cn)]);
    let info = seq(&[
        tlv(0x02, &[0]),
        subject,
        spki.to_vec(),
        tlv(0xa0, &attributes.concat()),
    ]);
    let rng = SystemRandom::new();
    let (algorithm, signature) = match key {
        Key::Rsa(pkcs8) => {
            let pair = RsaKeyPair::from_pkcs8(pkcs8).expect("an RSA PKCS#8 key");
            let mut signature = vec![0; pair.public().modulus_len()];
            pair.sign(&RSA_PKCS1_SHA256, &rng, &info, &mut signature)
                .expect("RSA signing");
            (
                seq(&[oid(&[1, 2, 840, 113549, 1, 1, 11]), tlv(0x05, &[])]),
                signature,
            )
        }
        Key::EcdsaP256(pkcs8) => {
            let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8, &rng)
                .expect("a P-256 PKCS#8 key");
            let signature = pair.sign(&rng, &info).expect("ECDSA signing");
            (
                seq(&[oid(&[1, 2, 840, 10045, 4, 3, 2])]),
                signature.as_ref().to_vec(),
            )
        }
    };
    let mut bits = vec![0u8];
    bits.extend(signature);
    let der = seq(&[info, algorithm, tlv(0x03, &bits)]);
    pem_of(&der)
}

fn pem_of(der: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE REQUEST-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE REQUEST-----\n");
    out.into_bytes()
}
