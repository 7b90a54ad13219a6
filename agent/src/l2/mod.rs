//! L2 mode: the LAN side of an alias. [`announce`]: gratuitous ARP / unsolicited NA frames
//! and bursts; [`lan`]: the LAN seen through ARP/NDP (the [`lan::LanPort`] seam, the frames,
//! and [`lan::LanWatch`], the AF_PACKET sockets that watch for claims, probe and defend);
//! [`guard`]: the conflict guard (probe first claims, yield, defend, report); fast failover:
//! [`failover`] (the standby's decisions), [`fence`] (the holder's: step down from an IP
//! nobody hears) and [`adverts`] (the key, the UDP adverts and acks);
//! [`vmac`]: the macvlans of virtual-MAC pools. Pure but for `announce`'s sender,
//! `LanWatch` and `adverts`.

pub mod adverts;
pub mod announce;
pub mod failover;
pub mod fence;
pub mod guard;
pub mod lan;
pub mod vmac;
