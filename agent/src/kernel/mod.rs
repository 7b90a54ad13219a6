//! The kernel seam: the [`backend::AddressBackend`] trait the alias manager drives (with
//! its [`backend::Timed`] wrapper, which bounds every call) and [`netlink`], the only
//! module touching rtnetlink (the real backend, the ownership marker, the change
//! notifications).

pub mod backend;
pub mod netlink;
