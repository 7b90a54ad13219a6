//! BIRD 2 through its control socket (what `birdc` speaks), read-only.
//!
//! The protocol is line based. The server greets with `0001 BIRD 2.0.12 ready.`; each
//! reply is a run of lines `NNNN-text` (more follows), ` text` (more of the previous
//! code) and ends with one line `NNNN text`. Codes 0xxx end a successful reply (`0000`
//! after a table), 1xxx are table rows (1002 protocols, 1007 routes), 2xxx headings,
//! 8xxx run-time errors and 9xxx parse errors; a line starting `+` is an asynchronous
//! message and belongs to no reply (BIRD's `client/client.c`, `server_got_reply`).
//!
//! [`read`] connects, sends `restrict` first (BIRD answers `0016 Access restricted`;
//! from then on it refuses every command that could change anything, as for
//! `birdc -r`), then `show protocols`, then `show route exported <proto>` for each BGP
//! protocol that is up. The pure parsers ([`parse_reply`], [`parse_protocols`],
//! [`parse_exported`]) are unit tested on captured replies of BIRD 2.0.12.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::{RoutingError, RoutingStatus, host_address};

const DAEMON: &str = "bird";
/// A reply larger than this is refused (a node exports a few thousand routes at most).
const MAX_REPLY_BYTES: usize = 64 << 20;

/// One line of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The reply code (a continuation line ` text` carries the code before it).
    pub code: u16,
    /// The text after the code and separator.
    pub text: String,
}

/// One whole reply: its lines, the last one included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Every line, in order.
    pub lines: Vec<Line>,
}

impl Reply {
    /// The code of the last line, which says how the command went.
    pub fn code(&self) -> u16 {
        self.lines.last().map_or(0, |l| l.code)
    }

    /// Whether BIRD reported an error (8xxx run-time, 9xxx parse).
    pub fn is_error(&self) -> bool {
        self.code() >= 8000
    }

    /// The last line's text (the error message for an error reply).
    pub fn last_text(&self) -> &str {
        self.lines.last().map_or("", |l| l.text.as_str())
    }

    /// The texts of the lines with `code`.
    pub fn texts(&self, code: u16) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .filter(move |l| l.code == code)
            .map(|l| l.text.as_str())
    }
}

/// Collects lines into replies.
#[derive(Debug, Default)]
pub struct ReplyParser {
    lines: Vec<Line>,
    bytes: usize,
}

impl ReplyParser {
    /// Feeds one line (without its newline). `Ok(Some(reply))` when it ended a reply.
    pub fn push(&mut self, raw: &str) -> Result<Option<Reply>, String> {
        self.bytes += raw.len() + 1;
        if self.bytes > MAX_REPLY_BYTES {
            return Err(format!("reply longer than {MAX_REPLY_BYTES} bytes"));
        }
        if raw.starts_with('+') {
            // An asynchronous message (log echo): not part of any reply.
            return Ok(None);
        }
        if let Some(text) = raw.strip_prefix(' ') {
            let Some(code) = self.lines.last().map(|l| l.code) else {
                return Err(format!("continuation line {raw:?} before any coded line"));
            };
            self.lines.push(Line {
                code,
                text: text.to_string(),
            });
            return Ok(None);
        }
        let bytes = raw.as_bytes();
        let coded = bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit);
        let (code, last) = match (coded, bytes.get(4)) {
            (true, Some(b'-')) => (raw[..4].parse::<u16>(), false),
            (true, Some(b' ')) => (raw[..4].parse::<u16>(), true),
            _ => return Err(format!("line {raw:?} is neither `NNNN-`, `NNNN ` nor ` `")),
        };
        let code = code.map_err(|e| format!("line {raw:?}: {e}"))?;
        self.lines.push(Line {
            code,
            text: raw[5..].to_string(),
        });
        if last {
            self.bytes = 0;
            Ok(Some(Reply {
                lines: std::mem::take(&mut self.lines),
            }))
        } else {
            Ok(None)
        }
    }
}

/// Parses a captured transcript (the server's side) into its replies. For tests and
/// tools; [`read`] parses as lines arrive.
pub fn parse_reply(transcript: &str) -> Result<Vec<Reply>, String> {
    let mut parser = ReplyParser::default();
    let mut replies = Vec::new();
    for raw in transcript.lines() {
        if let Some(reply) = parser.push(raw)? {
            replies.push(reply);
        }
    }
    if !parser.lines.is_empty() {
        return Err("the transcript ends inside a reply".to_string());
    }
    Ok(replies)
}

/// One row of `show protocols` for a BGP protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpProtocol {
    /// The protocol's name (`protocol bgp <name>`).
    pub name: String,
    /// Whether it is up, i.e. its session is Established.
    pub established: bool,
}

/// The BGP protocols in a `show protocols` reply (rows code 1002: `name proto table
/// state since info`). A BGP protocol is up exactly when its session is Established.
pub fn parse_protocols(reply: &Reply) -> Result<Vec<BgpProtocol>, String> {
    let mut out = Vec::new();
    for row in reply.texts(1002) {
        let cols: Vec<&str> = row.split_whitespace().collect();
        let [name, proto, _table, state, ..] = cols[..] else {
            return Err(format!("protocol row {row:?} has fewer than 4 columns"));
        };
        if proto != "BGP" {
            continue;
        }
        if !is_symbol(name) {
            return Err(format!("protocol name {name:?} is not a BIRD symbol"));
        }
        out.push(BgpProtocol {
            name: name.to_string(),
            established: state == "up",
        });
    }
    Ok(out)
}

/// The host prefixes in a `show route exported <proto>` reply (rows code 1007). A row
/// naming a network starts with it (`10.200.0.7/32   unicast [...]`); rows starting
/// with white space are next hops, attributes or further routes of the same network;
/// `Table master4:` heads each table. Networks that are not IP prefixes (VPN, flow)
/// and prefixes that are not host routes are skipped.
pub fn parse_exported(reply: &Reply) -> BTreeSet<IpAddr> {
    reply
        .texts(1007)
        .filter(|row| !row.starts_with(char::is_whitespace) && !row.starts_with("Table "))
        .filter_map(|row| row.split_whitespace().next())
        .filter_map(|net| net.parse::<IpNet>().ok())
        .filter_map(host_address)
        .collect()
}

/// Whether `s` can be sent back unquoted as a protocol name.
fn is_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A connection to BIRD's control socket.
struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    parser: ReplyParser,
    line: String,
}

impl Conn {
    /// Reads the next whole reply; `command` names what it answers, for errors.
    async fn reply(&mut self, command: &str) -> Result<Reply, RoutingError> {
        let protocol = |detail: String| RoutingError::Protocol {
            daemon: DAEMON,
            command: command.to_string(),
            detail,
        };
        loop {
            self.line.clear();
            let n = self
                .reader
                .read_line(&mut self.line)
                .await
                .map_err(|e| protocol(format!("reading the reply: {e}")))?;
            if n == 0 {
                return Err(protocol("BIRD closed the connection mid-reply".to_string()));
            }
            let raw = self.line.trim_end_matches(['\n', '\r']);
            if let Some(reply) = self.parser.push(raw).map_err(protocol)? {
                return Ok(reply);
            }
        }
    }

    /// Sends `command` and reads its reply.
    async fn ask(&mut self, command: &str) -> Result<Reply, RoutingError> {
        self.writer
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|e| RoutingError::Protocol {
                daemon: DAEMON,
                command: command.to_string(),
                detail: format!("sending the command: {e}"),
            })?;
        self.reply(command).await
    }
}

fn unreachable(socket: &Path, e: &io::Error) -> RoutingError {
    RoutingError::Unreachable {
        daemon: DAEMON,
        what: "BIRD's control socket",
        target: socket.to_path_buf(),
        detail: e.to_string(),
        hint: "is bird running, and is the socket mounted into the agent?",
    }
}

fn refused(command: &str, reply: &Reply, hint: &'static str) -> RoutingError {
    RoutingError::Refused {
        daemon: DAEMON,
        command: command.to_string(),
        reply: format!("{} {}", reply.code(), reply.last_text()),
        hint,
    }
}

/// Reads BIRD once (unbounded; [`super::read`] bounds it).
pub async fn read(socket: &Path) -> Result<RoutingStatus, RoutingError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| unreachable(socket, &e))?;
    let (reader, writer) = stream.into_split();
    let mut conn = Conn {
        reader: BufReader::new(reader),
        writer,
        parser: ReplyParser::default(),
        line: String::new(),
    };
    let hello = conn.reply("(greeting)").await?;
    if hello.code() != 1 {
        return Err(refused(
            "(greeting)",
            &hello,
            "expected `0001 BIRD ... ready.`: is this BIRD's control socket?",
        ));
    }
    let restrict = conn.ask("restrict").await?;
    if restrict.code() != 16 {
        return Err(refused(
            "restrict",
            &restrict,
            "aliaslb only reads BIRD and insists on a restricted session; BIRD 2.0 or later",
        ));
    }
    let protocols = conn.ask("show protocols").await?;
    if protocols.is_error() {
        return Err(refused("show protocols", &protocols, "BIRD 2 is required"));
    }
    let bgp = parse_protocols(&protocols).map_err(|detail| RoutingError::Protocol {
        daemon: DAEMON,
        command: "show protocols".to_string(),
        detail,
    })?;
    let mut exported = BTreeSet::new();
    for proto in bgp.iter().filter(|p| p.established) {
        let command = format!("show route exported {}", proto.name);
        let reply = conn.ask(&command).await?;
        if reply.is_error() {
            // The session went down since `show protocols`: its channels are gone.
            if reply.last_text().contains("No valid tables") {
                continue;
            }
            return Err(refused(&command, &reply, "BIRD 2.0 or later is required"));
        }
        exported.extend(parse_exported(&reply));
    }
    Ok(RoutingStatus {
        daemon: DAEMON,
        established: bgp.iter().filter(|p| p.established).count(),
        sessions: bgp.len(),
        exported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTOCOLS: &str = include_str!("../../../tests/data/routing/bird-show-protocols.txt");
    const PROTOCOLS_DOWN: &str =
        include_str!("../../../tests/data/routing/bird-show-protocols-down.txt");
    const EXPORTED: &str = include_str!("../../../tests/data/routing/bird-show-route-exported.txt");

    fn one(transcript: &str) -> Reply {
        let mut replies = parse_reply(transcript).unwrap();
        assert_eq!(replies.len(), 1, "{replies:?}");
        replies.remove(0)
    }

    fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn greeting_and_restrict() {
        let replies = parse_reply("0001 BIRD 2.0.12 ready.\n0016 Access restricted\n").unwrap();
        assert_eq!(replies.len(), 2);
        assert_eq!(replies[0].code(), 1);
        assert_eq!(replies[0].last_text(), "BIRD 2.0.12 ready.");
        assert_eq!(replies[1].code(), 16);
    }

    #[test]
    fn protocols_established() {
        let reply = one(PROTOCOLS);
        assert_eq!(reply.code(), 0);
        assert_eq!(
            parse_protocols(&reply).unwrap(),
            vec![BgpProtocol {
                name: "peer4".into(),
                established: true
            }]
        );
    }

    #[test]
    fn protocols_down() {
        let reply = one(PROTOCOLS_DOWN);
        assert_eq!(
            parse_protocols(&reply).unwrap(),
            vec![BgpProtocol {
                name: "peer4".into(),
                established: false
            }]
        );
    }

    #[test]
    fn exported_host_routes_of_both_tables() {
        let reply = one(EXPORTED);
        assert_eq!(parse_exported(&reply), ips(&["10.200.0.7", "fd00:200::7"]));
    }

    #[test]
    fn exported_skips_non_host_routes_and_other_rows() {
        let reply = one(
            "1007-Table master4:\n 10.200.0.0/24  unicast [x 1] * (240)\n \tdev lo\n \
             10.200.0.8/32  unicast [x 1] * (240)\n                unicast [y 1] (100)\n \
             \tvia 10.0.0.1 on eth0\n 1:1 10.0.0.0/8  something\n0000 \n",
        );
        assert_eq!(parse_exported(&reply), ips(&["10.200.0.8"]));
    }

    #[test]
    fn errors_and_async_lines() {
        let replies = parse_reply("+0023 log line\n9001 No valid tables\n").unwrap();
        assert_eq!(replies.len(), 1);
        assert!(replies[0].is_error());
        assert_eq!(replies[0].last_text(), "No valid tables");
        assert!(one("8007 Access denied\n").is_error());
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for bad in [
            " continuation first\n",
            "garbage\n",
            "12a4 x\n",
            "1234\n",
            "1234x\n",
            "ééééé\n",
            "1002-open reply\n",
        ] {
            assert!(parse_reply(bad).is_err(), "{bad:?} accepted");
        }
        let short = one("1002-name BGP\n0000 \n");
        assert!(parse_protocols(&short).is_err());
        let odd = one("1002-x;y BGP --- up 12:00\n0000 \n");
        assert!(parse_protocols(&odd).is_err());
    }
}
