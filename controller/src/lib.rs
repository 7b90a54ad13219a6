//! aliaslb-controller as a library: the parts the binaries and integration tests share.

pub mod cli;
