//! One stable hash for everything that must place the same way on every build: election
//! ties ([`crate::election::tie_break_hash`]) and the assignment shard of an address
//! ([`crate::assignment::shards::shard_of`]). Hand-written so it never changes across Rust
//! versions (std's hasher may): 64-bit FNV-1a, then murmur3's 64-bit finalizer.

use std::net::IpAddr;

/// 64-bit FNV-1a (http://www.isthe.com/chongo/tech/comp/fnv/).
pub(crate) struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub(crate) fn new() -> Self {
        Fnv1a(Self::OFFSET_BASIS)
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// Writes a family tag and the octets of `ip` (nothing but a tag for `None`).
    pub(crate) fn write_ip(&mut self, ip: Option<IpAddr>) {
        match ip {
            Some(IpAddr::V4(v4)) => {
                self.write(&[0, 4]);
                self.write(&v4.octets());
            }
            Some(IpAddr::V6(v6)) => {
                self.write(&[0, 6]);
                self.write(&v6.octets());
            }
            None => self.write(&[0, 0]),
        }
    }

    /// The FNV-1a state, unmixed.
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }

    /// The state through [`fmix64`]: every input bit affects every output bit. FNV-1a alone
    /// barely moves the high bits when only the last octet differs.
    pub(crate) fn finish_mixed(&self) -> u64 {
        fmix64(self.finish())
    }
}

/// murmur3's 64-bit finalizer: every input bit affects every output bit.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        // Published FNV-1a 64 test vectors: "" and "a".
        let mut h = Fnv1a::new();
        assert_eq!(h.finish(), 0xcbf2_9ce4_8422_2325);
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv1a::new();
        h.write(b"foobar");
        assert_eq!(h.finish(), 0x8594_4171_f739_67e8);
    }
}
