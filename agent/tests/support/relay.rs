//! A TCP relay from a network namespace to the host's test apiserver, which tests can
//! stop (RST/FIN: an outage the client sees at once) or cut silently (packets dropped: a
//! dead path the client must notice itself). Does I/O (threads, sockets, `iptables`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use super::NetNs;

/// A relay from `127.0.0.1:PORT` inside a namespace to `127.0.0.1:PORT` on the host.
///
/// The listener is created by a thread that entered the namespace (a socket stays in the
/// namespace it was created in); outgoing connections are made by a thread that never
/// left the host namespace (threads inherit the namespace of the thread that spawns them).
#[derive(Debug)]
pub struct Relay {
    ns_path: String,
    port: u16,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accepted_tx: Option<mpsc::Sender<TcpStream>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Starts relaying `ns`'s `127.0.0.1:<port of server_url>` to the host's.
    pub fn start(ns: &NetNs, server_url: &str) -> Relay {
        let port: u16 = server_url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("no port in {server_url}"));
        let target = SocketAddr::from(([127, 0, 0, 1], port));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (accepted_tx, accepted_rx) = mpsc::channel::<TcpStream>();
        let conns_c = conns.clone();
        // Spawned from the test thread: stays in the host namespace.
        std::thread::spawn(move || {
            for inside in accepted_rx {
                let Ok(outside) = TcpStream::connect(target) else {
                    continue;
                };
                let mut registry = conns_c.lock().unwrap();
                registry.push(inside.try_clone().unwrap());
                registry.push(outside.try_clone().unwrap());
                drop(registry);
                pipe(inside.try_clone().unwrap(), outside.try_clone().unwrap());
                pipe(outside, inside);
            }
        });
        let mut relay = Relay {
            ns_path: format!("/var/run/netns/{}", ns.name()),
            port,
            stop: Arc::new(AtomicBool::new(false)),
            conns,
            accepted_tx: Some(accepted_tx),
            acceptor: None,
        };
        relay.listen();
        relay
    }

    fn listen(&mut self) {
        let (ready_tx, ready_rx) = mpsc::channel();
        let stop = self.stop.clone();
        stop.store(false, Ordering::SeqCst);
        let tx = self.accepted_tx.clone().unwrap();
        let (path, port) = (self.ns_path.clone(), self.port);
        self.acceptor = Some(std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
            listener.set_nonblocking(true).unwrap();
            ready_tx.send(()).unwrap();
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        if tx.send(stream).is_err() {
                            return;
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
        ready_rx.recv().expect("relay listener started");
    }

    /// Simulates an API outage: closes the listener (connections are refused) and cuts
    /// every relayed connection.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            t.join().unwrap();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Simulates a silent cut of the API path: every TCP packet to or from the relay's
    /// port inside the namespace is dropped (no RST, no FIN), established connections
    /// included; new connections hang in SYN_SENT. Undone by [`Relay::heal`].
    pub fn cut_silently(&self) {
        self.iptables("-I");
    }

    /// Ends [`Relay::cut_silently`]: the same connections carry packets again.
    pub fn heal(&self) {
        self.iptables("-D");
    }

    fn iptables(&self, op: &str) {
        let ns = self.ns_path.rsplit('/').next().unwrap();
        let port = self.port.to_string();
        for (chain, dir) in [("INPUT", "--dport"), ("INPUT", "--sport")] {
            let status = Command::new("ip")
                .args(["netns", "exec", ns, "iptables", op, chain])
                .args(["-p", "tcp", dir, &port, "-j", "DROP"])
                .status()
                .expect("running iptables");
            assert!(status.success(), "iptables {op} {chain} {dir} {port}");
        }
    }

    /// Ends the outage.
    pub fn restart(&mut self) {
        assert!(self.acceptor.is_none(), "relay already running");
        self.listen();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop();
        self.accepted_tx = None;
    }
}

/// Copies `from` to `to` on a thread until EOF or an error, then shuts `to`'s write side.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
