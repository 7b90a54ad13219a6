//! The liveness advert of fast L2 failover: what a holder sends its standby every advert
//! interval, over UDP on the IP's own LAN. Pure: encode, decode and verify only.
//!
//! One advert per (holder, standby) pair and round carries every IP the holder holds for
//! that standby, so 1,000 IPs on 10 nodes cost 10 packets a round, not 1,000. A round whose
//! IPs do not fit [`MAX_IPS`] is sent in several adverts; the receiver needs no assembly:
//! it only asks "when did an advert from this holder last list this IP".
//!
//! ```text
//! "ALBA" | version 1 | from: len u8, bytes | to: len u8, bytes | counter u64 BE
//!        | via: family u8 (0: none, 4|6) and 0|4|16 address bytes
//!        | count u16 BE | count x (family u8 (4|6), 4|16 address bytes) | HMAC-SHA256 (32)
//! ```
//!
//! `via` marks a copy sent to a relay node: the relay forwards it to the `via` address
//! without it (same sender, counter and IPs, signed again with the same key), so a standby
//! cut off from its holder on the LAN, but not from the relay, still hears the holder.
//!
//! The HMAC (keyed by the cluster's advert key, a Secret only agents and the controller
//! read) covers every byte before it, so a host on the LAN can neither forge an advert nor
//! change one. The counter only grows per sender (microseconds since the epoch at start,
//! then +1 per advert): the receiver drops any advert whose counter is not above the last
//! one it accepted from that sender, so a captured advert cannot be replayed.
//!
//! An [`Ack`] goes back for every advert accepted (by the standby, and by the relay for a
//! copy it forwards), so the holder knows whether anyone still hears it:
//!
//! ```text
//! "ALBK" | version 1 | from: len u8, bytes | to: len u8, bytes | counter u64 BE | HMAC-SHA256 (32)
//! ```
//!
//! Signed with the same key, its counter growing per sender like an advert's. An agent
//! older than acks drops them as "not an advert" (counted, said once in its log).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ring::hmac;

/// The first bytes of every advert.
pub const MAGIC: &[u8; 4] = b"ALBA";
/// The first bytes of every ack.
pub const ACK_MAGIC: &[u8; 4] = b"ALBK";
/// The format's version.
pub const VERSION: u8 = 1;
/// The most IPs one advert carries (an IPv6 advert then stays under 1,300 bytes: one
/// frame on any LAN, no fragments).
pub const MAX_IPS: usize = 64;
/// The length of the MAC that ends an advert.
pub const TAG_LEN: usize = 32;
/// The least length of a key.
pub const MIN_KEY_LEN: usize = 16;

/// One advert, as sent and as accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    /// The sending node (the holder).
    pub from: String,
    /// The node it is for (the standby).
    pub to: String,
    /// Grows with every advert of the sender.
    pub counter: u64,
    /// A copy for a relay: the address it forwards it to (the standby's).
    pub via: Option<IpAddr>,
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
    /// Grows with every ack of the sender.
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

impl Message {
    /// Reads and verifies a datagram: an advert or an ack.
    pub fn decode(key: &AdvertKey, datagram: &[u8]) -> Result<Message, AdvertError> {
        if datagram.starts_with(ACK_MAGIC) {
            Ack::decode(key, datagram).map(Message::Ack)
        } else {
            Advert::decode(key, datagram).map(Message::Advert)
        }
    }
}

impl Ack {
    /// The datagram: the ack and its MAC.
    pub fn encode(&self, key: &AdvertKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        push_head(&mut out, ACK_MAGIC, &self.from, &self.to, self.counter);
        let tag = hmac::sign(&key.0, &out);
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// Reads and verifies a datagram. The MAC is checked before anything else is read.
    pub fn decode(key: &AdvertKey, datagram: &[u8]) -> Result<Ack, AdvertError> {
        let (r, from, to, counter) = verified_head(key, ACK_MAGIC, datagram)?;
        if !r.0.is_empty() {
            return Err(AdvertError::Malformed("bytes after the counter"));
        }
        Ok(Ack { from, to, counter })
    }
}

/// Why a datagram is not an advert to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvertError {
    /// Not the magic, or a version this agent does not read.
    #[error("not an aliaslb advert of version {VERSION}")]
    NotAnAdvert,
    /// Cut short, or bytes left over.
    #[error("malformed advert: {0}")]
    Malformed(&'static str),
    /// The MAC does not verify: forged, changed, or another cluster's key.
    #[error("advert MAC does not verify (forged, altered, or another key)")]
    BadMac,
}

/// The cluster's advert key.
#[derive(Clone)]
pub struct AdvertKey(hmac::Key);

impl std::fmt::Debug for AdvertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdvertKey(..)")
    }
}

impl AdvertKey {
    /// A key from the Secret's bytes (at least [`MIN_KEY_LEN`]).
    pub fn new(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(format!(
                "the advert key is {} bytes long, at least {MIN_KEY_LEN} are needed",
                bytes.len()
            ));
        }
        Ok(AdvertKey(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }
}

/// A fresh random key of 32 bytes, for the controller to store in the Secret.
pub fn generate_key() -> Result<[u8; 32], String> {
    use ring::rand::SecureRandom;
    let mut out = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| "the system's random source failed".to_owned())?;
    Ok(out)
}

impl Advert {
    /// The datagram: the advert and its MAC. Names longer than 255 bytes and IPs beyond
    /// [`MAX_IPS`] are the caller's bug: they panic in debug builds and are cut here.
    pub fn encode(&self, key: &AdvertKey) -> Vec<u8> {
        debug_assert!(self.ips.len() <= MAX_IPS && self.from.len() < 256 && self.to.len() < 256);
        let mut out = Vec::with_capacity(64 + self.ips.len() * 17);
        push_head(&mut out, MAGIC, &self.from, &self.to, self.counter);
        match self.via {
            Some(via) => push_ip(&mut out, via),
            None => out.push(0),
        }
        let ips = &self.ips[..self.ips.len().min(MAX_IPS)];
        out.extend_from_slice(&(ips.len() as u16).to_be_bytes());
        for ip in ips {
            push_ip(&mut out, *ip);
        }
        let tag = hmac::sign(&key.0, &out);
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// Reads and verifies a datagram. The MAC is checked before anything else is read.
    pub fn decode(key: &AdvertKey, datagram: &[u8]) -> Result<Advert, AdvertError> {
        let (mut r, from, to, counter) = verified_head(key, MAGIC, datagram)?;
        let via = match r.array::<1>()?[0] {
            0 => None,
            family => Some(r.ip(family)?),
        };
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
        Ok(Advert {
            from,
            to,
            counter,
            via,
            ips,
        })
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

/// The magic and version checked, then the MAC (before anything else is read), then the
/// head: the reader of the rest of the body, sender, receiver, counter.
fn verified_head<'a>(
    key: &AdvertKey,
    magic: &[u8; 4],
    datagram: &'a [u8],
) -> Result<(Reader<'a>, String, String, u64), AdvertError> {
    if datagram.len() < magic.len() + 1 || &datagram[..4] != magic || datagram[4] != VERSION {
        return Err(AdvertError::NotAnAdvert);
    }
    let Some(body_len) = datagram.len().checked_sub(TAG_LEN) else {
        return Err(AdvertError::Malformed("shorter than its MAC"));
    };
    let (body, tag) = datagram.split_at(body_len);
    hmac::verify(&key.0, body, tag).map_err(|_| AdvertError::BadMac)?;
    let mut r = Reader(&body[5..]);
    let from = r.name()?;
    let to = r.name()?;
    let counter = u64::from_be_bytes(r.array()?);
    Ok((r, from, to, counter))
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

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], AdvertError> {
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

    fn name(&mut self) -> Result<String, AdvertError> {
        let len = usize::from(self.array::<1>()?[0]);
        String::from_utf8(self.take(len)?.to_vec())
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
            via: None,
            ips: chunk.to_vec(),
        })
        .collect();
    if out.is_empty() {
        out.push(Advert {
            from: from.to_owned(),
            to: to.to_owned(),
            counter: counter(),
            via: None,
            ips: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> AdvertKey {
        AdvertKey::new(&[byte; 32]).unwrap()
    }

    fn advert() -> Advert {
        Advert {
            from: "alb-node-1".into(),
            to: "alb-node-2".into(),
            counter: 1_700_000_000_000_001,
            via: None,
            ips: vec![
                "192.168.55.10".parse().unwrap(),
                "2001:db8::10".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn an_advert_reads_back_with_its_key() {
        let bytes = advert().encode(&key(7));
        assert_eq!(bytes.len(), 5 + 11 + 11 + 8 + 1 + 2 + 5 + 17 + TAG_LEN);
        assert_eq!(Advert::decode(&key(7), &bytes), Ok(advert()));
        let relayed = Advert {
            via: Some("192.168.55.3".parse().unwrap()),
            ..advert()
        };
        assert_eq!(
            Advert::decode(&key(7), &relayed.encode(&key(7))),
            Ok(relayed)
        );
    }

    /// Flipping any bit of a byte after the version fails the MAC.
    fn every_changed_byte_fails(bytes: &[u8], decode: impl Fn(&[u8]) -> Result<(), AdvertError>) {
        for i in 5..bytes.len() {
            let mut changed = bytes.to_vec();
            changed[i] ^= 0x01;
            assert_eq!(decode(&changed), Err(AdvertError::BadMac), "byte {i}");
        }
    }

    #[test]
    fn an_ack_reads_back_with_its_key_and_any_changed_byte_fails_it() {
        let ack = Ack {
            from: "alb-node-2".into(),
            to: "alb-node-1".into(),
            counter: 1_700_000_000_000_009,
        };
        let bytes = ack.encode(&key(7));
        assert_eq!(bytes.len(), 5 + 11 + 11 + 8 + TAG_LEN);
        assert_eq!(
            Message::decode(&key(7), &bytes),
            Ok(Message::Ack(ack.clone()))
        );
        assert_eq!(
            Message::decode(&key(7), &advert().encode(&key(7))),
            Ok(Message::Advert(advert()))
        );
        assert_eq!(Message::decode(&key(8), &bytes), Err(AdvertError::BadMac));
        every_changed_byte_fails(&bytes, |b| Message::decode(&key(7), b).map(drop));
        // An agent that reads adverts only refuses an ack; an ack is never an advert.
        assert_eq!(
            Advert::decode(&key(7), &bytes),
            Err(AdvertError::NotAnAdvert)
        );
        let mut renamed = bytes.clone();
        renamed[..4].copy_from_slice(MAGIC);
        assert!(Message::decode(&key(7), &renamed).is_err());
    }

    #[test]
    fn another_key_or_any_changed_byte_fails_the_mac() {
        let bytes = advert().encode(&key(7));
        assert_eq!(Advert::decode(&key(8), &bytes), Err(AdvertError::BadMac));
        every_changed_byte_fails(&bytes, |b| Advert::decode(&key(7), b).map(drop));
        assert_eq!(
            Advert::decode(&key(7), &bytes[..bytes.len() - 1]),
            Err(AdvertError::BadMac)
        );
    }

    #[test]
    fn foreign_datagrams_are_told_apart() {
        assert_eq!(Advert::decode(&key(7), b""), Err(AdvertError::NotAnAdvert));
        assert_eq!(
            Advert::decode(&key(7), b"ALBA\x02rest"),
            Err(AdvertError::NotAnAdvert)
        );
        assert_eq!(
            Advert::decode(&key(7), b"ALBA\x01"),
            Err(AdvertError::Malformed("shorter than its MAC"))
        );
    }

    #[test]
    fn a_signed_but_malformed_body_is_refused() {
        // A key holder's bug, not an attacker: signed, but the count runs past the end.
        let mut body = b"ALBA\x01\x01a\x01b".to_vec();
        body.extend_from_slice(&5u64.to_be_bytes());
        body.push(0);
        body.extend_from_slice(&2u16.to_be_bytes());
        body.extend_from_slice(&[4, 10, 0, 0, 1]);
        let tag = hmac::sign(&key(7).0, &body);
        body.extend_from_slice(tag.as_ref());
        assert_eq!(
            Advert::decode(&key(7), &body),
            Err(AdvertError::Malformed("cut short"))
        );
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(
            AdvertKey::new(&[1; 15])
                .unwrap_err()
                .contains("at least 16")
        );
        assert_ne!(generate_key().unwrap(), generate_key().unwrap());
    }

    #[test]
    fn a_round_splits_into_adverts_that_fit_one_frame() {
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
        let largest = adverts
            .iter()
            .map(|a| a.encode(&key(1)).len())
            .max()
            .unwrap();
        assert!(largest <= 1_300, "{largest} bytes");
        let empty = round("a", "b", &[], || 9);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].ips.is_empty());
    }
}
