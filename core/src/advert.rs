//! The liveness advert of fast L2 failover: what a holder sends its standby every advert
//! interval, over UDP on the IP's own LAN, and the ack that answers it. Pure: encode, sign,
//! decode and verify only.
//!
//! **A node speaks only for itself.** Every node signs its adverts and acks with a key of
//! its own (Ed25519, [`SigningKey`]), made when its agent starts and never leaving that
//! process. Its public key ([`PublicKey`]) travels in the agent's own report to the
//! controller, which writes it into the assignment objects of the nodes that must verify
//! it (its LAN peers: [`crate::assignment::PeerNode`]). A compromised node can sign only as
//! itself: it cannot speak for a holder it stands by for, nor ack for another node.
//!
//! One advert per (holder, standby) pair and round carries every IP the holder holds for
//! that standby, so 1,000 IPs on 10 nodes cost 10 packets a round, not 1,000. A round whose
//! IPs do not fit [`MAX_IPS`] is sent in several adverts; the receiver needs no assembly:
//! it only asks "when did an advert from this holder last list this IP".
//!
//! ```text
//! "ALBA" | version 2 | from: len u8, bytes | to: len u8, bytes | counter u64 BE
//!        | count u16 BE | count x (family u8 (4|6), 4|16 address bytes) | Ed25519 (64)
//! "ALBK" | version 2 | from: len u8, bytes | to: len u8, bytes | counter u64 BE | Ed25519 (64)
//! ```
//!
//! The signature, by `from`'s key, covers every byte before it, so neither a host on the
//! LAN nor another node can forge or change one. The counter grows with every message of
//! its sender's key (from 1 when the key is made: a restarted agent has a new key, so no
//! clock is involved): a receiver drops any message whose counter is not above the last
//! one it accepted under that key, so a captured one cannot be replayed.
//!
//! A relay (a third node that forwards a holder's adverts to a standby cut off from the
//! holder alone) forwards the holder's datagram unchanged: the standby checks the holder's
//! own signature, whichever path it came by.
//!
//! The receiver reads the [`Head`] first (who sent it, to whom), drops what comes from a
//! node its assignment does not name before any state is kept or any signature checked,
//! then verifies with that node's key ([`Message::verify`]).
//!
//! Version 1 (one HMAC key shared by every node) is not read: its datagrams are
//! [`AdvertError::OtherVersion`], counted and dropped; pairs of agents of both versions fail
//! over by the Lease.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

/// The first bytes of every advert.
pub const MAGIC: &[u8; 4] = b"ALBA";
/// The first bytes of every ack.
pub const ACK_MAGIC: &[u8; 4] = b"ALBK";
/// The format's version.
pub const VERSION: u8 = 2;
/// The most IPs one advert carries (an IPv6 advert then stays under 1,300 bytes: one
/// frame on any LAN, no fragments).
pub const MAX_IPS: usize = 64;
/// The length of the signature that ends every message.
pub const SIGNATURE_LEN: usize = 64;
/// The length of a public key.
pub const PUBLIC_KEY_LEN: usize = 32;

/// One advert, as sent and as accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    /// The sending node (the holder).
    pub from: String,
    /// The node it is for (the standby).
    pub to: String,
    /// Grows with every message of the sender's key.
    pub counter: u64,
    /// The IPs the sender holds for `to` (at most [`MAX_IPS`]).
    pub ips: Vec<IpAddr>,
}

/// "I heard you": what a standby or relay sends back to a holder for an advert it
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The node that heard the advert (the standby, or the relay).
    pub from: String,
    /// The advert's sender (the holder).
    pub to: String,
    /// Grows with every message of the sender's key.
    pub counter: u64,
}

/// A datagram of the advert port, verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A holder's advert.
    Advert(Advert),
    /// A standby's or relay's ack.
    Ack(Ack),
}

/// Which kind of message a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An advert.
    Advert,
    /// An ack.
    Ack,
}

/// The head of a datagram, read before its signature is checked: not to be trusted, only
/// to pick the key (and to drop at once what comes from a node nobody named).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head<'a> {
    /// Advert or ack.
    pub kind: Kind,
    /// The node it claims to come from.
    pub from: &'a str,
    /// The node it is for.
    pub to: &'a str,
    /// Its counter.
    pub counter: u64,
}

/// Why a datagram is not a message to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvertError {
    /// Not the magic.
    #[error("not an aliaslb advert")]
    NotAnAdvert,
    /// An advert of another version (version 1: an agent of before per-node keys).
    #[error("an advert of version {0}, this agent reads version {VERSION}")]
    OtherVersion(u8),
    /// Cut short, or bytes left over.
    #[error("malformed advert: {0}")]
    Malformed(&'static str),
    /// The signature does not verify with the sender's key: forged, changed, or signed by
    /// a key the sender no longer (or not yet) has.
    #[error("advert signature does not verify with its sender's key")]
    BadSignature,
}

/// A node's public key, as its report carries it and its peers' assignments list it:
/// 64 hexadecimal digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; PUBLIC_KEY_LEN]);

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// Why text is not a public key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a public key (64 hexadecimal digits): {0}")]
pub struct KeyParseError(String);

impl FromStr for PublicKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || KeyParseError(s.chars().take(80).collect());
        if s.len() != PUBLIC_KEY_LEN * 2 || !s.is_ascii() {
            return Err(err());
        }
        let mut out = [0u8; PUBLIC_KEY_LEN];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| err())?;
        }
        Ok(PublicKey(out))
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// This node's signing key: made at start, kept in memory only.
pub struct SigningKey(Ed25519KeyPair);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(public {})", self.public_key())
    }
}

impl SigningKey {
    /// A fresh key from the system's random source.
    pub fn generate() -> Result<Self, String> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| "the system's random source failed".to_owned())?;
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
            .map(SigningKey)
            .map_err(|e| format!("a key just made does not load: {e}"))
    }

    /// Its public half.
    pub fn public_key(&self) -> PublicKey {
        let mut out = [0u8; PUBLIC_KEY_LEN];
        out.copy_from_slice(self.0.public_key().as_ref());
        PublicKey(out)
    }

    /// `body` with its signature appended.
    fn seal(&self, mut body: Vec<u8>) -> Vec<u8> {
        let signature = self.0.sign(&body);
        body.extend_from_slice(signature.as_ref());
        body
    }
}

impl Advert {
    /// The datagram: the advert, signed. Names longer than 255 bytes and IPs beyond
    /// [`MAX_IPS`] are the caller's bug: they panic in debug builds and are cut here.
    pub fn encode(&self, key: &SigningKey) -> Vec<u8> {
        debug_assert!(self.ips.len() <= MAX_IPS && self.from.len() < 256 && self.to.len() < 256);
        let mut out = Vec::with_capacity(64 + self.ips.len() * 17 + SIGNATURE_LEN);
        push_head(&mut out, MAGIC, &self.from, &self.to, self.counter);
        let ips = &self.ips[..self.ips.len().min(MAX_IPS)];
        out.extend_from_slice(&(ips.len() as u16).to_be_bytes());
        for ip in ips {
            push_ip(&mut out, *ip);
        }
        key.seal(out)
    }
}

impl Ack {
    /// The datagram: the ack, signed.
    pub fn encode(&self, key: &SigningKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.from.len() + self.to.len() + SIGNATURE_LEN);
        push_head(&mut out, ACK_MAGIC, &self.from, &self.to, self.counter);
        key.seal(out)
    }
}

/// Reads a datagram's head without checking anything but its shape: for the receiver to
/// pick the sender's key, or to drop it unverified when nobody named that sender.
pub fn head(datagram: &[u8]) -> Result<Head<'_>, AdvertError> {
    let kind = match datagram.get(..4) {
        Some(m) if m == MAGIC => Kind::Advert,
        Some(m) if m == ACK_MAGIC => Kind::Ack,
        _ => return Err(AdvertError::NotAnAdvert),
    };
    match datagram.get(4) {
        Some(&VERSION) => {}
        Some(&other) => return Err(AdvertError::OtherVersion(other)),
        None => return Err(AdvertError::Malformed("cut short")),
    }
    let Some(body_len) = datagram.len().checked_sub(SIGNATURE_LEN) else {
        return Err(AdvertError::Malformed("shorter than its signature"));
    };
    let mut r = Reader(datagram.get(5..body_len).unwrap_or_default());
    let from = r.name()?;
    let to = r.name()?;
    let counter = u64::from_be_bytes(r.array()?);
    Ok(Head {
        kind,
        from,
        to,
        counter,
    })
}

impl Message {
    /// Reads and verifies a datagram with the key of the node its head names: the
    /// signature is checked before anything past the head is read.
    pub fn verify(datagram: &[u8], key: &PublicKey) -> Result<Message, AdvertError> {
        let head = head(datagram)?;
        let (body, signature) = datagram.split_at(datagram.len() - SIGNATURE_LEN);
        UnparsedPublicKey::new(&ED25519, key.0)
            .verify(body, signature)
            .map_err(|_| AdvertError::BadSignature)?;
        let mut r = Reader(&body[5..]);
        let (from, to) = (r.name()?.to_owned(), r.name()?.to_owned());
        let counter = u64::from_be_bytes(r.array()?);
        debug_assert_eq!(
            (from.as_str(), to.as_str(), counter),
            (head.from, head.to, head.counter)
        );
        match head.kind {
            Kind::Ack => {
                if !r.0.is_empty() {
                    return Err(AdvertError::Malformed("bytes after the counter"));
                }
                Ok(Message::Ack(Ack { from, to, counter }))
            }
            Kind::Advert => {
                let count = usize::from(u16::from_be_bytes(r.array()?));
                if count > MAX_IPS {
                    return Err(AdvertError::Malformed("more IPs than an advert carries"));
                }
                let mut ips = Vec::with_capacity(count);
                for _ in 0..count {
                    let family = r.array::<1>()?[0];
                    ips.push(r.ip(family)?);
                }
                if !r.0.is_empty() {
                    return Err(AdvertError::Malformed("bytes after the IPs"));
                }
                Ok(Message::Advert(Advert {
                    from,
                    to,
                    counter,
                    ips,
                }))
            }
        }
    }
}

/// The head both kinds share: magic, version, sender, receiver, counter.
fn push_head(out: &mut Vec<u8>, magic: &[u8; 4], from: &str, to: &str, counter: u64) {
    out.extend_from_slice(magic);
    out.push(VERSION);
    for name in [from, to] {
        let bytes = &name.as_bytes()[..name.len().min(255)];
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&counter.to_be_bytes());
}

fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            out.push(4);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], AdvertError> {
        if self.0.len() < n {
            return Err(AdvertError::Malformed("cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], AdvertError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn ip(&mut self, family: u8) -> Result<IpAddr, AdvertError> {
        match family {
            4 => Ok(IpAddr::V4(Ipv4Addr::from(self.array::<4>()?))),
            6 => Ok(IpAddr::V6(Ipv6Addr::from(self.array::<16>()?))),
            _ => Err(AdvertError::Malformed("unknown address family")),
        }
    }

    fn name(&mut self) -> Result<&'a str, AdvertError> {
        let len = usize::from(self.array::<1>()?[0]);
        std::str::from_utf8(self.take(len)?)
            .map_err(|_| AdvertError::Malformed("a node name that is not UTF-8"))
    }
}

/// The adverts of one round from `from` to `to` for `ips`: [`MAX_IPS`] a piece, at least
/// one (an advert listing nothing says "alive, holding nothing for you").
pub fn round(
    from: &str,
    to: &str,
    ips: &[IpAddr],
    mut counter: impl FnMut() -> u64,
) -> Vec<Advert> {
    let mut out: Vec<Advert> = ips
        .chunks(MAX_IPS)
        .map(|chunk| Advert {
            from: from.to_owned(),
            to: to.to_owned(),
            counter: counter(),
            ips: chunk.to_vec(),
        })
        .collect();
    if out.is_empty() {
        out.push(Advert {
            from: from.to_owned(),
            to: to.to_owned(),
            counter: counter(),
            ips: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert() -> Advert {
        Advert {
            from: "alb-node-1".into(),
            to: "alb-node-2".into(),
            counter: 7,
            ips: vec![
                "192.168.55.10".parse().unwrap(),
                "2001:db8::10".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn an_advert_reads_back_with_its_senders_key_only() {
        let key = SigningKey::generate().unwrap();
        let other = SigningKey::generate().unwrap();
        let bytes = advert().encode(&key);
        assert_eq!(bytes.len(), 5 + 11 + 11 + 8 + 2 + 5 + 17 + SIGNATURE_LEN);
        assert_eq!(
            Message::verify(&bytes, &key.public_key()),
            Ok(Message::Advert(advert()))
        );
        assert_eq!(
            Message::verify(&bytes, &other.public_key()),
            Err(AdvertError::BadSignature)
        );
        let h = head(&bytes).unwrap();
        assert_eq!(
            (h.kind, h.from, h.to, h.counter),
            (Kind::Advert, "alb-node-1", "alb-node-2", 7)
        );
    }

    /// Flipping any bit of a byte after the version fails the signature (or the head).
    fn every_changed_byte_fails(bytes: &[u8], key: &PublicKey) {
        for i in 5..bytes.len() {
            let mut changed = bytes.to_vec();
            changed[i] ^= 0x01;
            assert!(Message::verify(&changed, key).is_err(), "byte {i}");
        }
    }

    #[test]
    fn an_ack_reads_back_and_any_changed_byte_fails_it() {
        let key = SigningKey::generate().unwrap();
        let ack = Ack {
            from: "alb-node-2".into(),
            to: "alb-node-1".into(),
            counter: 9,
        };
        let bytes = ack.encode(&key);
        assert_eq!(bytes.len(), 5 + 11 + 11 + 8 + SIGNATURE_LEN);
        assert_eq!(
            Message::verify(&bytes, &key.public_key()),
            Ok(Message::Ack(ack))
        );
        every_changed_byte_fails(&bytes, &key.public_key());
        every_changed_byte_fails(&advert().encode(&key), &key.public_key());
        // An ack is never an advert: the magic is signed too.
        let mut renamed = bytes.clone();
        renamed[..4].copy_from_slice(MAGIC);
        assert!(Message::verify(&renamed, &key.public_key()).is_err());
    }

    #[test]
    fn foreign_and_old_datagrams_are_told_apart() {
        assert_eq!(head(b""), Err(AdvertError::NotAnAdvert));
        assert_eq!(head(b"HTTP/1.1"), Err(AdvertError::NotAnAdvert));
        assert_eq!(head(b"ALBA\x01rest"), Err(AdvertError::OtherVersion(1)));
        assert_eq!(head(b"ALBK\x01rest"), Err(AdvertError::OtherVersion(1)));
        assert_eq!(
            head(b"ALBA\x02"),
            Err(AdvertError::Malformed("shorter than its signature"))
        );
        // A head whose names run past the signature's start.
        let mut long = b"ALBA\x02\xff".to_vec();
        long.extend_from_slice(&[b'a'; SIGNATURE_LEN]);
        assert_eq!(head(&long), Err(AdvertError::Malformed("cut short")));
    }

    #[test]
    fn a_signed_but_malformed_body_is_refused() {
        // A key holder's bug, not an attacker: signed, but the count runs past the end.
        let key = SigningKey::generate().unwrap();
        let mut body = b"ALBA\x02\x01a\x01b".to_vec();
        body.extend_from_slice(&5u64.to_be_bytes());
        body.extend_from_slice(&2u16.to_be_bytes());
        body.extend_from_slice(&[4, 10, 0, 0, 1]);
        let bytes = key.seal(body);
        assert_eq!(
            Message::verify(&bytes, &key.public_key()),
            Err(AdvertError::Malformed("cut short"))
        );
    }

    #[test]
    fn public_keys_read_back_from_text_and_json() {
        let key = SigningKey::generate().unwrap().public_key();
        let text = key.to_string();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<PublicKey>(), Ok(key));
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(serde_json::from_str::<PublicKey>(&json).unwrap(), key);
        for bad in ["", "00", &"g".repeat(64), &"0".repeat(66), &"é".repeat(32)] {
            assert!(bad.parse::<PublicKey>().is_err(), "{bad:?}");
        }
        assert_ne!(SigningKey::generate().unwrap().public_key(), key);
        assert!(format!("{:?}", SigningKey::generate().unwrap()).starts_with("SigningKey(public "));
    }

    #[test]
    fn a_round_splits_into_adverts_that_fit_one_frame() {
        let key = SigningKey::generate().unwrap();
        let ips: Vec<IpAddr> = (0..150u16)
            .map(|i| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i)))
            .collect();
        let mut n = 0;
        let adverts = round("a", "b", &ips, || {
            n += 1;
            n
        });
        assert_eq!(adverts.len(), 3);
        assert_eq!(
            adverts.iter().map(|a| a.counter).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        let all: Vec<IpAddr> = adverts.iter().flat_map(|a| a.ips.clone()).collect();
        assert_eq!(all, ips);
        let largest = adverts.iter().map(|a| a.encode(&key).len()).max().unwrap();
        assert!(largest <= 1_300, "{largest} bytes");
        let empty = round("a", "b", &[], || 9);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].ips.is_empty());
    }
}
