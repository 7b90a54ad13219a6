//! Test support: starts a real etcd + kube-apiserver on loopback (see the foundation issue).
